"""Horizontal fusion: linear layers that read the same input become one matmul.

A self-attention's query and key/value projections read the same normed input, and every
decoder layer's cross-attention projects the same encoder memory. Computed apart, each matmul
reads the input again (and recomputes the layer norm fused before it), and narrow outputs (64
columns at d_model 64) fill a register block poorly. Here their weights are concatenated along
the output dim (and their biases, when every member has one) into one wider matmul, and each
former output becomes a column range of the fused one: its consumers' views are re-expressed over
the wider rows, so nothing downstream changes.

The concatenated weight is named by its parts joined with `|` (and the layout pass may add `#T`);
`weight_value` rebuilds it from the model's parameters when a stored plan is bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lumos.compile.ir.graph import LITERAL_PREFIX, Graph, Node, Op, View, matmul_sum
from lumos.compile.schedule.layout import TRANSPOSED, row_column_steps

JOINED = "|"


@dataclass(frozen=True)
class _Linear:
    product: Node
    """MUL of (…, M, N, K): the input broadcast over N times the weight (N, K) broadcast over M."""
    weight_index: int
    reduction: Node
    """SUM over K: (…, M, N, 1)."""
    bias_add: Node | None
    """ADD of the reduction and a (N,) bias, when that is the reduction's only use."""
    bias: Node | None

    @property
    def weight(self) -> Node:
        return self.product.srcs[self.weight_index]

    @property
    def columns(self) -> int:
        return self.weight.shape[0]


def fuse_linear_layers(graph: Graph) -> int:
    """Fuse every group of linear layers that read the same input through the same view; returns
    how many matmuls were removed."""
    uses = graph.consumers()
    groups: dict[tuple, list[_Linear]] = {}
    for node in graph.nodes:
        linear = _as_linear(node, uses)
        if linear is not None:
            groups.setdefault(_input_key(linear), []).append(linear)
    removed = 0
    for members in groups.values():
        if len(members) > 1 and _fuse(graph, members, uses):
            removed += len(members) - 1
    if removed:
        graph.prune()
    return removed


def weight_value(name: str, weights) -> np.ndarray | None:
    """A plan's weight tensor from the model's parameters by name: `a|b` is a and b concatenated
    along dim 0 (horizontal fusion); a `#T` suffix, added after, transposes it (layout.py)."""
    parts = name.removesuffix(TRANSPOSED).split(JOINED)
    if any(part not in weights for part in parts):
        return None
    value = np.concatenate([weights[part].detach().cpu().float().numpy() for part in parts], axis=0)
    return np.ascontiguousarray(value.T if name.endswith(TRANSPOSED) else value)


def _is_weight(node: Node) -> bool:
    return node.op is Op.CONST and isinstance(node.arg, str) and not node.arg.startswith(LITERAL_PREFIX)


def _as_linear(product: Node, uses) -> _Linear | None:
    """`product` as a linear layer's multiply (x · Wᵀ, W (N, K) as torch keeps it), or None."""
    reduction = matmul_sum(product, uses)
    if reduction is None or reduction.arg != len(product.shape) - 1 or len(product.shape) < 3:
        return None
    *outer, columns, depth = product.shape
    for weight_index in (0, 1):
        weight = product.srcs[weight_index]
        if not (_is_weight(weight) and weight.shape == (columns, depth)):
            continue
        read = View(product.shape, (0,) * len(outer) + (depth, 1))
        if product.views[weight_index] != read or product.views[1 - weight_index].strides[-2] != 0:
            continue
        return _Linear(product, weight_index, reduction, *_bias_add(reduction, uses))
    return None


def _bias_add(reduction: Node, uses) -> tuple[Node | None, Node | None]:
    """(the ADD, the bias) when the reduction's only use adds a (N,) bias to it, else (None, None)."""
    if len(uses[reduction]) != 1:
        return None, None
    add, index = uses[reduction][0]
    shape = reduction.shape[:-1]
    if add.op is not Op.ADD or add.shape != shape or add.views[index] != View.contiguous(shape):
        return None, None
    bias, read = add.srcs[1 - index], add.views[1 - index]
    if not (_is_weight(bias) and bias.shape == shape[-1:] and read == View(shape, (0,) * (len(shape) - 1) + (1,))):
        return None, None
    return add, bias


