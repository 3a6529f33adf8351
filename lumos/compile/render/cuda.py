"""The CUDA renderer: prints the kernel IR as CUDA C kernels, with the launch table the runtime follows.

It decides nothing. Which thread computes what is decided before, by IR passes: a kernel's frame
(elementwise, warp, block, tiled) by kernel/gpu_tiles.py, a fused attention's (flash,
attention_warp) by kernel/gpu_attention.py; both leave it in the body as kernel/ir.py's GPU nodes
(the launch `Grid`, shared tiles and barriers, lane reductions, online-softmax accumulators), which
this module prints. Expressions and statements print as in C (render/cstyle.py); how each frame's
threads find their place is the table `FRAMES`.

Gathers read a row only when its id is inside the table (else 0). Kernels are `extern "C"`, so
the runtime finds them by name, and all take (n, out, reads…) like the C ones.

Half-precision buffers (ir/graph.py: Storage) are pointers to `lumos_bfloat16` / `lumos_float16`
(lumos_cuda_half.h, added to a program only when it has one), widened where loaded and rounded
where stored, as in C (render/cstyle.py); all arithmetic and accumulation stay float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources

from lumos.compile.ir.graph import Graph, Node, Op
from lumos.compile.kernel import gpu_ir, ir
from lumos.compile.kernel.gpu_attention import map_attention
from lumos.compile.kernel.gpu_tiles import THREADS, map_threads, tiled_matmuls
from lumos.compile.kernel.lower import lower_attention, lower_kernel, lower_products
from lumos.compile.render.c import element_type, kernel_dtypes, tensor_names
from lumos.compile.render.cstyle import (
    Dialect,
    cond,
    expr,
    index,
    initial,
    kernel_comment,
    literal,
    narrowed,
    stmt_lines,
    stored_as,
    update,
)
from lumos.compile.schedule.buffers import BufferPlan
from lumos.compile.schedule.kernels import Kernel

HEADER = resources.files(__package__).joinpath("lumos_cuda.h").read_text()
"""The CUDA header every program starts with: the math helpers and warp reductions the kernels call."""
HALF_HEADER = resources.files(__package__).joinpath("lumos_cuda_half.h").read_text()
"""What a program with half-precision buffers adds after HEADER: the storage types and conversions."""

CUDA = Dialect(restrict="__restrict__", unroll="#pragma unroll {}", vector_reduce=None)


@dataclass(frozen=True)
class Frame:
    """How a frame's threads find their place: the names bound from the thread index first, and
    the linear index u of the thread's (warp's, block's) output ({per}: outputs per block)."""

    names: tuple[tuple[str, str], ...]
    unit: str
    guard_note: str = ""
    """Why returning early at u's guard is safe, where that needs saying."""


FRAMES = {
    "elementwise": Frame((), "blockIdx.x * {per} + threadIdx.x"),
    "warp": Frame((("lane", "threadIdx.x % 32"),), "blockIdx.x * {per} + threadIdx.x / 32",
                  "the same for every lane of a warp"),
    "block": Frame((("lane", "threadIdx.x % 32"), ("warp", "threadIdx.x / 32")), "blockIdx.x",
                   "the same for every thread of the block"),
    "tiled": Frame((("tx", "threadIdx.x"), ("ty", "threadIdx.y")), "blockIdx.x"),
    "flash": Frame((), "blockIdx.x"),
    "attention_warp": Frame((("lane", "threadIdx.x % 32"),), "blockIdx.x * {per} + threadIdx.x / 32",
                            "one warp per query"),
}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: blocks of `block` threads, grid ⌈rows·mult / per⌉·groups blocks where
    rows is the runtime row count n for a batched kernel, else 1."""

    name: str
    kind: str
    block: tuple[int, int, int]
    batched: bool
    mult: int
    per: int
    groups: int
    buffers: tuple[tuple[str, int], ...]
    """Its pointer arguments after n, in order: ("input"|"output"|"tensor", index) or ("arena", offset)."""

    def grid(self, n: int) -> int:
        rows = n if self.batched else 1
        return -(-(rows * self.mult) // self.per) * self.groups


@dataclass
class CudaProgram:
    kernels: dict[str, str]
    """Each kernel's source by name (without the header)."""
    launches: list[Launch]
    half: bool = False
    """Whether some buffer is stored in a half dtype (then the header has HALF_HEADER)."""

    @property
    def header(self) -> str:
        return f"{HEADER}\n{HALF_HEADER}" if self.half else HEADER

    @property
    def source(self) -> str:
        """The whole program: the header and every kernel, one compilation unit."""
        return "\n\n".join([self.header, *self.kernels.values()]) + "\n"

    def kernel_source(self, name: str) -> str:
        """One kernel alone with the header: a unit NVRTC can compile (tests name the failing kernel)."""
        return f"{self.header}\n\n{self.kernels[name]}\n"


