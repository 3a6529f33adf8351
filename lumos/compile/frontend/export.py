"""The general frontend: any module whose torch.export graph is made of supported aten ops.

    compiled = compile_module(module, example_inputs)   # exports, lowers, builds, checks against eager
    outputs = compiled(*inputs)                          # inputs of the example's shapes

The module's forward is exported at the example inputs, lowered with the aten lowerings of
frontend.py (the table `LumosModel` uses; it is the list of supported ops), run through program.py's
passes and checked against eager PyTorch at 1e-4. An op without a lowering is cut out
(frontend/partition.py): the supported partitions around it are compiled, the op runs in eager
PyTorch between them, and one `EagerFallbackWarning` names each such op with its source line;
`strict=True` refuses instead with `UnsupportedOp`, naming the op and the line of the module's
code it came from.

Where it runs follows the inputs: CPU tensors compile for the C target, CUDA tensors for the CUDA
target (NVRTC; the outputs are CUDA tensors), `target_for`. Kernel schedules are searched by
measurement (C target; the CUDA target has no search yet) within `search_budget`: by default
"auto", SEARCH_S_PER_KERNEL per distinct kernel up to SEARCH_CAP_S, and each kernel's choice is
kept in the search cache under the kernel cache (search/cache.py, by kernel, target and machine),
so a second compile of the same module, in any process, searches nothing. 0 turns the search off
(the renderer's heuristic schedules); $LUMOS_SEARCH_BUDGET sets the default. (`Options` cannot
say "no search": its search_budget_s defaults to 0, which here means "not given".)

What is exported is PyTorch's math path, in eval mode (dropout is the identity): nn.TransformerEncoder
and nn.MultiheadAttention run their fused fast path (`_transformer_encoder_layer_fwd`, nested
tensors for a padding mask) only when no torch function mode is active, and `math_path` activates
one for this thread (frontend/fast_path.py; the global `torch.backends.mha` flag is not touched).
The graph is made functional (`masked_fill_` becomes `masked_fill`, dropout disappears) but not
decomposed, so linear, layer norm and attention stay whole; only the fused fast-path kernels a
graph may already hold (dynamo's) are rewritten into the ops they stand for.

Values in the IR are float32: integer inputs (ids, exact below 2**24) and bool inputs (masks) are
passed as floats, and each output is converted back to the dtype eager returns. A bfloat16 or
float16 module is lowered from its float32 copy but stored in its own dtype (frontend/half.py):
its half weights, inputs and outputs stay half at the program's boundary, widened and rounded by
the kernels. Shapes are those
of the example, except the batch: when every input has the same first dim (> 1) and the module
traced at one more row differs only there (ir.mark_batch), the batch is symbolic, and any number
of rows runs (in chunks of the example's batch). Otherwise the shapes are static.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from lumos.compile.compilation import DEFAULT_ARCH
from lumos.compile.frontend.fast_path import DECOMPOSITIONS, math_path
from lumos.compile.frontend.half import (
    HALF,
    HalfPrecision,
    dtype_name,
    eager_output_dtypes,
    float32_copy,
    from_stored,
    half_dtype,
    half_storage,
    native_half,
    release_float32_weights,
    stored_array,
    widened,
)
from lumos.compile.frontend.lumos_model import UnsupportedOp, lower_program
from lumos.compile.frontend.partition import PartitionedModule, compile_partitioned, unsupported_nodes
from lumos.compile.ir.graph import ROUNDING, Graph, Storage, mark_batch
from lumos.compile.program import Compilation, Options, compile_graph, load_program
from lumos.compile.runtime.cuda import GpuProgram, gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.search.climb import kernel_key
from lumos.compile.target import CPU, CUDA, TARGETS, Target
from lumos.compile.verify import VerificationError
from lumos.core.errors import UsageError

EXACT_IDS = 2 ** 24
"""Integers up to here are exact in float32, the IR's one dtype."""

SEARCH_S_PER_KERNEL = 2.0
"""The "auto" search budget per distinct kernel (as the schedule pass made them). Where the gain
flattens: on a 2-layer nn.TransformerEncoder (d_model 64, 12 distinct kernels) 1, 2 and 4 s per
kernel made calls of 0.41, 0.36 and 0.36 ms (median; 0.76 unsearched), first compiles of 43, 43
and 64 s (the first round and the whole-call check take their time whatever the budget)."""
SEARCH_CAP_S = 60.0
"""The "auto" budget's ceiling (per compiled graph or partition): a first compile waits about a
minute more at most, once; a larger search is asked for in seconds (`search_budget=`)."""


