"""Layout: lay out matmul operands so that reductions read them row by row.

torch keeps a Linear weight as (out, in) and computes x @ Wᵀ: summed over `in`, consecutive
outputs sit `in` floats apart. Stored as (in, out), one reduction step reads a contiguous row of
outputs, which the C renderer turns into one vectorized pass (see KernelRenderer.interchange).
The rewrite only touches a weight whose every use is such a product; its views are re-expressed
over the transposed tensor, so nothing else changes. The plan names it `<weight>#T`, and the
engine transposes the model's weight when binding it.

The same holds for activations: attention scores q·kᵀ read k with the key index j as the slow
dim. `transpose_activations` gives such an operand a copy laid out (…, reduction, j), which costs
one cheap pass over k and turns the scores into row-wise, vectorized passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lumos.compile.ir.graph import LEAF, LITERAL_PREFIX, Graph, Node, Op, View, contiguous_strides, matmul_sum, prod

TRANSPOSED = "#T"


def row_column_steps(view: View, cols: int) -> tuple[int, int, list[tuple[int, int]]] | None:
    """`view` of a row-major buffer with rows of `cols` floats, as the (row, column) of its first
    element and, per dim, its step as (whole rows, columns within a row), one of them 0; None when
    the view is padded, a dim steps across rows other than whole rows at a time, or the columns
    it reads run past the end of the row."""
    if view.mask is not None:
        return None
    row0, col0 = divmod(view.offset, cols)
    steps, col_reach = [], col0
    for size, stride in zip(view.shape, view.strides, strict=True):
        if stride == 0 or size == 1:
            steps.append((0, 0))
        elif stride % cols == 0:
            steps.append((stride // cols, 0))
        elif stride < cols:
            steps.append((0, stride))
            col_reach += stride * (size - 1)
        else:
            return None
    return None if col_reach >= cols else (row0, col0, steps)


def transposed_view(view: View, rows: int, cols: int) -> View | None:
    """`view` of a (rows, cols) tensor, re-expressed over its (cols, rows) transpose, or None."""
    found = row_column_steps(view, cols)
    if found is None:
        return None
    row0, col0, steps = found
    if row0 + sum(row * (size - 1) for (row, _), size in zip(steps, view.shape, strict=True)) >= rows:
        return None
    return View(view.shape, tuple(row + col * rows for row, col in steps), col0 * rows + row0)


def _is_product_over_columns(consumer: Node, index: int, uses: dict[Node, list[tuple[Node, int]]], cols: int) -> bool:
    """`consumer` multiplies the weight inside a sum whose axis walks the weight's columns (`in`)."""
    reduction = matmul_sum(consumer, uses)
    if reduction is None:
        return False
    view = consumer.views[index]
    axis = reduction.arg
    return view.strides[axis] == 1 and any(stride == cols for stride in view.strides)


def transpose_weights(graph: Graph) -> int:
    """Rewrite every eligible 2-D weight; returns how many were transposed."""
    uses = graph.consumers()
    count = 0
    for node in graph.nodes:
        if node.op is not Op.CONST or not isinstance(node.arg, str) or node.arg.startswith(LITERAL_PREFIX):
            continue
        if len(node.shape) != 2 or node.arg.endswith(TRANSPOSED) or not uses[node]:
            continue
        rows, cols = node.shape
        if not all(_is_product_over_columns(consumer, index, uses, cols) for consumer, index in uses[node]):
            continue
        views = {(consumer, index): transposed_view(consumer.views[index], rows, cols) for consumer, index in uses[node]}
        if any(view is None for view in views.values()):
            continue
        for (consumer, index), view in views.items():
            consumer.views = consumer.views[:index] + (view,) + consumer.views[index + 1:]
        name = node.arg + TRANSPOSED
        graph.tensors[name] = graph.tensors.pop(node.arg).T.copy()
        if node.arg in graph.storage.tensors:  # a half weight stays half, under its new name
            graph.storage.tensors[name] = graph.storage.tensors.pop(node.arg)
        node.arg, node.shape = name, (cols, rows)
        count += 1
    return count


def _matmul_axes(product: Node, uses) -> tuple[int, int] | None:
    """(j, axis) when `product` is a matmul's multiply: summed over its last axis, j the last
    other dim of size > 1."""
    reduction = matmul_sum(product, uses)
    axis = len(product.shape) - 1
    if reduction is None or reduction.arg != axis:
        return None
    outer = [d for d in range(axis) if product.shape[d] > 1]
    return (outer[-1], axis) if outer else None