# ---------------------------------------------------------------------------------------------
# Printing the GPU nodes (the rest of a body prints as in C)


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["  " * depth + line for line in lines]


def _body(stmts: list) -> list[str]:
    return [line for stmt in stmts for line in _lines(stmt)]


def _lines(stmt) -> list[str]:
    printer = PRINTERS.get(type(stmt))
    return printer(stmt) if printer else stmt_lines(stmt, CUDA)


def _grid(grid: gpu_ir.Grid) -> list[str]:
    frame = FRAMES[grid.kind]
    lines = ["const int " + ", ".join(f"{name} = {value}" for name, value in frame.names) + ";"] if frame.names else []
    lines.append(f"int u = {frame.unit.format(per=grid.per)};")
    if grid.guarded:
        total = f"n * {grid.mult}" if grid.batched else str(grid.mult)
        lines.append(f"if (u >= {total}) return;" + (f"  /* {frame.guard_note} */" if frame.guard_note else ""))
    for name, extent in grid.digits:
        digit = [f"const int {name} = u % {extent};", f"u /= {extent};"]
        lines += [f"const int {name} = u;"] if extent is None else digit
    return lines


def _offset(index: gpu_ir.TileOffset) -> str:
    return f"{index.tile} * {index.size} + {index.thread}" if index.size != 1 else f"{index.tile} + {index.thread}"


def _binds(binds: list[tuple[str, gpu_ir.TileOffset]]) -> list[str]:
    return [f"const int {name} = {_offset(index)};" for name, index in binds]


def _bounds(bounds: list[ir.Loop]) -> str:
    return " && ".join(f"{loop.var} < {'n' if loop.batch else loop.extent}" for loop in bounds)


def _warp_reduce(node: gpu_ir.WarpReduce) -> list[str]:
    """Each lane's share of the steps, then the lanes combined (outside the guard, which is the
    same for the whole warp, so every lane takes part in the shuffles)."""
    reduce = node.reduce
    combine = "lumos_warp_sum" if reduce.op is Op.SUM else "lumos_warp_max"
    lines = [f"float {reduce.acc} = {initial(reduce.init)};"]
    if reduce.guard:
        lines.append(f"if ({cond(reduce.guard)})")
    var = reduce.var
    return lines + ["{", f"for (int {var} = {node.lane}; {var} < {reduce.length}; {var} += {node.stride}) {{",
                    *_indent(_body(reduce.body)), "  " + update(reduce.op, reduce.acc, expr(reduce.value)), "}", "}",
                    f"{reduce.acc} = {combine}({reduce.acc});"]


def _combine_warps(node: gpu_ir.CombineWarps) -> list[str]:
    both = f"({node.acc} + {node.partial}[w])" if node.op is Op.SUM else f"lumos_max({node.acc}, {node.partial}[w])"
    return [f"{node.acc} = {node.partial}[0];", f"for (int w = 1; w < {node.warps}; w++) {node.acc} = {both};"]


def _stage_tile(node: gpu_ir.StageTile) -> list[str]:
    if node.prologue is None:
        compute = [f"if ({_bounds(node.bounds)}) {node.local} = {expr(node.value)};"]
    else:
        compute = [f"if ({_bounds(node.bounds)}) {{", *_indent(_body(node.prologue)),
                   f"  {node.local} = {expr(node.value)};", "}"]
    return [f"{{  /* {node.why} */", *_indent([*_binds(node.binds), f"float {node.local} = 0.0f;", *compute,
                                                f"{node.tile}[ty][tx] = {node.local};"]), "}"]


def _slice_loop(node: gpu_ir.SliceLoop) -> list[str]:
    var, length, step = node.var, node.length, node.step
    count = [f"const int {node.count} = {length} - {var} < {step} ? {length} - {var} : {step};"] if node.count else []
    return [f"for (int {var} = 0; {var} < {length}; {var} += {step}) {{", *_indent([*count, *_body(node.body)]), "}"]


def _thread_tile(node: gpu_ir.ThreadTile) -> list[str]:
    return [*_binds(node.binds), f"if ({_bounds(node.bounds)}) {{  /* {node.why} */", *_indent(_body(node.body)), "}"]