def _input_key(linear: _Linear) -> tuple:
    """Equal for linear layers that read the same input the same way (their widths aside)."""
    index = 1 - linear.weight_index
    view = linear.product.views[index]
    shape = view.shape[:-2] + view.shape[-1:]
    return (id(linear.product.srcs[index]), index, shape, view.strides, view.offset, view.mask, linear.product.batched)


def _fuse(graph: Graph, members: list[_Linear], uses) -> bool:
    """Replace `members` by one linear layer when every consumer's view can read a column range
    of the wider output; False (and the graph untouched) otherwise."""
    with_bias = all(member.bias_add is not None for member in members)
    width = sum(member.columns for member in members)
    rebased: list[tuple[Node, int, View]] = []
    start = 0
    for member in members:
        output = member.bias_add if with_bias else member.reduction
        if any(node is output for node in graph.outputs.values()):
            return False
        for consumer, index in uses[output]:
            view = _column_range_view(consumer.views[index], member.columns, width, start)
            if view is None:
                return False
            rebased.append((consumer, index, view))
        start += member.columns

    first = members[0]
    outer, depth = first.product.shape[:-2], first.product.shape[-1]
    name = JOINED.join(member.weight.arg for member in members)
    graph.tensors[name] = np.concatenate([graph.tensors[member.weight.arg] for member in members], axis=0)
    _store_joined(graph, name, [member.weight.arg for member in members])
    origin = " + ".join(member.product.origin for member in members)
    weight = graph.add(Op.CONST, arg=name, shape=(width, depth), origin=origin)
    shape = (*outer, width, depth)
    views = list(first.product.views)
    views[first.weight_index] = View(shape, (0,) * len(outer) + (depth, 1))
    activation = views[1 - first.weight_index]
    views[1 - first.weight_index] = View(shape, activation.strides, activation.offset, activation.mask)
    srcs = list(first.product.srcs)
    srcs[first.weight_index] = weight
    product = graph.add(Op.MUL, srcs, views, shape, origin=origin)
    reduction = graph.add(Op.SUM, (product,), (View.contiguous(shape),), (*outer, width, 1), arg=len(shape) - 1,
                          origin=origin)
    new_nodes = [weight, product, reduction]
    output = reduction
    if with_bias:
        bias_name = JOINED.join(member.bias.arg for member in members)
        graph.tensors[bias_name] = np.concatenate([graph.tensors[member.bias.arg] for member in members])
        _store_joined(graph, bias_name, [member.bias.arg for member in members])
        bias = graph.add(Op.CONST, arg=bias_name, shape=(width,), origin=origin)
        out_shape = (*outer, width)
        output = graph.add(Op.ADD, (reduction, bias), (View.contiguous(out_shape), View(out_shape, (0,) * len(outer) + (1,))),
                           out_shape, origin=origin)
        new_nodes += [bias, output]
    for node in new_nodes:
        node.batched = first.product.batched and node.op is not Op.CONST
    for consumer, index, view in rebased:
        consumer.srcs = consumer.srcs[:index] + (output,) + consumer.srcs[index + 1:]
        consumer.views = consumer.views[:index] + (view,) + consumer.views[index + 1:]
    _insert_before(graph, new_nodes, min((member.product for member in members), key=lambda node: node.id))
    return True


def _column_range_view(view: View, columns: int, width: int, start: int) -> View | None:
    """`view` of a row-major buffer with rows of `columns` floats, re-expressed over one whose rows
    hold `width` floats with these columns at `start`; None when a dim walks across rows other
    than whole rows at a time, or the view is padded."""
    found = row_column_steps(view, columns)
    if found is None:
        return None
    row0, col0, steps = found
    return View(view.shape, tuple(row * width + col for row, col in steps), row0 * width + start + col0)


def _insert_before(graph: Graph, new_nodes: list[Node], anchor: Node) -> None:
    """Move the appended `new_nodes` to just before `anchor` (their inputs all precede it) and renumber."""
    rest = graph.nodes[:-len(new_nodes)]
    at = rest.index(anchor)
    graph.nodes = rest[:at] + new_nodes + rest[at:]
    for index, node in enumerate(graph.nodes):
        node.id = index


def _store_joined(graph: Graph, name: str, parts: list[str]) -> None:
    """A joined weight is stored half when all its parts were, in their dtype; else float32
    (which holds a half value exactly)."""
    dtypes = {graph.storage.tensors.get(part) for part in parts}
    if len(dtypes) == 1 and None not in dtypes:
        graph.storage.tensors[name] = dtypes.pop()