def transpose_activations(graph: Graph) -> int:
    """Copy matmul operands read across j (and along the sum) into a (…, sum, j) layout."""
    uses = graph.consumers()
    count = 0
    for product in list(graph.nodes):
        axes = _matmul_axes(product, uses)
        if axes is None:
            continue
        j, axis = axes
        for index in (0, 1):
            source, view, other = product.srcs[index], product.views[index], product.views[1 - index]
            if source.op in LEAF or not (view.strides[j] > 1 and view.strides[axis] == 1 and other.strides[j] == 0):
                continue
            kept = [d for d in range(len(view.shape)) if not (view.strides[d] == 0 and view.shape[d] > 1)]
            order = [d for d in kept if d not in (j, axis)] + [axis, j]
            shape = tuple(view.shape[d] for d in order)
            mask = None if view.mask is None else tuple(view.mask[d] for d in order)
            copy_view = View(shape, tuple(view.strides[d] for d in order), view.offset, mask)
            zero = graph.scalar(0.0)
            copy = graph.add(Op.ADD, (source, zero), (copy_view, View(shape, (0,) * len(shape))), shape,
                             origin=f"layout: {source.origin}")
            copy.batched = source.batched and order[0] == 0  # its rows are the source's rows
            strides = contiguous_strides(shape)
            new_view = View(view.shape, tuple(strides[order.index(d)] if d in order else 0 for d in range(len(view.shape))))
            product.views = product.views[:index] + (new_view,) + product.views[index + 1:]
            product.srcs = product.srcs[:index] + (copy,) + product.srcs[index + 1:]
            _move_before(graph, [zero, copy], product)
            count += 1
    return count


@dataclass(frozen=True)
class Relayout:
    """A copy that only lays out another node's elements anew (`transpose_activations`' copy):
    element i of `source` (row-major) sits at `offset + Σ steps[d] · i[d]` in the copy's buffer."""

    source: Node
    offset: int
    steps: tuple[int, ...]
    """Per dim of the source: how far the copy's buffer moves along it (0 for a dim of one)."""


def relayout(copy: Node) -> Relayout | None:
    """Where a layout copy (`source + 0` through a view that reads each element of the source
    exactly once, no padding) puts each element of its source, when that is affine in the
    source's index; None for any other node. A kernel that computes the source may then store
    each element straight where the copy keeps it (kernel/lower.py: lower_products)."""
    if copy.op is not Op.ADD or len(copy.srcs) != 2:
        return None
    (source, zero), view = copy.srcs, copy.views[0]
    if not (zero.is_scalar_const and zero.arg == 0.0) or source.op in LEAF or view.mask is not None:
        return None
    if prod(copy.shape) != prod(source.shape) or copy.batched != source.batched:
        return None
    read = np.full(copy.shape, view.offset, np.int64)  # the source element each copy element reads
    for d, (size, stride) in enumerate(zip(copy.shape, view.strides, strict=True)):
        read = read + (np.arange(size) * stride).reshape([size if e == d else 1 for e in range(len(copy.shape))])
    read = read.ravel()
    count = prod(source.shape)
    if read.min() < 0 or read.max() >= count or len(np.unique(read)) != count:
        return None  # not each element exactly once
    at = np.empty(count, np.int64)
    at[read] = np.arange(count)  # by the source's row-major index: where the copy keeps it
    at = at.reshape(source.shape)
    steps = tuple(int(at[tuple(1 if e == d else 0 for e in range(at.ndim))] - at.flat[0]) if size > 1 else 0
                  for d, size in enumerate(source.shape))
    affine = np.full(source.shape, at.flat[0], np.int64)
    for d, (size, step) in enumerate(zip(source.shape, steps, strict=True)):
        affine = affine + (np.arange(size) * step).reshape([size if e == d else 1 for e in range(at.ndim)])
    if not np.array_equal(affine, at):
        return None
    if copy.batched and (at.flat[0] != 0 or steps[0] != contiguous_strides(copy.shape)[0]):
        return None  # a row of the batch must stay a row: the runtime row count bounds both
    return Relayout(source, int(at.flat[0]), steps)


def _move_before(graph: Graph, moved: list[Node], anchor: Node) -> None:
    """Keep the node list topological after appending `moved` (anchor uses them); renumber."""
    position = {id(node): index for index, node in enumerate(graph.nodes)}
    to_move = [node for node in moved if position[id(node)] > position[id(anchor)]]
    if to_move:
        rest = [node for node in graph.nodes if all(node is not m for m in to_move)]
        at = next(index for index, node in enumerate(rest) if node is anchor)
        graph.nodes = rest[:at] + to_move + rest[at:]
    for index, node in enumerate(graph.nodes):
        node.id = index