def _softmax_state(node: gpu_ir.SoftmaxState) -> list[str]:
    zero = f"for (int dd = 0; dd < {node.width}; dd++) o[dd] = 0.0f;"
    if node.query is None:
        return [f"float m = -INFINITY, l = 0.0f, o[{node.width}];", zero]
    q = node.query
    return [f"float qv[{q.depth}], o[{node.width}], m = -INFINITY, l = 0.0f;",
            f"for (int {q.var} = 0; {q.var} < {q.depth}; {q.var}++) qv[{q.var}] = {expr(q.value)};", zero]


def _stage_rows(node: gpu_ir.StageRows) -> list[str]:
    place = (f"jj = e % {node.rows}, {node.var} = e / {node.rows}" if node.along_keys
             else f"jj = e / {node.cols}, {node.var} = e % {node.cols}")
    return [f"for (int e = threadIdx.x; e < {node.rows * node.cols}; e += {node.threads}) {{  /* {node.why} */",
            f"  const int {place}, j = j0 + jj;",
            f"  {node.tile}[jj][{node.var}] = jj < jn ? {expr(node.value)} : 0.0f;", "}"]


def _online_softmax(node: gpu_ir.OnlineSoftmax) -> list[str]:
    scale, width = literal(node.scale), node.width
    if isinstance(node.value, gpu_ir.SharedRead):
        read = node.value.tile + "".join(f"[{index}]" for index in node.value.indices)
        accumulate = [f"for (int dd = 0; dd < {width}; dd++) o[dd] = o[dd] * corr + p * {read};"]
    else:
        accumulate = [f"for (int dd = 0; dd < {width}; dd++) {{", *_indent(_body(node.value_stmts)),
                      f"  o[dd] = o[dd] * corr + p * {expr(node.value)};", "}"]
    return [f"const float s = {expr(node.score)};", "const float mn = lumos_max(m, s);",
            f"const float corr = lumos_exp2f((m - mn) * {scale});  /* the max-rescaling identity */",
            f"const float p = lumos_exp2f((s - mn) * {scale});", "l = l * corr + p;", *accumulate, "m = mn;"]


def _merge_lanes(node: gpu_ir.MergeLanes) -> list[str]:
    return ["const float mw = lumos_warp_max(m);  /* merge the lanes: rescale each to the warp's max */",
            f"const float c = m == -INFINITY ? 0.0f : lumos_exp2f((m - mw) * {literal(node.scale)});",
            "const float lw = lumos_warp_sum(l * c);", f"for (int dd = 0; dd < {node.width}; dd++) {{",
            "  const float od = lumos_warp_sum(o[dd] * c);", f"  if (lane == 0) out[{index(node.out)}] = {narrowed('out', 'od / lw')};", "}"]


PRINTERS = {
    gpu_ir.Grid: _grid,
    gpu_ir.Shared: lambda s: [f"__shared__ float {s.name}" + "".join(f"[{d}]" for d in s.dims) + ";"],
    gpu_ir.Barrier: lambda s: ["__syncthreads();" + (f"  /* {s.why} */" if s.why else "")],
    gpu_ir.Register: lambda s: [f"float {s.name} = {initial(s.init)};"],
    gpu_ir.Leader: lambda s: [f"if ({s.thread} == 0)", *_indent(_lines(s.body))],
    gpu_ir.WarpReduce: _warp_reduce,
    gpu_ir.WarpToShared: lambda s: [f"if (lane == 0) {s.partial}[warp] = {s.acc};"],
    gpu_ir.CombineWarps: _combine_warps,
    gpu_ir.SliceLoop: _slice_loop,
    gpu_ir.StageTile: _stage_tile,
    gpu_ir.TileProduct: lambda s: ["#pragma unroll",
                            f"for (int kk = 0; kk < {s.size}; kk++) {s.acc} += {s.a}[ty][kk] * {s.b}[kk][tx];"],
    gpu_ir.ThreadTile: _thread_tile,
    gpu_ir.ClampedRow: lambda s: [f"const int {s.at} = {_offset(s.index)};", f"const int {s.name} = {s.at} < {s.extent} ? "
                              f"{s.at} : {s.extent - 1};  /* past the end: computed, not stored */"],
    gpu_ir.SoftmaxState: _softmax_state,
    gpu_ir.StageRows: _stage_rows,
    gpu_ir.OverStaged: lambda s: ["for (int jj = 0; jj < jn; jj++) {", "  const int j = j0 + jj;",
                              *_indent(_body(s.body)), "}"],
    gpu_ir.StagedDot: lambda s: [f"float {s.acc} = 0.0f;", "#pragma unroll 8",
                          f"for (int {s.var} = 0; {s.var} < {s.depth}; {s.var}++) "
                          f"{s.acc} += qv[{s.var}] * {s.tile}[jj][{s.var}];"],
    gpu_ir.OnlineSoftmax: _online_softmax,
    gpu_ir.Strided: lambda s: [f"for (int {s.var} = {s.start}; {s.var} < {s.length}; {s.var} += {s.stride}) "
                           f"{{  /* {s.why} */",
                        *_indent(_body(s.body)), "}"],
    gpu_ir.MergeLanes: _merge_lanes,
    gpu_ir.SoftmaxStore: lambda s: [f"if ({_bounds([s.bound])})",
                                f"  for (int dd = 0; dd < {s.width}; dd++) out[{index(s.out)}] = {narrowed('out', 'o[dd] / l')};"],
}