def default_kernel_cache(target: Target = CPU) -> KernelCache:
    """$LUMOS_KERNEL_CACHE, else ~/.cache/lumos/kernels: built libraries outlive the process."""
    root = os.environ.get("LUMOS_KERNEL_CACHE") or Path.home() / ".cache" / "lumos" / "kernels"
    return KernelCache(root, target.name)


def kernel_cache_for(cache: KernelCache | None, target: Target) -> KernelCache:
    """The given cache, or its sibling folder for another target (a cache is one target's)."""
    if cache is None:
        return default_kernel_cache(target)
    if cache.target == target.name:
        return cache
    return KernelCache(cache.root.parent, target.name, cache.cpu, cache.jobs)


# ---------------------------------------------------------------------------------------------
# Where it runs, and how long it searches


def target_for(devices: Iterable[torch.device]) -> Target:
    """The target of tensors on these devices: CPU for CPU tensors (and for none), CUDA for CUDA
    tensors; a mix of the two, or another kind of device, is refused."""
    kinds = sorted({torch.device(device).type for device in devices})
    if kinds in ([], ["cpu"]):
        return CPU
    if kinds == ["cuda"]:
        return CUDA
    raise UsageError(f"inputs and weights on {' and '.join(kinds)}: the compiler takes them all on the CPU "
                     "(C target) or all on CUDA GPUs (CUDA target)")


def module_devices(module: nn.Module, example_inputs: Sequence[torch.Tensor]) -> set[torch.device]:
    """Where the example inputs and the module's weights are (a mix is refused by `target_for`,
    rather than by eager's verification later)."""
    tensors = [value for value in example_inputs if isinstance(value, torch.Tensor)]
    return {value.device for value in (*tensors, *module.parameters(), *module.buffers())}


def default_options(target: Target) -> Options:
    """Options(), built for this GPU's architecture where there is one (else DEFAULT_ARCH's PTX)."""
    return Options(arch=gpu_arch() or DEFAULT_ARCH) if target is CUDA else Options()


def default_search_budget() -> float | str:
    """$LUMOS_SEARCH_BUDGET (seconds, or "auto"), else "auto"."""
    return checked_budget(os.environ.get("LUMOS_SEARCH_BUDGET", "auto").strip(), "LUMOS_SEARCH_BUDGET")


def requested_budget(search_budget: float | str | None, options: Options) -> float | str:
    """What compile_module searches with: `search_budget` where given; else an explicit
    `options.search_budget_s` (> 0); else `default_search_budget()`."""
    if search_budget is not None:
        return checked_budget(search_budget, "search_budget")
    if options.search_budget_s > 0:
        return options.search_budget_s
    return default_search_budget()


def checked_budget(budget: float | str, given_as: str) -> float | str:
    """"auto", or seconds (a number, or its text) at least 0."""
    if budget == "auto":
        return budget
    try:
        seconds = float(budget)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise UsageError(f"{given_as}={budget!r}: give seconds (0: no search) or 'auto'")
    return seconds


def search_seconds(budget: float | str, distinct_kernels: int) -> float:
    """The budget in seconds: "auto" is SEARCH_S_PER_KERNEL per distinct kernel, at most SEARCH_CAP_S."""
    if budget == "auto":
        return min(SEARCH_S_PER_KERNEL * distinct_kernels, SEARCH_CAP_S)
    return float(budget)


def with_search_budget(target: Target, budget: float | str) -> Target:
    """The target with its search passes given `budget`, "auto" sized by the distinct kernels the
    schedule pass made (identical kernels are searched once): the climb over the e-graph's
    programs (with Options.egraph_fusion) and the schedule search, which share it as passes.py
    says. A target without a search pass (CUDA: it would time kernels on a GPU) is returned as it is."""
    if "search" not in dict(target.passes):
        return target

    def budgeted(run):
        def with_budget(c: Compilation, cache: KernelCache) -> None:
            distinct = len({kernel_key(kernel, c.materialized, c.graph.stored_dtypes()) for kernel in c.kernels})
            c.options = replace(c.options, search_budget_s=search_seconds(budget, distinct))
            run(c, cache)
        return with_budget

    searches = {"programs", "search"}
    return replace(target, passes=tuple((name, budgeted(run) if name in searches else run)
                                        for name, run in target.passes))


# ---------------------------------------------------------------------------------------------
# Export


def _check_inputs(example_inputs: Sequence, half: bool = False) -> None:
    for index, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise UsageError(f"example input {index} is a {type(value).__name__}; compile_module takes tensors only")
        if value.is_floating_point() and value.dtype != torch.float32 and not (half and value.dtype in HALF):
            raise UsageError(f"example input {index} is {value.dtype}; the compiler computes in float32 "
                             "(bfloat16 and float16 modules are lowered from their float32 copy; float64 is refused)")


