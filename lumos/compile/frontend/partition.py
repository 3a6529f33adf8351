"""Partitioning: the parts of a module the compiler can lower are compiled, the rest runs in eager.

An exported aten graph with an op no lowering reads (cumsum, argmax, topk ...) is cut around it:
PyTorch's CapabilityBasedPartitioner groups the nodes the lowering table accepts
(`lumos_model.can_lower`) into the largest acyclic partitions, each partition becomes a submodule
of the exported graph, and each submodule worth a kernel is compiled by `compile_module` (verified
against eager as any compile is). What is left, the unsupported ops and partitions of views and
copies only, runs as PyTorch ops inside the same callable, between the compiled partitions.
One `EagerFallbackWarning` names each op left to eager and its source line.

Shapes are those of the example (the exported graph's views hold its sizes): no symbolic batch.
A bfloat16 or float16 module is cut in its dtype: each partition is then a half module, compiled
with its weights, inputs and outputs stored half (frontend/half.py); a float64 one stays in eager.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from lumos.compile.frontend.half import HALF
from lumos.compile.frontend.lumos_model import IGNORED, can_lower, describe

COPIES = {"aten._to_copy.default", "aten.clone.default", "aten.contiguous.default", "aten._unsafe_view.default",
          "aten.lift_fresh_copy.default", "aten.to.dtype", "aten.type_as.default", "aten.detach.default"}
"""Ops that move or convert data without arithmetic (besides the views, `OpOverload.is_view`)."""


class EagerFallbackWarning(UserWarning):
    """Some ops of a compiled module run in eager PyTorch (no lowering reads them)."""


class _Lowerable(OperatorSupportBase):
    """A call the lowering table accepts, on at least one input of the forward (a constant, as an
    arange or a mask made of weights, is computed in eager and compiled into the partitions that
    read it, never made a partition's output); an item of a tuple (getitem) only where the op
    that made the tuple is compiled too (a partition's inputs are tensors, never tuples)."""

    def __init__(self, constants: set[torch.fx.Node]):
        super().__init__()
        self.constants = constants

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node in self.constants or not can_lower(node):
            return False
        return all(self.is_node_supported(submodules, arg) for arg in node.all_input_nodes
                   if isinstance(arg.meta.get("val"), (tuple, list)))


def unsupported_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [node for node in graph.nodes if node.op == "call_function" and not can_lower(node)]


def _computes(node: torch.fx.Node) -> bool:
    """Does arithmetic: not a view, a copy, a tuple item or an ignored assertion."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem or str(target) in COPIES | IGNORED:
        return False
    return not (isinstance(target, torch._ops.OpOverload) and target.is_view)


def constant_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes whose value does not depend on the forward's inputs: weights (get_attr) and what
    the lowering table computes from them alone (an op it cannot lower, as torch.rand, may give
    a new value each call: never a constant)."""
    constants: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr" or (node.op == "call_function" and all(arg in constants for arg in node.all_input_nodes)
                                     and can_lower(node)):
            constants.add(node)
    return constants


def _worth_compiling(partition: Partition) -> bool:
    """Computes something: not only views, copies and tuple items."""
    return any(_computes(node) for node in partition.nodes)


# ---------------------------------------------------------------------------------------------
# A graph as a module, its weights held as parameters


class GraphWithWeights(nn.Module):
    """An fx graph as a module to export: the inputs at `weight_slots` held as this module's own
    parameters (so that export makes them constants), sizes and scalars fixed (`_fixed`), other
    tensors as inputs."""

    def __init__(self, graph: torch.fx.GraphModule, example_inputs: Sequence, weight_slots: list[int]):
        super().__init__()
        self.graph_module = graph
        self.weight_names = {}
        placeholders = [node.target for node in graph.graph.nodes if node.op == "placeholder"]
        for slot in weight_slots:
            name = f"w{slot}_{placeholders[slot]}".replace(".", "_")
            value = example_inputs[slot]
            self.register_parameter(name, value if isinstance(value, nn.Parameter)
                                    else nn.Parameter(value, requires_grad=False))
            self.weight_names[slot] = name
        self.fixed = {slot: value for slot, value in enumerate(example_inputs) if fixed(value)}
        self.slots = len(example_inputs)

    def forward(self, *tensors):
        supplied = iter(tensors)
        args = [getattr(self, self.weight_names[slot]) if slot in self.weight_names
                else self.fixed[slot] if slot in self.fixed else next(supplied) for slot in range(self.slots)]
        # Interpreted, node by node, so that the exported aten nodes keep the stack traces recorded
        # from the user's code (an unsupported op is then named with its source line).
        with torch.fx.traceback.preserve_node_meta():
            return torch.fx.Interpreter(self.graph_module).run(*args)


def fixed(value) -> bool:
    """Compiled in as a constant: a size (int) or a Python float dynamo passes as a 0-dim float64
    tensor (dynamic mode); a program is compiled per value."""
    return not isinstance(value, torch.Tensor) or (value.ndim == 0 and value.dtype == torch.float64)


# ---------------------------------------------------------------------------------------------
# The partitioned module


class _CompiledPartition(nn.Module):
    """Stands in for a partition's submodule: the compiled program, given the tensors it reads
    (its weights are compiled in)."""

    def __init__(self, compiled: Callable, tensor_slots: list[int]):
        super().__init__()
        self.compiled, self.tensor_slots = compiled, tensor_slots

    def forward(self, *args):
        return self.compiled(*(args[slot] for slot in self.tensor_slots))


@dataclass
class PartitionedModule:
    """The exported graph, run by PyTorch, with its supported partitions replaced by compiled
    programs; called like the module, on tensors of the example's shapes."""

    graph_module: torch.fx.GraphModule
    partitions: list = field(default_factory=list)
    """The compiled programs (CompiledModule), in graph order."""
    eager_ops: list[str] = field(default_factory=list)
    """The ops that run in eager, each with its source line (lumos_model.describe)."""

    @property
    def max_error(self) -> float:
        return max((partition.max_error for partition in self.partitions), default=0.0)

    def __call__(self, *inputs: torch.Tensor):
        with torch.no_grad():
            return self.graph_module(*inputs)


def compile_partitioned(program, example_inputs: Sequence[torch.Tensor],
                        compile_partition: Callable[[nn.Module, list[torch.Tensor]], object]) -> PartitionedModule:
    """Cut the exported program around the ops the table cannot lower, compile each partition
    worth it with `compile_partition(module, example_inputs)`, and warn once about the rest."""
    graph_module = program.module()
    constants = constant_nodes(graph_module.graph)
    partitioner = CapabilityBasedPartitioner(graph_module, _Lowerable(constants), allows_single_node_partition=True)
    partitions = [partition for partition in partitioner.propose_partitions() if _worth_compiling(partition)]
    eager_ops = [describe(node) for node in unsupported_nodes(graph_module.graph)]
    if partitions:
        partitioner.fuse_partitions(partitions, prefix="lumos_partition_")
    calls = [node for node in graph_module.graph.nodes
             if node.op == "call_module" and node.target.startswith("lumos_partition_")]
    arguments = _partition_arguments(graph_module, calls, example_inputs)
    compiled = []
    for call in calls:
        submodule, args = getattr(graph_module, call.target), arguments[call.target]
        weight_slots = [slot for slot, arg in enumerate(call.args) if arg in constants]
        tensor_slots = [slot for slot in range(len(args)) if slot not in weight_slots]
        if any(args[slot].is_floating_point() and args[slot].dtype not in (torch.float32, *HALF) for slot in tensor_slots):
            continue  # the compiler stores float32, bfloat16 and float16: a float64 partition stays in eager
        if set(HALF) <= {arg.dtype for arg in args if isinstance(arg, torch.Tensor)}:
            continue  # half storage is one half dtype per program (half.half_dtype)
        part = compile_partition(GraphWithWeights(submodule, args, weight_slots), [args[slot] for slot in tensor_slots])
        setattr(graph_module, call.target, _CompiledPartition(part, tensor_slots))
        compiled.append(part)
    warnings.warn(f"lumos: {len(eager_ops)} op(s) run in eager PyTorch, around {len(compiled)} compiled "
                  "partition(s); the compiler has no lowering for:\n" + "\n".join(f"  {op}" for op in eager_ops)
                  + "\n(compile with strict=True to refuse instead)", EagerFallbackWarning, stacklevel=3)
    return PartitionedModule(graph_module, compiled, eager_ops)


def _partition_arguments(graph_module: torch.fx.GraphModule, calls: list[torch.fx.Node],
                         example_inputs: Sequence[torch.Tensor]) -> dict[str, tuple]:
    """What each partition's submodule is called with when the module runs on the example inputs."""
    arguments: dict[str, tuple] = {}
    hooks = [getattr(graph_module, call.target).register_forward_pre_hook(
        lambda module, args, name=call.target: arguments.__setitem__(name, args)) for call in calls]
    try:
        with torch.no_grad():
            graph_module(*example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return arguments
