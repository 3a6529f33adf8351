"""Layout: store each linear layer's weight transposed, so matmul reductions read it row by row.

torch keeps a Linear weight as (out, in) and computes x @ Wᵀ: summed over `in`, consecutive
outputs sit `in` floats apart. Stored as (in, out), one reduction step reads a contiguous row of
outputs, which the C renderer turns into one vectorized pass (see KernelRenderer.interchange).
The rewrite only touches a weight whose every use is such a product; its views are re-expressed
over the transposed tensor, so nothing else changes. The plan names it `<weight>#T`, and the
engine transposes the model's weight when binding it.
"""

from __future__ import annotations

from lumos.compile.ir import LITERAL_PREFIX, Graph, Node, Op, View

TRANSPOSED = "#T"


def transposed_view(view: View, rows: int, cols: int) -> View | None:
    """`view` of a (rows, cols) tensor, re-expressed over its (cols, rows) transpose, or None."""
    if view.mask is not None:
        return None
    row0, col0 = divmod(view.offset, cols)
    strides, row_reach, col_reach = [], row0, col0
    for size, stride in zip(view.shape, view.strides, strict=True):
        if stride == 0 or size == 1:
            strides.append(0)
        elif stride % cols == 0:
            strides.append(stride // cols)
            row_reach += stride // cols * (size - 1)
        elif stride < cols:
            strides.append(stride * rows)
            col_reach += stride * (size - 1)
        else:
            return None
    if row_reach >= rows or col_reach >= cols:
        return None
    return View(view.shape, tuple(strides), col0 * rows + row0)


def _is_product_over_columns(consumer: Node, index: int, uses: dict[Node, list[tuple[Node, int]]], cols: int) -> bool:
    """`consumer` multiplies the weight inside a sum whose axis walks the weight's columns (`in`)."""
    if consumer.op is not Op.MUL or len(uses[consumer]) != 1:
        return False
    reduction, _ = uses[consumer][0]
    if reduction.op is not Op.SUM or reduction.views[0].shape != consumer.shape:
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
        node.arg, node.shape = name, (cols, rows)
        count += 1
    return count