def export_module(module: nn.Module, example_inputs: Sequence[torch.Tensor], half: bool = False):
    """The module's inference forward at the example inputs' shapes, as a functional aten program
    (fused fast-path kernels rewritten, fast_path.DECOMPOSITIONS; nothing else decomposed). With
    `half`, bfloat16 and float16 inputs are taken too: a half module exported as it is, to be
    partitioned (its partitions are lowered from their float32 copies, as a whole module is)."""
    _check_inputs(example_inputs, half)
    with math_path(module), torch.no_grad():
        program = torch.export.export(module, tuple(example_inputs), strict=False)
    return program.run_decompositions(DECOMPOSITIONS)


def lower_module(module: nn.Module, example_inputs: Sequence[torch.Tensor]) -> tuple[Graph, object]:
    """The module's forward as a primitive graph, with the exported program it came from.

    Inputs are named after the forward's arguments, outputs `output0`, `output1` … in the order of
    the flattened return value."""
    program = export_module(module, example_inputs)
    return lower_exported(program), program


def lower_exported(program) -> Graph:
    """An exported program as a primitive graph (inputs named after the forward's arguments)."""
    _check_functional(program)
    signature = program.graph_signature
    outputs = [f"output{index}" for index in range(len(signature.user_outputs))]
    return lower_program(program, list(signature.user_inputs), outputs)


def _check_functional(program) -> None:
    odd = [spec.kind.name for spec in program.graph_signature.output_specs if spec.kind.name != "USER_OUTPUT"]
    if odd:
        raise UnsupportedOp(f"the forward mutates state ({', '.join(odd)}); compile the module in a form without side effects")


def mark_symbolic_batch(graph: Graph, module: nn.Module, example_inputs: Sequence[torch.Tensor]) -> bool:
    """Trace once more at one more row (each input's first row repeated) and make dim 0 symbolic
    where that is all that changes (ir.mark_batch); False leaves the graph static."""
    rows = {value.shape[0] if value.ndim else 0 for value in example_inputs}
    if len(rows) != 1 or rows.pop() < 2:  # a batch of 1 cannot be told from a broadcast dim
        return False
    twin_inputs = [torch.cat([value, value[:1]]) for value in example_inputs]
    try:
        twin, _ = lower_module(module, twin_inputs)
    except Exception:  # noqa: BLE001 — a forward written for one batch size (a fixed reshape) stays static
        return False
    return mark_batch(graph, twin)


# ---------------------------------------------------------------------------------------------
# The runnable module


@dataclass(frozen=True)
class TensorOutput:
    name: str
    """The graph output that holds it."""
    dtype: torch.dtype
    """What eager returns (the graph computes float32)."""


