"""Lumos as a torch.compile backend, for inference:

    fast = torch.compile(model.eval(), backend="lumos")   # torch finds "lumos" by entry point (pyproject)
    with torch.no_grad():
        fast(x)

Dynamo hands the backend each graph it captured (torch-level ops, the module's parameters as extra
inputs) with example inputs. The backend binds the parameters back as weights, exports the graph
to aten and compiles it with `compile_module` (frontend/export.py), verified against the graph on
the example inputs. An op the compiler cannot lower is cut out of the exported graph: it runs in
eager between the compiled partitions (frontend/partition.py), with one EagerFallbackWarning naming
it and its source line; `make_backend(strict=True)` refuses instead with `UnsupportedOp` (dynamo
reports it as a backend failure). The partitioning is done on the aten graph exported from dynamo's,
where the lowering table can say what it reads; the result is one callable either way. As with
`compile_module`, CUDA tensors compile for the CUDA target (and get CUDA tensors back), and kernel
schedules are searched within the "auto" budget (cached: a second run searches nothing).

Dynamo traces whichever path the module takes: for nn.TransformerEncoder in eval mode without grad
that is PyTorch's fused fast path (`torch._transformer_encoder_layer_fwd`), which export rewrites
into the ops it stands for (frontend/fast_path.py); `torch.backends.mha`'s flag is left alone.

A graph dynamo made dynamic (torch.compile(dynamic=True), or after a second shape) is compiled
once per size bucket, not per size: each symbolic size is rounded up (a power of two, at least
16 beyond dim 0; the maximum `torch._dynamo.mark_dynamic(x, dim, max=...)` declares), the inputs
padded with zeros, the outputs sliced back, and each new size's first result checked against
eager; where padding changes a result (a bidirectional encoder without a mask) the graph falls back
to one program per shape (frontend/buckets.py). A program is compiled again when a parameter is replaced
or changed in place. Calls that need gradients are refused: the compiled program has no backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from lumos.compile.compilation import DEFAULT_ARCH
from lumos.compile.frontend.buckets import Buckets
from lumos.compile.frontend.export import CompiledModule, compile_module
from lumos.compile.frontend.half import TOLERANCE, HalfPrecision
from lumos.compile.frontend.lumos_model import UnsupportedOp
from lumos.compile.frontend.partition import GraphWithWeights, PartitionedModule, fixed
from lumos.compile.program import Options
from lumos.compile.runtime.cuda import gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import ATOL


class LumosGraph:
    """What the backend returns for one dynamo graph: called with the graph's inputs (parameters
    included), runs the compiled program for their shapes."""

    def __init__(self, graph: torch.fx.GraphModule, example_inputs: Sequence, cache: KernelCache | None,
                 options: Options | None, strict: bool = False, search_budget: float | str | None = None):
        self.graph, self.cache, self.options, self.strict = graph, cache, options, strict
        self.search_budget = search_budget
        self.weight_slots = [slot for slot, value in enumerate(example_inputs) if isinstance(value, nn.Parameter)]
        self.tensor_slots = [slot for slot, value in enumerate(example_inputs)
                             if not fixed(value) and slot not in self.weight_slots]
        self.compiled: dict[tuple, tuple[tuple, Program]] = {}
        """Per shape key: the weights it was compiled with (`_weights_key`) and the program."""
        _refuse_gradients(example_inputs)
        self.buckets = Buckets.of(graph) if _symbolic(example_inputs) else None
        """Where the graph's symbolic sizes are, for padding them to a bucket (None: static shapes,
        or sizes that padding cannot serve)."""
        if not _symbolic(example_inputs):  # else at the first call, when the sizes are known
            self._compiled_for(example_inputs)  # now, so that an unsupported op fails at once

    def _shape_key(self, inputs: Sequence) -> tuple:
        return tuple(_fixed_value(value) if fixed(value) else (tuple(value.shape), value.dtype)
                     for slot, value in enumerate(inputs) if slot not in self.weight_slots)

    def _weights_key(self, inputs: Sequence) -> tuple:
        """Changes when a parameter is replaced or changed in place (its version counter)."""
        return tuple((id(inputs[slot]), inputs[slot].data_ptr(), inputs[slot]._version) for slot in self.weight_slots)

    def _compiled_for(self, inputs: Sequence) -> Program:
        shapes, weights = self._shape_key(inputs), self._weights_key(inputs)
        if shapes not in self.compiled or self.compiled[shapes][0] != weights:
            module = GraphWithWeights(self.graph, inputs, self.weight_slots)
            # Static shapes: dynamo traces a graph per shape (or hands sizes as inputs), so a
            # symbolic batch would only cost a second trace.
            options = self.options or Options(symbolic_batch=False, arch=gpu_arch() or DEFAULT_ARCH)
            compiled = compile_module(module, [inputs[slot] for slot in self.tensor_slots], self.cache, options,
                                      strict=self.strict, search_budget=self.search_budget)
            self.compiled[shapes] = (weights, compiled)
        return self.compiled[shapes][1]

    def __call__(self, *inputs):
        _refuse_gradients(inputs)
        if self.buckets is not None and not self.buckets.exact:
            padded = self._run_padded(inputs)
            if padded is not None:
                return padded
        return self._run(inputs)

    def _run(self, inputs: Sequence):
        return self._compiled_for(inputs)(*(inputs[slot] for slot in self.tensor_slots))

    def _run_padded(self, inputs: Sequence):
        """The call run by its bucket's program, or None where padding does not serve this graph
        (then `buckets.exact` is set: one program per shape from now on)."""
        buckets = self.buckets
        sizes = buckets.sizes(inputs)
        padded_sizes = buckets.bucketed(sizes)
        try:
            result = buckets.sliced(self._run(buckets.padded(inputs, padded_sizes)), sizes)
        except (UnsupportedOp, RuntimeError, ValueError):  # e.g. a padded channel dim a weight fixes
            buckets.exact = True
            return None
        key = self._shape_key(inputs)
        if key not in buckets.checked:  # a new size: its first result is compared with eager's
            with torch.no_grad():
                expected = self.graph(*inputs)
            if not all(_close(want, have) for want, have in zip(
                    torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(result), strict=True)):
                buckets.exact = True
                return None
            buckets.checked.add(key)
        return result


Program = CompiledModule | PartitionedModule | HalfPrecision


def _close(want: torch.Tensor, have: torch.Tensor) -> bool:
    """Within the compile's verification tolerance (a half dtype's for half outputs: eager rounds
    after each op, the program computes in float32)."""
    tolerance = TOLERANCE.get(want.dtype, ATOL)
    return want.shape == have.shape and torch.allclose(want.float(), have.float(), atol=tolerance, rtol=tolerance)


def _fixed_value(value):
    return value.item() if isinstance(value, torch.Tensor) else value


def _symbolic(inputs: Sequence) -> bool:
    """Dynamo made some size dynamic (torch.compile(dynamic=True), or after a recompile)."""
    return any(isinstance(value, torch.SymInt) or (isinstance(value, torch.Tensor)
               and any(isinstance(size, torch.SymInt) for size in value.shape)) for value in inputs)


def _refuse_gradients(inputs: Sequence) -> None:
    if torch.is_grad_enabled() and any(isinstance(value, torch.Tensor) and value.requires_grad for value in inputs):
        raise UnsupportedOp("the lumos backend compiles inference only: call the compiled model under "
                            "torch.no_grad() or torch.inference_mode()")


def lumos_backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The torch.compile backend "lumos" (default kernel cache, options and search budget:
    compile_module's "auto", or $LUMOS_SEARCH_BUDGET)."""
    return LumosGraph(graph, example_inputs, cache=None, options=None)


def make_backend(cache: KernelCache | None = None, options: Options | None = None, strict: bool = False,
                 search_budget: float | str | None = None) -> Callable:
    """A backend with its own kernel cache and options: torch.compile(model, backend=make_backend(...));
    `strict` refuses a graph with an op the compiler cannot lower instead of running it in eager;
    `search_budget` is compile_module's (seconds, "auto", 0: no search; unset: the default)."""
    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return LumosGraph(graph, example_inputs, cache, options, strict, search_budget)
    return backend
