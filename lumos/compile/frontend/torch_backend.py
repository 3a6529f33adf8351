"""Lumos as a torch.compile backend, for inference:

    fast = torch.compile(model.eval(), backend="lumos")   # torch finds "lumos" by entry point (pyproject)
    with torch.no_grad():
        fast(x)

Dynamo hands the backend each graph it captured (torch-level ops, the module's parameters as extra
inputs) with example inputs. The backend binds the parameters back as weights, exports the graph
to aten and compiles it with `compile_module` (frontend/export.py), verified against the graph on
the example inputs. An op the compiler cannot lower raises `UnsupportedOp` naming it and its
source line: there is no silent fallback to eager (dynamo reports it as a backend failure, unless
the caller has set `torch._dynamo.config.suppress_errors`).

Dynamo traces whichever path the module takes: for nn.TransformerEncoder and nn.MultiheadAttention
in eval mode without grad that is PyTorch's fused fast path, which no lowering reads; call
`torch.backends.mha.set_fastpath_enabled(False)` before the first call (the error says so).

One program is kept per input shape (a graph dynamo made dynamic is compiled at each new shape's
first call); it is compiled again when a parameter is replaced or changed in place. Calls that
need gradients are refused: the compiled program has no backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from lumos.compile.frontend.export import CompiledModule, compile_module
from lumos.compile.frontend.lumos_model import UnsupportedOp
from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import KernelCache


class _GraphWithWeights(nn.Module):
    """A dynamo graph as a module: its parameter inputs held as this module's own parameters (so
    that export makes them constants), sizes and scalars fixed (`_fixed`), other tensors as inputs."""

    def __init__(self, graph: torch.fx.GraphModule, example_inputs: Sequence, weight_slots: list[int]):
        super().__init__()
        self.graph_module = graph
        self.weight_names = {}
        placeholders = [node.target for node in graph.graph.nodes if node.op == "placeholder"]
        for slot in weight_slots:
            name = f"w{slot}_{placeholders[slot]}".replace(".", "_")
            self.register_parameter(name, example_inputs[slot])
            self.weight_names[slot] = name
        self.fixed = {slot: value for slot, value in enumerate(example_inputs) if _fixed(value)}
        self.slots = len(example_inputs)

    def forward(self, *tensors):
        supplied = iter(tensors)
        args = [getattr(self, self.weight_names[slot]) if slot in self.weight_names
                else self.fixed[slot] if slot in self.fixed else next(supplied) for slot in range(self.slots)]
        # Interpreted, node by node, so that the exported aten nodes keep the stack traces dynamo
        # recorded from the user's code (an unsupported op is then named with its source line).
        with torch.fx.traceback.preserve_node_meta():
            return torch.fx.Interpreter(self.graph_module).run(*args)


class LumosGraph:
    """What the backend returns for one dynamo graph: called with the graph's inputs (parameters
    included), runs the compiled program for their shapes."""

    def __init__(self, graph: torch.fx.GraphModule, example_inputs: Sequence, cache: KernelCache | None,
                 options: Options | None):
        self.graph, self.cache, self.options = graph, cache, options
        self.weight_slots = [slot for slot, value in enumerate(example_inputs) if isinstance(value, nn.Parameter)]
        self.tensor_slots = [slot for slot, value in enumerate(example_inputs)
                             if not _fixed(value) and slot not in self.weight_slots]
        self.compiled: dict[tuple, tuple[tuple, CompiledModule]] = {}
        """Per shape key: the weights it was compiled with (`_weights_key`) and the program."""
        _refuse_gradients(example_inputs)
        if not _symbolic(example_inputs):  # else at the first call, when the sizes are known
            self._compiled_for(example_inputs)  # now, so that an unsupported op fails at once

    def _shape_key(self, inputs: Sequence) -> tuple:
        return tuple(_fixed_value(value) if _fixed(value) else (tuple(value.shape), value.dtype)
                     for slot, value in enumerate(inputs) if slot not in self.weight_slots)

    def _weights_key(self, inputs: Sequence) -> tuple:
        """Changes when a parameter is replaced or changed in place (its version counter)."""
        return tuple((id(inputs[slot]), inputs[slot].data_ptr(), inputs[slot]._version) for slot in self.weight_slots)

    def _compiled_for(self, inputs: Sequence) -> CompiledModule:
        shapes, weights = self._shape_key(inputs), self._weights_key(inputs)
        if shapes not in self.compiled or self.compiled[shapes][0] != weights:
            module = _GraphWithWeights(self.graph, inputs, self.weight_slots)
            # Static shapes: dynamo traces a graph per shape (or hands sizes as inputs), so a
            # symbolic batch would only cost a second trace.
            options = self.options or Options(symbolic_batch=False)
            compiled = compile_module(module, [inputs[slot] for slot in self.tensor_slots], self.cache, options)
            self.compiled[shapes] = (weights, compiled)
        return self.compiled[shapes][1]

    def __call__(self, *inputs):
        _refuse_gradients(inputs)
        return self._compiled_for(inputs)(*(inputs[slot] for slot in self.tensor_slots))


def _fixed(value) -> bool:
    """Compiled in as a constant: a size (int) or a Python float dynamo passes as a 0-dim float64
    tensor (dynamic mode); a program is compiled per value."""
    return not isinstance(value, torch.Tensor) or (value.ndim == 0 and value.dtype == torch.float64)


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
    """The torch.compile backend "lumos" (default kernel cache and options)."""
    return LumosGraph(graph, example_inputs, cache=None, options=None)


def make_backend(cache: KernelCache | None = None, options: Options | None = None) -> Callable:
    """A backend with its own kernel cache and options: torch.compile(model, backend=make_backend(...))."""
    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return LumosGraph(graph, example_inputs, cache, options)
    return backend