@dataclass
class CompiledModule:
    """A built graph bound to the module's weights (copied when compiled); called like the
    module on tensors of the example's shapes, dtypes and device (CPU: the C library, CUDA: the
    CUDA graph; outputs on the inputs' device). Not thread-safe: calls share one arena."""

    program: NativeProgram | GpuProgram
    compilation: Compilation
    arguments: int
    """How many tensors the forward takes."""
    used: list[int]
    """The ones the graph reads, by position (an argument the forward ignores is not passed on)."""
    input_shapes: list[tuple[int, ...]]
    input_dtypes: list[torch.dtype]
    """Each input's dtype (a half one is passed to the program as it is: frontend/half.py)."""
    outputs: list[TensorOutput | object]
    """The flattened return value: a graph output per tensor, the value itself for a constant (None)."""
    output_spec: pytree.TreeSpec
    batch: int | None = None
    """The example's batch when it is symbolic (any rows run, in chunks of it); None: static shapes."""
    max_error: float = float("nan")
    """Largest difference from eager on the inputs it was checked on (`verify_module`)."""

    @property
    def target(self) -> Target:
        return TARGETS[self.compilation.target]

    def __call__(self, *inputs: torch.Tensor):
        return pytree.tree_unflatten(self.run(inputs), self.output_spec)

    def run(self, inputs: Sequence[torch.Tensor]) -> list:
        """The flat outputs, as tensors of eager's dtypes."""
        if len(inputs) != self.arguments:
            raise ValueError(f"expected {self.arguments} inputs, got {len(inputs)}")
        used = [inputs[index] for index in self.used]
        for (name, _), value, shape, dtype in zip(self.program.inputs, used, self.input_shapes, self.input_dtypes,
                                                  strict=True):
            matches = (tuple(value.shape[1:]) == shape[1:] and value.ndim == len(shape) and value.shape[0] >= 1
                       and value.shape[0] == used[0].shape[0]) if self.batch else tuple(value.shape) == shape
            if not matches or value.dtype != dtype:
                wanted = f"(rows, {', '.join(map(str, shape[1:]))})" if self.batch else str(shape)
                raise ValueError(f"input {name!r}: compiled for {dtype} {wanted}, got {value.dtype} {tuple(value.shape)}; "
                                 "compile again for these shapes")
            if value.device.type != self.target.device:
                raise ValueError(f"input {name!r} is on {value.device}; compiled for {self.target.device.upper()} "
                                 "tensors (compile again with inputs on this device)")
            if not (value.is_floating_point() or value.dtype is torch.bool) and value.numel() \
                    and int(value.abs().max()) >= EXACT_IDS:
                raise ValueError(f"input {name!r} holds integers beyond {EXACT_IDS}, not exact in float32")
        if not self.batch:
            return self._run_rows(used)
        chunks = [self._run_rows([value[start:start + self.batch] for value in used])
                  for start in range(0, used[0].shape[0], self.batch)]
        return [torch.cat(parts) if isinstance(parts[0], torch.Tensor) else parts[0] for parts in zip(*chunks, strict=True)]

    def _run_rows(self, used: list[torch.Tensor]) -> list:
        out = self._run_program(used)
        shapes = self.compilation.graph.output_shapes
        rows = used[0].shape[0] if self.batch else None
        return [out[leaf.name].reshape((rows, *shapes[leaf.name][1:]) if rows else shapes[leaf.name])
                .to(leaf.dtype) if isinstance(leaf, TensorOutput) else leaf for leaf in self.outputs]

    def _run_program(self, used: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The program's outputs by name, as tensors on the inputs' device."""
        names = [name for name, _ in self.program.inputs]
        if self.target is CUDA:  # GpuProgram reads and returns CUDA tensors (on its GPU: moved back)
            out = self.program({name: value.detach() for name, value in zip(names, used, strict=True)})  # it converts
            device = used[0].device if used else out[next(iter(out))].device
            return {name: value.to(device) for name, value in out.items()}
        out = self.program({name: stored_array(value) for name, value in zip(names, used, strict=True)})
        return {name: from_stored(value) for name, value in out.items()}


def compile_module(module: nn.Module, example_inputs: Sequence[torch.Tensor], cache: KernelCache | None = None,
                   options: Options | None = None, verify: bool = True, strict: bool = False,
                   search_budget: float | str | None = None) -> CompiledModule | PartitionedModule | HalfPrecision:
    """Export, lower, fuse, search, plan, render and build `module` at the example inputs' shapes
    (the batch symbolic where it can be, unless `options.symbolic_batch` is off) for the target of
    their device (`target_for`: CUDA tensors compile for the CUDA target and return CUDA tensors);
    with `verify`, check it against eager on those inputs, and on one row fewer and one more when
    the batch is symbolic (VerificationError beyond 1e-4).

    `search_budget`: seconds of schedule search, "auto" (SEARCH_S_PER_KERNEL per distinct kernel,
    at most SEARCH_CAP_S) or 0 (none); unset, an `options.search_budget_s` > 0, else
    $LUMOS_SEARCH_BUDGET, else "auto". Cached choices cost no search.

    A module with ops no lowering reads is partitioned around them (partition.py: each supported
    partition compiled and verified like this, static shapes, one EagerFallbackWarning);
    `strict` refuses it instead with UnsupportedOp.

    A bfloat16 or float16 module (weights or inputs) is lowered from its float32 copy and stored
    in its own dtype: weights, inputs and outputs half, computed in float32 (frontend/half.py);
    verified against the float32 copy within one rounding to the dtype. Partitioned, the half
    module is cut as it is: its eager part runs in its dtype, and each partition (its weights and
    the tensors it reads and returns half) is compiled so, from its own float32 copy."""
    half = half_dtype(module, example_inputs)
    original, given = module, example_inputs
    if half is not None:
        with math_path(module):
            output_dtypes = eager_output_dtypes(module, example_inputs)
        module, example_inputs = float32_copy(module), [widened(value) for value in example_inputs]
    target = target_for(module_devices(module, example_inputs))
    if not target.runs_here():
        raise UsageError(f"the inputs are on {target.device.upper()}, but torch sees no CUDA GPU here")
    options = options or default_options(target)
    budget = requested_budget(search_budget, options)
    program = export_module(module, example_inputs)
    partitioned = not strict and bool(unsupported_nodes(program.graph))
    if half is not None and not native_half(target):
        return HalfPrecision(compile_module(module, example_inputs, cache, options, verify, strict, search_budget),
                             output_dtypes)
    if partitioned:
        if half is not None:  # cut the module as it is: eager runs its part in half, each partition is half
            program = export_module(original, given, half=True)
            module, example_inputs = original, given
        _check_functional(program)
        partition_options = replace(options, symbolic_batch=False)
        return compile_partitioned(program, example_inputs, lambda part, inputs: compile_module(
            part, inputs, cache, partition_options, verify, strict=True, search_budget=budget))
    storage = (lambda graph, used: half_storage(original, given, output_dtypes, graph, used)) if half else None
    compilation, used = build_exported(module, program, example_inputs, kernel_cache_for(cache, target), options,
                                       target, budget, storage)
    output_node = next(node for node in program.graph.nodes if node.op == "output")
    compiled = CompiledModule(
        load_program(compilation), compilation, len(example_inputs), used,
        input_shapes=[tuple(example_inputs[index].shape) for index in used],
        input_dtypes=[given[index].dtype for index in used],
        outputs=[TensorOutput(f"output{index}", output_dtypes[index] if half else leaf.meta["val"].dtype)
                 if isinstance(leaf, torch.fx.Node) else leaf for index, leaf in enumerate(output_node.args[0])],
        output_spec=program.call_spec.out_spec,
        batch=compilation.graph.batch,
    )
    if half:
        release_float32_weights(compilation.graph)
    if verify:
        checks = [given]
        if compiled.batch:  # a smaller batch too, and a larger one (two chunks)
            checks += [[value[:-1] for value in given], [torch.cat([value, value[:1]]) for value in given]]
        verify_module(compiled, module, checks)
    return compiled


def build_exported(module: nn.Module, program, example_inputs: Sequence[torch.Tensor], cache: KernelCache,
                   options: Options, target: Target, search_budget: float | str,
                   storage: Callable[[Graph, list[int]], Storage] | None = None) -> tuple[Compilation, list[int]]:
    """The exported program lowered (the batch made symbolic where `options` say and it can be)
    and built for `target` by its passes (program.py), searching within `search_budget`; with the
    positions of the forward's arguments the graph reads. `storage`, given the lowered graph and
    those positions, says which of its buffers are stored in a half dtype. Needs no device: the
    CUDA target's build is NVRTC's PTX."""
    graph = lower_exported(program)
    if options.symbolic_batch:
        mark_symbolic_batch(graph, module, example_inputs)
    # Program inputs are the graph's that survived pruning (an unused input is not passed).
    used = [index for index, name in enumerate(program.graph_signature.user_inputs) if name in graph.inputs]
    if storage is not None:
        graph.storage = storage(graph, used)
    example = {name: example_inputs[index].detach().cpu().to(torch.float32).numpy()
               for index, name in zip(used, graph.inputs, strict=True)}
    compilation = compile_graph(graph, cache, options, example_inputs=example,
                                target=with_search_budget(target, search_budget))
    return compilation, used


def verify_module(compiled: CompiledModule, module: nn.Module, inputs: Sequence[Sequence[torch.Tensor]]) -> float:
    """Largest difference from eager PyTorch (math path, eval mode) over the input sets; raises
    VerificationError beyond the engine's tolerance. A half-precision program is checked against
    `module`, its float32 copy, on the inputs widened; its half outputs within one rounding to
    their dtype more (ROUNDING)."""
    worst = 0.0
    for args in inputs:
        with math_path(module), torch.no_grad():
            expected = pytree.tree_leaves(module(*(widened(value) for value in args)))
        got = pytree.tree_leaves(compiled(*args))
        for index, (want, have) in enumerate(zip(expected, got, strict=True)):
            if not isinstance(want, torch.Tensor):
                if want != have:
                    raise VerificationError(f"output {index}: compiled {have!r}, torch {want!r}")
                continue
            rtol = max(compiled.target.rtol, ROUNDING.get(dtype_name(have.dtype), 0.0))
            want, have = want.detach().float().cpu().numpy(), have.detach().float().cpu().numpy()
            if want.shape != have.shape:
                raise VerificationError(f"output {index}: compiled shape {have.shape}, torch {want.shape}")
            error = float(np.max(np.abs(want - have))) if want.size else 0.0
            worst = max(worst, error)
            target = compiled.target
            if not np.allclose(have, want, atol=target.atol, rtol=rtol):
                raise VerificationError(f"output {index} differs from PyTorch by up to {error:.3g} "
                                        f"(tolerance {target.atol} + {rtol}·|x|)")
    compiled.max_error = worst if np.isnan(compiled.max_error) else max(worst, compiled.max_error)
    return worst


