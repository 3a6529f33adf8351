"""The reference interpreter: every primitive in numpy, one node at a time.

It defines what the IR means; every backend is tested against it and it is tested against
PyTorch eager.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lumos.compile.ir import Graph, Node, Op, View

UNARY_NUMPY = {
    Op.EXP2: np.exp2,
    Op.LOG2: np.log2,
    Op.SIN: np.sin,
    Op.RECIP: lambda x: np.float32(1.0) / x,
    Op.SQRT: np.sqrt,
}
BINARY_NUMPY = {
    Op.ADD: np.add,
    Op.MUL: np.multiply,
    Op.MOD: np.fmod,
    Op.LESS_THAN: lambda a, b: (a < b).astype(np.float32),
}


def read_view(source: np.ndarray, view: View) -> np.ndarray:
    """The operand `view` of a contiguous source array, as a new array."""
    flat = np.ascontiguousarray(source, dtype=np.float32).reshape(-1)
    if view.mask is None:
        box, pads = view, None
    else:
        # Read the valid box, then pad zeros around it.
        if any(lo >= hi for lo, hi in view.mask):
            return np.zeros(view.shape, np.float32)
        box = view.shrink(tuple(view.mask))
        box = View(box.shape, box.strides, box.offset)
        pads = [(lo, size - hi) for (lo, hi), size in zip(view.mask, view.shape, strict=True)]
    if any(size == 0 for size in box.shape):
        out = np.zeros(box.shape, np.float32)
    else:
        out = np.lib.stride_tricks.as_strided(
            flat[box.offset:], shape=box.shape, strides=[stride * 4 for stride in box.strides], writeable=False
        ).copy()
    return out if pads is None else np.pad(out, pads)


def run_node(node: Node, operands: list[np.ndarray], tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        if node.op is Op.CONST:
            value = np.float32(node.arg) if isinstance(node.arg, float) else tensors[node.arg]
            return np.asarray(value, np.float32).reshape(node.shape)
        if node.op in UNARY_NUMPY:
            return UNARY_NUMPY[node.op](operands[0]).astype(np.float32)
        if node.op in BINARY_NUMPY:
            return BINARY_NUMPY[node.op](operands[0], operands[1]).astype(np.float32)
        if node.op is Op.SUM:
            return operands[0].sum(axis=node.arg, keepdims=True, dtype=np.float32)
        if node.op is Op.MAX:
            return operands[0].max(axis=node.arg, keepdims=True)
        if node.op is Op.GATHER:
            table, ids = operands
            return table[ids.astype(np.int64)]
    raise NotImplementedError(f"the interpreter has no rule for {node.op.name}")


def interpret(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the graph on named inputs; returns the named outputs."""
    values: dict[Node, np.ndarray] = {}
    for node in graph.nodes:
        if node.op is Op.INPUT:
            value = np.asarray(inputs[node.arg], np.float32)
            if value.shape != node.shape:
                raise ValueError(f"input {node.arg!r}: expected shape {node.shape}, got {value.shape}")
            values[node] = value
            continue
        operands = [read_view(values[src], view) for src, view in zip(node.srcs, node.views, strict=True)]
        values[node] = run_node(node, operands, graph.tensors)
    return {name: values[node].reshape(graph.output_shapes.get(name, node.shape)) for name, node in graph.outputs.items()}
