"""The C renderer: one function per kernel, and a driver that runs them all in one native call.

A kernel is lowered (kernel/lower.py), rewritten by the IR pass its schedule asks for, and
printed: kernel/tiles.py gives the register-blocked matmul and the row-wise layouts,
kernel/online_softmax.py the fused attention, and otherwise the plain layout stays (OpenMP
shares out the outer output loops, the innermost runs the body per element, vectorized or
versioned on an invariant padding guard). Statements print as render/cstyle.py prints them for C
and CUDA alike; this module adds the C frame (OpenMP loops, the signature) and the header
(lumos_cpu.h). The driver opens one OpenMP parallel region and calls every kernel in launch
order; a kernel's `omp for` ends with a barrier only where a later kernel depends on it.

A buffer stored in a half dtype (ir/graph.py: Storage) is a pointer to `lumos_bfloat16` (a struct
around its 16 bits, so that no load or store can forget to convert) or `lumos_float16` (likewise);
the driver casts its pointer, and cstyle.py prints every load widening and every store rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import resources

from lumos.compile.ir.graph import Graph, Node, Op
from lumos.compile.kernel.cpu_ir import FusedAttention
from lumos.compile.kernel.ir import Compare, KernelIR, Loop
from lumos.compile.kernel.lower import lower_attention, lower_kernel
from lumos.compile.kernel.online_softmax import fused_attention
from lumos.compile.kernel.tiles import cpu_layout
from lumos.compile.render.cstyle import (
    C,
    block_lines,
    comment_text,
    compare,
    int_expr,
    kernel_comment,
    stored,
    stored_as,
)
from lumos.compile.runtime.kernel_cache import UNIT_BREAK
from lumos.compile.schedule.buffers import BufferPlan
from lumos.compile.schedule.kernels import Kernel, KernelSchedule

HEADER = (resources.files("lumos.compile.render") / "lumos_cpu.h").read_text()
"""What every C library starts with (lumos_cpu.h beside this file): the vector types, 2^x without
libm, lane reductions, masked loads, and lumos_transposeN (n vectors of n floats transposed in
log2(n) stages of two-input shuffles; stage b swaps the off-diagonal b × b blocks of every
2b × 2b block)."""

HALF_HEADER = (resources.files("lumos.compile.render") / "lumos_cpu_half.h").read_text()
"""What a library with half-precision buffers adds after HEADER (lumos_cpu_half.h): the storage
types and their converting loads and stores, scalar and vector (a float32 program renders as it
did before there were any)."""

def render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                  schedule: KernelSchedule | None = None, barrier: bool = True,
                  dtypes: Mapping[Node, str] | None = None) -> str:
    """`dtypes`: the nodes stored in a half dtype (Graph.stored_dtypes); the rest are float32."""
    names = kernel_dtypes(kernel, params, dtypes or {})
    with stored_as(names):
        return _render_kernel(kernel, materialized, params, schedule, barrier,
                              frozenset(name for name, dtype in names.items() if dtype == "bfloat16"))


def kernel_dtypes(kernel: Kernel, params: dict[Node, str], dtypes: Mapping[Node, str]) -> dict[str, str]:
    """The kernel's half buffers by the names it gives them: its reads by `params`, its outputs
    `out`, `out1`, … (KernelIR.outputs)."""
    names = {params[node]: dtypes[node] for node in kernel.reads if node in dtypes}
    outputs = ("out", *(f"out{position}" for position in range(1, len(kernel.outputs))))
    return names | {name: dtypes[node] for name, node in zip(outputs, kernel.outputs, strict=True) if node in dtypes}


def _render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                   schedule: KernelSchedule | None, barrier: bool, bfloat16: frozenset[str]) -> str:
    schedule = schedule or KernelSchedule()
    if kernel.attention is not None:
        ir = lower_attention(kernel, materialized, params, schedule)
        attention = kernel.attention
        return print_attention(fused_attention(ir, schedule, attention.keys_copy is not None, attention.store), barrier)
    ir = lower_kernel(kernel, materialized, params, schedule)
    if not kernel.also:  # the register-blocked and row-wise layouts write one output
        ir = cpu_layout(ir, schedule, bfloat16)
    return print_kernel(ir, barrier, schedule.wide)


def print_kernel(ir: KernelIR, barrier: bool = True, wide: bool = False) -> str:
    """A kernel IR in its plain layout: OpenMP shares out the parallel loops, the innermost loop
    runs the body per element (vectorized or versioned on an invariant guard as annotated);
    `wide`: in 16-float vectors (KernelSchedule.wide)."""
    lines = [f"/* {kernel_comment(ir)} */", _signature(ir, wide)]
    body = block_lines(ir.body, C)
    if not ir.loops:
        return "\n".join(lines + [f"#pragma omp single{'' if barrier else ' nowait'}", "{", *("  " + line for line in body), "}", "}"])
    parallel = sum(loop.parallel for loop in ir.loops)
    return "\n".join(lines + _omp_loops(ir.loops, parallel, body, barrier, ir.version_on))


def _omp_loops(loops: list[Loop], parallel: int, body: list[str], barrier: bool,
               version_on: Compare | None = None) -> list[str]:
    """`body` inside `loops`, the first `parallel` of them shared out by one `omp for`; the
    innermost loop of several is vectorized when annotated, and emitted twice when versioned:
    inside each copy gcc knows the guard's value, folds it away and vectorizes (loads behind a
    guard that the element loop does not change stop it)."""
    collapse = f" collapse({parallel})" if parallel > 1 else ""
    lines = [f"#pragma omp for{collapse} schedule(static){'' if barrier else ' nowait'}"]
    innermost = len(loops) > 1
    # The batch: as many rows as given; blocks of rows: as many blocks as they make.
    bound = {loop.var: int_expr(loop.bound) if loop.bound else "n" if loop.batch else loop.extent for loop in loops}
    for depth, loop in enumerate(loops[:-1] if innermost else loops):
        lines.append("  " * depth + f"for (int {loop.var} = 0; {loop.var} < {bound[loop.var]}; {loop.var}++) {{")
    depth = len(loops) - 1 if innermost else len(loops)
    if innermost:
        last = loops[-1]
        inner = ["#pragma omp simd"] if last.vector else []
        inner += [f"for (int {last.var} = 0; {last.var} < {bound[last.var]}; {last.var}++) {{", *("  " + line for line in body), "}"]
        if version_on is not None:
            inner = [f"if ({compare(version_on)}) {{", *("  " + line for line in inner), "} else {", *("  " + line for line in inner), "}"]
        lines += ["  " * depth + line for line in inner]
    else:
        lines += ["  " * depth + line for line in body]
    lines += ["  " * d + "}" for d in range(depth - 1, -1, -1)]
    return lines + ["}"]


def print_attention(kernel: FusedAttention, barrier: bool = True) -> str:
    """Its per-thread locals, then one `omp for` over all its query loops, then its body."""
    out, written = kernel.node, kernel.written
    stored = "" if written is None else f", written as %{written.id}{list(written.shape)} (its dims reordered)"
    lines = [f"/* {kernel.name}: %{out.id} attention{list(out.shape)}{stored}, online softmax over {kernel.keys} keys "
             f"(scores never stored), {kernel.per_block} queries at a time; {comment_text(out.origin)} */",
             _signature(kernel), *_lines(kernel.locals)]
    loops = kernel.loops
    collapse = f" collapse({len(loops)})" if len(loops) > 1 else ""
    lines.append(f"#pragma omp for{collapse} schedule(static){'' if barrier else ' nowait'}")
    for depth, loop in enumerate(loops):
        step = f"{loop.var}++" if loop.step == 1 else f"{loop.var} += {loop.step}"
        lines.append("  " * depth + f"for (int {loop.var} = 0; {loop.var} < {'n' if loop.batch else loop.extent}; {step}) {{")
    lines += ["  " * len(loops) + line for line in _lines(kernel.body)]
    lines += ["  " * d + "}" for d in range(len(loops) - 1, -1, -1)]
    return "\n".join(lines + ["}"])


def _signature(ir: KernelIR | FusedAttention, wide: bool = False) -> str:
    outputs = ir.outputs if isinstance(ir, KernelIR) else ("out",)
    params = ["const int n", *(f"{element_type(name)}* restrict {name}" for name in outputs)]
    params += [f"const {element_type(name)}* restrict {name}" for name in ir.params]
    return f"LUMOS_KERNEL {'LUMOS_WIDE ' if wide else ''}void {ir.name}({', '.join(params)}) {{"


def element_type(buffer: str) -> str:
    dtype = stored(buffer)
    return "float" if dtype is None else f"lumos_{dtype}"


def _lines(stmts) -> list[str]:
    return block_lines(stmts, C)


def canonical_kernel_source(kernel: Kernel, materialized: set[Node], schedule: KernelSchedule | None = None,
                            dtypes: Mapping[Node, str] | None = None) -> str:
    """The kernel's C with buffer and kernel names replaced by positional ones: identical layers
    (same computation on different weights and buffers) give the same text."""
    params = {node: f"p{position}" for position, node in enumerate(kernel.reads)}
    renamed = replace(kernel, name="kernel")
    return render_kernel(renamed, materialized, params, schedule, dtypes=dtypes).split("\n", 1)[1]


def barriers(graph: Graph, kernels: list[Kernel], plan: BufferPlan) -> list[bool]:
    """Whether each kernel must end with a barrier: only when a later kernel, before the next
    barrier, reads what it writes or writes what it (or another kernel since the last barrier)
    reads or writes. Arena buffers conflict when their bytes overlap (memory is reused)."""
    def region(node: Node) -> tuple:
        if node in plan.buffers:
            buffer = plan.buffers[node]
            return ("arena", buffer.offset, buffer.offset + buffer.bytes)
        return ("node", node.id, node.id + 1)  # inputs, outputs, tensors: one array each

    def overlap(a: tuple, b: tuple) -> bool:
        return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]

    keep = [True] * len(kernels)
    in_flight: list[tuple[list[tuple], list[tuple]]] = []  # (reads, writes) of kernels since the last barrier
    for position, kernel in enumerate(kernels):
        reads, writes = [region(node) for node in kernel.reads], [region(node) for node in kernel.outputs]
        conflict = any(
            any(overlap(r, w) for r in reads for w in earlier_writes)  # reads what an earlier one writes
            or any(overlap(w, r) for w in writes for r in earlier_reads + earlier_writes)  # overwrites its inputs or outputs
            for earlier_reads, earlier_writes in in_flight
        )
        if conflict and position > 0:
            keep[position - 1] = True
            in_flight = []
        elif position > 0:
            keep[position - 1] = False
        in_flight.append((reads, writes))
    return keep


def render_library(graph: Graph, kernels: list[Kernel], materialized: set[Node], plan: BufferPlan,
                   schedules: dict[str, KernelSchedule] | None = None, always_barrier: bool = False) -> str:
    """The whole program as one C file: kernels, then `lumos_forward`, the one-call driver, with
    a UNIT_BREAK before each kernel and before the driver (which declares every kernel), so that
    the cache can compile it as several translation units at once. `schedules` by kernel name
    (default: the renderer's heuristic); `always_barrier` ends every kernel with a barrier, so
    that the timed driver measures each kernel alone."""
    params = {node: f"b{node.id}" for node in graph.nodes}
    dtypes = graph.stored_dtypes()
    schedules = schedules or {}
    parts = [HEADER + HALF_HEADER] if dtypes else [HEADER]
    keep = [True] * len(kernels) if always_barrier else barriers(graph, kernels, plan)
    prototypes = []
    for kernel, barrier in zip(kernels, keep, strict=True):
        text = render_kernel(kernel, materialized, params, schedules.get(kernel.name), barrier, dtypes)
        parts += [UNIT_BREAK, text]
        signature = next(line for line in text.splitlines() if line.startswith("LUMOS_KERNEL "))  # after its comment
        prototypes.append(signature.removesuffix(" {") + ";")
    parts += [UNIT_BREAK, "\n".join(prototypes)]
    inputs = list(graph.inputs.values())
    tensors = tensor_names(graph)
    outputs = list(graph.outputs.values())

    def pointer(node: Node) -> str:
        if node.op is Op.INPUT:
            return f"inputs[{inputs.index(node)}]"
        if node.op is Op.CONST:
            return f"tensors[{tensors.index(node.arg)}]"
        if node in outputs:
            return f"outputs[{outputs.index(node)}]"
        return f"(float*)(arena + {plan.buffers[node].offset})"

    def argument(node: Node, written: bool) -> str:  # a half buffer's pointer cast to its type
        if node not in dtypes:
            return pointer(node)
        return f"({'' if written else 'const '}lumos_{dtypes[node]}*){pointer(node)}"

    calls = [f"    {k.name}(n, {', '.join([*(argument(node, True) for node in k.outputs), *(argument(node, False) for node in k.reads)])});"
             for k in kernels]
    timed = [f"{call}\n    #pragma omp master\n    times[{i + 1}] = omp_get_wtime();" for i, call in enumerate(calls)]
    signature = ("const float* const* inputs, float* const* outputs, const float* const* tensors, char* arena, int n, "
                 "int threads")
    parts.append(
        "/* Runs the whole graph: inputs, outputs and constant tensors in the plan's order; arena holds\n"
        f"   every intermediate ({plan.arena_bytes} bytes, 64-byte aligned); n rows (at most {graph.batch}) when\n"
        "   the batch is symbolic, else ignored; on `threads` threads. */\n"
        f"void lumos_forward({signature}) {{\n"
        "  #pragma omp parallel num_threads(threads)\n  {\n" + "\n".join(calls) + "\n  }\n}\n"
    )
    parts.append(
        "/* The same, recording the time at which each kernel ends (for profiling). */\n"
        f"void lumos_forward_timed({signature}, double* times) {{\n"
        "  #pragma omp parallel num_threads(threads)\n  {\n    #pragma omp master\n    times[0] = omp_get_wtime();\n"
        + "\n".join(timed)
        + "\n  }\n}\n"
    )
    return "\n\n".join(parts)


def tensor_names(graph: Graph) -> list[str]:
    """Constant tensors in the order the driver takes them."""
    return sorted({node.arg for node in graph.nodes if node.op is Op.CONST and isinstance(node.arg, str)})
