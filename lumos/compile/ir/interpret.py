"""The reference interpreter: every primitive in numpy, one node at a time, except that a matrix
product (a MUL read only by a SUM) is summed with its SUM by einsum, so that its M·N·K products
are never an array.

It defines what the IR means; every backend is tested against it and it is tested against
PyTorch eager.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lumos.compile.ir.graph import OPS, REDUCE, Graph, Node, Op, View, matmul_sum


def strided(source: np.ndarray, view: View) -> np.ndarray:
    """The unmasked `view` of a source array, as a read-only numpy view (no copy)."""
    flat = np.ascontiguousarray(source, dtype=np.float32).reshape(-1)
    return np.lib.stride_tricks.as_strided(flat[view.offset:], shape=view.shape,
                                           strides=[stride * 4 for stride in view.strides], writeable=False)


def read_view(source: np.ndarray, view: View) -> np.ndarray:
    """The operand `view` of a contiguous source array, as a new array."""
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
        out = strided(source, box).copy()
    return out if pads is None else np.pad(out, pads)


AXES = "abcdefghijklmnopqrstuvwxyz"


def summed_products(graph: Graph, keep: set[Node] = frozenset()) -> set[Node]:
    """MUL nodes read only by a SUM through an unmasked identity view, whose operands are unmasked:
    matrix products, evaluated with their SUM by `product_sum` instead of as an M·N·K array."""
    uses = graph.consumers()
    outputs = set(graph.outputs.values())
    products = set()
    for node in graph.nodes:
        if (node not in keep and node not in outputs and matmul_sum(node, uses) is not None
                and all(view.mask is None for view in node.views)):
            products.add(node)
    return products


def product_sum(node: Node, values: Mapping[Node, np.ndarray]) -> np.ndarray:
    """The SUM `node` of a product in `summed_products`, from its operands' `values`, by einsum over
    each operand's own axes: a broadcast (stride 0) axis is dropped from its operand, so the M·N·K
    products are never materialized. Sums in float32 in another order than run_node's SUM."""
    product = node.srcs[0]
    operands, subscripts = [], []
    for src, view in zip(product.srcs, product.views, strict=True):
        kept = [axis for axis, (size, stride) in enumerate(zip(view.shape, view.strides, strict=True))
                if stride != 0 or size == 1]
        operands.append(strided(values[src], view)[tuple(slice(None) if axis in kept else 0
                                                          for axis in range(len(view.shape)))])
        subscripts.append(kept)
    out_axes = [axis for axis in range(len(product.shape)) if axis != node.arg and any(axis in k for k in subscripts)]
    spec = ",".join("".join(AXES[axis] for axis in kept) for kept in subscripts) + "->" + "".join(AXES[a] for a in out_axes)
    summed = np.einsum(spec, *operands, optimize=True)
    shape = [product.shape[axis] if axis in out_axes else 1 for axis in range(len(product.shape))]
    return np.ascontiguousarray(np.broadcast_to(summed.reshape(shape), node.shape), dtype=np.float32)


def run_node(node: Node, operands: list[np.ndarray], tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        if node.op is Op.CONST:
            value = np.float32(node.arg) if isinstance(node.arg, float) else tensors[node.arg]
            return np.asarray(value, np.float32).reshape(node.shape)
        reference = OPS[node.op].reference  # ir/ops.py: what each op means
        if node.op in REDUCE:
            return reference(operands[0], node.arg)
        if reference is not None:
            return np.asarray(reference(*operands), np.float32)
    raise NotImplementedError(f"the interpreter has no rule for {node.op.name}")


def interpret(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the graph on named inputs; returns the named outputs."""
    values: dict[Node, np.ndarray] = {}
    products = summed_products(graph)
    for node in graph.nodes:
        if node.op is Op.INPUT:
            value = np.asarray(inputs[node.arg], np.float32)
            if value.shape != node.shape:
                raise ValueError(f"input {node.arg!r}: expected shape {node.shape}, got {value.shape}")
            values[node] = value
            continue
        if node in products:
            continue  # computed by its SUM
        if node.op is Op.SUM and node.srcs[0] in products:
            values[node] = product_sum(node, values)
            continue
        operands = [read_view(values[src], view) for src, view in zip(node.srcs, node.views, strict=True)]
        values[node] = run_node(node, operands, graph.tensors)
    return {name: values[node].reshape(graph.output_shapes.get(name, node.shape)) for name, node in graph.outputs.items()}