# ---------------------------------------------------------------------------------------------
# Kernels and programs


def _signature(name: str, outputs: tuple[str, ...], params: list[str]) -> str:
    args = ["const int n", *(f"{element_type(o)}* __restrict__ {o}" for o in outputs),
            *(f"const {element_type(p)}* __restrict__ {p}" for p in params)]
    return f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}({", ".join(args)})'


def gpu_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str]) -> tuple[ir.KernelIR, str]:
    """The kernel lowered and mapped to threads (kernel/gpu_tiles.py, kernel/gpu_attention.py), and
    its comment."""
    node = kernel.node
    if kernel.attention is not None:
        attention = lower_attention(kernel, materialized, params, check_gathers=True)
        keys = f"online softmax over {attention.keys} keys"
        return map_attention(attention), f"{kernel.name}: %{node.id} attention{list(node.shape)}, {keys}"
    if kernel.also:  # matrix products of one value (schedule/products.py): one tiled kernel
        outputs = lower_products(kernel, materialized, params, check_gathers=True)
        mapped = replace(tiled_matmuls(outputs), also=tuple(kernel.also))
        return mapped, kernel_comment(mapped)
    lowered = lower_kernel(kernel, materialized, params, check_gathers=True)
    return map_threads(lowered), kernel_comment(lowered)


def joins_as_tiles(kernel: Kernel, materialized: set[Node]) -> bool:
    """Whether a kernel of several matrix products maps to one tiled matmul (schedule/products.py
    joins kernels only then)."""
    params = {node: f"b{node.id}" for node in [*kernel.outputs, *kernel.reads]}
    return tiled_matmuls(lower_products(kernel, materialized, params, check_gathers=True)) is not None


def render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                  dtypes: Mapping[Node, str] | None = None) -> tuple[str, gpu_ir.Grid]:
    """One kernel's CUDA source and its launch frame; `dtypes`: the nodes stored in a half dtype."""
    with stored_as(kernel_dtypes(kernel, params, dtypes or {})):
        return _render_kernel(kernel, materialized, params)


def _render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str]) -> tuple[str, gpu_ir.Grid]:
    mapped, comment = gpu_kernel(kernel, materialized, params)
    grid = next(stmt for stmt in mapped.body if isinstance(stmt, gpu_ir.Grid))
    comment = comment.replace("*/", "* /")
    outputs = mapped.outputs if isinstance(mapped, ir.KernelIR) else ("out",)
    source = "\n".join([f"/* {comment} ({grid.kind}) */", _signature(kernel.name, outputs, mapped.params) + " {",
                        *_indent(_body(mapped.body)), "}"])
    return source, grid


def render_program(graph: Graph, kernels: list[Kernel], materialized: set[Node], plan: BufferPlan) -> CudaProgram:
    """Every kernel of the program in one CUDA source, and the launches in order."""
    params = {node: f"b{node.id}" for node in graph.nodes}
    dtypes = graph.stored_dtypes()
    inputs, outputs, tensors = list(graph.inputs.values()), list(graph.outputs.values()), tensor_names(graph)

    def pointer(node: Node) -> tuple[str, int]:
        if node.op is Op.INPUT:
            return ("input", inputs.index(node))
        if node.op is Op.CONST:
            return ("tensor", tensors.index(node.arg))
        if node in outputs:
            return ("output", outputs.index(node))
        return ("arena", plan.buffers[node].offset)

    sources, launches = {}, []
    for kernel in kernels:
        source, grid = render_kernel(kernel, materialized, params, dtypes)
        sources[kernel.name] = source
        launches.append(Launch(kernel.name, grid.kind, grid.threads, grid.batched, grid.mult, grid.per, grid.groups,
                               tuple(pointer(node) for node in [*kernel.outputs, *kernel.reads])))
    return CudaProgram(sources, launches, half=bool(dtypes))
