"""High-level ops, each written once in primitives (after Luminal's hl_ops).

`Tensor` is a builder: a node of the graph seen through a view. Movement methods (reshape,
permute, expand, shrink, pad …) only change the view; arithmetic methods add primitive nodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lumos.compile.ir.graph import LEAF, LITERAL_PREFIX, Graph, Node, Op, View, prod
from lumos.compile.ir.interpret import read_view, run_node

LOG2_E = 1.0 / math.log(2.0)
LN_2 = math.log(2.0)
# Masked attention scores: finite (so that 0 * it stays 0), low enough that exp2 of it is 0.
MASKED = -1e30


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} out of range for {ndim} dims")
    return axis % ndim if ndim else 0


class Tensor:
    def __init__(self, graph: Graph, node: Node, view: View | None = None):
        self.graph, self.node = graph, node
        self.view = view if view is not None else View.contiguous(node.shape)

    # -- leaves ---------------------------------------------------------------------------------

    @staticmethod
    def input(graph: Graph, name: str, shape: Sequence[int]) -> Tensor:
        node = graph.add(Op.INPUT, shape=tuple(shape), arg=name)
        graph.inputs[name] = node
        return Tensor(graph, node)

    @staticmethod
    def constant(graph: Graph, name: str, value: np.ndarray) -> Tensor:
        value = np.ascontiguousarray(value, dtype=np.float32).reshape(np.shape(value))  # a 0-dim stays 0-dim
        graph.tensors[name] = value
        return Tensor(graph, graph.add(Op.CONST, shape=value.shape, arg=name))

    @staticmethod
    def full(graph: Graph, value: float, shape: Sequence[int] = ()) -> Tensor:
        scalar = Tensor(graph, graph.scalar(value))
        return scalar.broadcast_to(tuple(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape

    @property
    def ndim(self) -> int:
        return len(self.view.shape)

    def _with(self, view: View) -> Tensor:
        return Tensor(self.graph, self.node, view)

    def _lift(self, value) -> Tensor:
        return value if isinstance(value, Tensor) else Tensor.full(self.graph, float(value))

    # -- movement: views only -------------------------------------------------------------------

    def reshape(self, *shape) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else tuple(shape)
        if -1 in shape:
            known = prod(size for size in shape if size != -1)
            shape = tuple(prod(self.shape) // known if size == -1 else size for size in shape)
        if shape == self.shape:
            return self
        view = self.view.reshape(shape)
        if view is None:  # not expressible as one view of this node: copy first
            return self.contiguous().reshape(shape)
        return self._with(view)

    def permute(self, *order) -> Tensor:
        order = tuple(order[0]) if len(order) == 1 and isinstance(order[0], tuple | list) else tuple(order)
        return self._with(self.view.permute(tuple(_normalize_axis(d, self.ndim) for d in order)))

    def transpose(self, a: int, b: int) -> Tensor:
        order = list(range(self.ndim))
        a, b = _normalize_axis(a, self.ndim), _normalize_axis(b, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def unsqueeze(self, axis: int) -> Tensor:
        axis = axis % (self.ndim + 1)
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def squeeze(self, axis: int) -> Tensor:
        axis = _normalize_axis(axis, self.ndim)
        if self.shape[axis] != 1:
            return self
        return self.reshape(self.shape[:axis] + self.shape[axis + 1:])

    def broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        """numpy broadcasting: leading size-1 dims are added, size-1 dims repeat (stride 0)."""
        shape = tuple(shape)
        if self.shape == shape:
            return self
        lifted = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
        return lifted._with(lifted.view.expand(shape))

    def expand(self, *shape) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple | list) else tuple(shape)
        lead = len(shape) - self.ndim
        return self.broadcast_to(tuple(self.shape[d - lead] if size == -1 else size for d, size in enumerate(shape)))

    def shrink(self, bounds: Sequence[tuple[int, int]], steps: Sequence[int] | None = None) -> Tensor:
        return self._with(self.view.shrink(tuple(bounds), None if steps is None else tuple(steps)))

    def slice(self, axis: int, start: int, end: int, step: int = 1) -> Tensor:
        axis = _normalize_axis(axis, self.ndim)
        bounds = [(0, size) for size in self.shape]
        steps = [1] * self.ndim
        bounds[axis], steps[axis] = (start, end), step
        return self.shrink(bounds, steps)

    def select(self, axis: int, index: int) -> Tensor:
        axis = _normalize_axis(axis, self.ndim)
        index = index % self.shape[axis]
        return self.slice(axis, index, index + 1).squeeze(axis)

    def pad(self, pads: Sequence[tuple[int, int]]) -> Tensor:
        return self._with(self.view.pad(tuple(pads)))

    def unfold(self, axis: int, size: int, step: int = 1, dilation: int = 1) -> Tensor:
        """Sliding windows along `axis` (torch's Tensor.unfold, with a dilation): the axis becomes
        the windows' start and a new last axis of `size` walks each window. A view: every element
        is read by each window that holds it, nothing is copied. A padded (masked) operand is
        copied first, since a mask bounds each axis alone and a window axis adds two of them."""
        source = self.contiguous() if self.view.mask is not None else self
        axis = _normalize_axis(axis, source.ndim)
        view = source.view
        windows = (view.shape[axis] - dilation * (size - 1) - 1) // step + 1
        if windows < 1:
            raise ValueError(f"a window of {size} (dilation {dilation}) does not fit in axis {axis} of {view.shape}")
        shape = view.shape[:axis] + (windows,) + view.shape[axis + 1:] + (size,)
        strides = view.strides[:axis] + (view.strides[axis] * step,) + view.strides[axis + 1:] \
            + (view.strides[axis] * dilation,)
        return source._with(View(shape, strides, view.offset))

    def contiguous(self) -> Tensor:
        """A copy in row-major order: the one place a view becomes a node (x + 0)."""
        if self.view.is_identity:
            return self
        return self._binary(Op.ADD, self._lift(0.0))

    # -- primitives -----------------------------------------------------------------------------

    def _unary(self, op: Op) -> Tensor:
        return self._fold(op, (self,)) or Tensor(self.graph, self.graph.add(op, (self.node,), (self.view,), self.shape))

    def _binary(self, op: Op, other) -> Tensor:
        other = self._lift(other)
        shape = tuple(np.broadcast_shapes(self.shape, other.shape))
        a, b = self.broadcast_to(shape), other.broadcast_to(shape)
        return self._fold(op, (a, b)) or Tensor(self.graph, self.graph.add(op, (a.node, b.node), (a.view, b.view), shape))

    def _fold(self, op: Op, operands: tuple[Tensor, ...]) -> Tensor | None:
        """Constant folding: an elementwise op of literals is a literal (never of weights, which
        are bound when a plan is loaded)."""
        if not all(t.node.is_scalar_const or (t.node.op is Op.CONST and t.node.arg.startswith(LITERAL_PREFIX))
                   for t in operands):
            return None
        arrays = [read_view(np.asarray(t.node.arg if t.node.is_scalar_const else self.graph.tensors[t.node.arg],
                                       np.float32).reshape(t.node.shape), t.view) for t in operands]
        value = run_node(Node(op, (), (), operands[0].shape), arrays, {})
        if value.size and np.all(value == value.flat[0]):
            return Tensor.full(self.graph, float(value.flat[0]), value.shape)
        name = f"{LITERAL_PREFIX}folded{len(self.graph.nodes)}"
        return Tensor.constant(self.graph, name, value)

    def _reduce(self, op: Op, axis: int, keepdim: bool) -> Tensor:
        axis = _normalize_axis(axis, self.ndim)
        shape = tuple(1 if d == axis else size for d, size in enumerate(self.shape))
        out = Tensor(self.graph, self.graph.add(op, (self.node,), (self.view,), shape, arg=axis))
        return out if keepdim else out.squeeze(axis)

    def exp2(self) -> Tensor:
        return self._unary(Op.EXP2)

    def log2(self) -> Tensor:
        return self._unary(Op.LOG2)

    def sin(self) -> Tensor:
        return self._unary(Op.SIN)

    def recip(self) -> Tensor:
        return self._unary(Op.RECIP)

    def sqrt(self) -> Tensor:
        return self._unary(Op.SQRT)

    def __add__(self, other) -> Tensor:
        return self._binary(Op.ADD, other)

    def __mul__(self, other) -> Tensor:
        return self._binary(Op.MUL, other)

    def __mod__(self, other) -> Tensor:
        return self._binary(Op.MOD, other)

    def __lt__(self, other) -> Tensor:
        return self._binary(Op.LESS_THAN, other)

    def sum(self, axis: int | Sequence[int], keepdim: bool = False) -> Tensor:
        axes = sorted((_normalize_axis(a, self.ndim) for a in ([axis] if isinstance(axis, int) else axis)), reverse=True)
        out = self
        for a in axes:  # one primitive per axis, from the last so that indices stay valid
            out = out._reduce(Op.SUM, a, keepdim)
        return out

    def max(self, axis: int, keepdim: bool = False) -> Tensor:
        return self._reduce(Op.MAX, axis, keepdim)

    # -- high level, in primitives --------------------------------------------------------------

    __radd__ = __add__
    __rmul__ = __mul__

    def __neg__(self) -> Tensor:
        return self * -1.0

    def __sub__(self, other) -> Tensor:
        return self + (-self._lift(other))

    def __rsub__(self, other) -> Tensor:
        return self._lift(other) + (-self)

    def __truediv__(self, other) -> Tensor:
        if not isinstance(other, Tensor):
            return self * (1.0 / float(other))
        return self * other.recip()

    def __rtruediv__(self, other) -> Tensor:
        return self.recip() * other

    def __gt__(self, other) -> Tensor:
        return self._lift(other) < self

    def exp(self) -> Tensor:
        return (self * LOG2_E).exp2()

    def log(self) -> Tensor:
        return self.log2() * LN_2

    def where(self, if_true, if_false) -> Tensor:
        """self is a 0/1 condition. c*a + (1-c)*b, never b + c*(a-b): that would lose a next to a
        huge b (masked scores)."""
        return self * if_true + (1.0 - self) * if_false

    def eq(self, other) -> Tensor:
        return 1.0 - (self < other) - (self > other)

    def maximum(self, other) -> Tensor:
        return (self < other).where(other, self)

    def minimum(self, other) -> Tensor:
        return (self < other).where(self, other)

    def relu(self) -> Tensor:
        return self.maximum(0.0)

    def sign(self) -> Tensor:
        return (0.0 < self) - (self < 0.0)

    def abs(self) -> Tensor:
        return self * self.sign()

    def clamp(self, low: float | None = None, high: float | None = None) -> Tensor:
        out = self
        if low is not None:
            out = out.maximum(low)
        if high is not None:
            out = out.minimum(high)
        return out

    def log1p(self) -> Tensor:
        return (self + 1.0).log()

    def square(self) -> Tensor:
        return self * self

    def tanh(self) -> Tensor:
        return 1.0 - 2.0 / ((self * 2.0).exp() + 1.0)

    def erf(self) -> Tensor:
        """Abramowitz & Stegun 7.1.26, |error| < 1.5e-7: a rational polynomial and one exp."""
        x = self.abs()
        t = 1.0 / (x * 0.3275911 + 1.0)
        poly = ((((t * 1.061405429 - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
        return self.sign() * (1.0 - poly * (-(x * x)).exp())

    def gelu(self, approximate: str = "none") -> Tensor:
        if approximate == "tanh":
            inner = (self + self * self * self * 0.044715) * math.sqrt(2.0 / math.pi)
            return self * 0.5 * (inner.tanh() + 1.0)
        return self * 0.5 * ((self * (1.0 / math.sqrt(2.0))).erf() + 1.0)

    def mean(self, axis: int | Sequence[int], keepdim: bool = False) -> Tensor:
        axes = [axis] if isinstance(axis, int) else list(axis)
        count = prod(self.shape[_normalize_axis(a, self.ndim)] for a in axes)
        return self.sum(axes, keepdim) * (1.0 / count)

    def var(self, axis: int, keepdim: bool = False, correction: int = 0) -> Tensor:
        centered = self - self.mean(axis, keepdim=True)
        count = self.shape[_normalize_axis(axis, self.ndim)]
        return centered.square().sum(axis, keepdim) * (1.0 / (count - correction))

    def softmax(self, axis: int = -1) -> Tensor:
        e = (self - self.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def layer_norm(self, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
        """Over the last dim, biased variance, as torch."""
        centered = self - self.mean(-1, keepdim=True)
        out = centered * (centered.square().mean(-1, keepdim=True) + eps).sqrt().recip()
        if weight is not None:
            out = out * weight
        if bias is not None:
            out = out + bias
        return out

    def matmul(self, other: Tensor) -> Tensor:
        """(..., M, K) @ (..., K, N): expand both to (..., M, N, K), multiply, sum over K."""
        a = self.unsqueeze(0) if self.ndim == 1 else self
        b = other.unsqueeze(-1) if other.ndim == 1 else other
        M, K = a.shape[-2:]
        N = b.shape[-1]
        if b.shape[-2] != K:
            raise ValueError(f"matmul of {self.shape} and {other.shape}: inner sizes differ")
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        a = a.reshape(a.shape[:-1] + (1, K)).broadcast_to(batch + (M, N, K))  # (..., M, N, K)
        b = b.transpose(-1, -2).reshape(b.shape[:-2] + (1, N, K)).broadcast_to(batch + (M, N, K))
        out = (a * b).sum(-1)  # (..., M, N)
        if self.ndim == 1:
            out = out.squeeze(-2)
        if other.ndim == 1:
            out = out.squeeze(-1)
        return out

    __matmul__ = matmul

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        out = self.matmul(weight.transpose(0, 1))
        return out if bias is None else out + bias

    def embedding(self, ids: Tensor) -> Tensor:
        """self is a (V, C) table: rows at `ids`, shape ids.shape + (C,)."""
        shape = ids.shape + self.shape[1:]
        node = self.graph.add(Op.GATHER, (self.node, ids.node), (self.view, ids.view), shape)
        return Tensor(self.graph, node)

    def masked_fill(self, mask: Tensor, value: float) -> Tensor:
        return mask.where(value, self)

    def cumsum(self, axis: int) -> Tensor:
        """A product with an upper-triangular 0/1 literal T (T[j, i] = j <= i) over the axis moved
        last: L² multiply-adds per row of length L instead of L, and an L×L literal in the plan, in
        exchange for no new primitive (a scan would be one) and the matmul's kernels. Fine for the
        sequence lengths of this project (hundreds), not for an axis of many thousands."""
        axis = _normalize_axis(axis, self.ndim)
        length = self.shape[axis]
        upper = literal(self.graph, "triangle", np.triu(np.ones((length, length), np.float32)))
        return self.transpose(axis, -1).matmul(upper).transpose(axis, -1)


def cat(tensors: Sequence[Tensor], axis: int) -> Tensor:
    """Each part padded with zeros to the full length along `axis`, then added."""
    axis = _normalize_axis(axis, tensors[0].ndim)
    total = sum(t.shape[axis] for t in tensors)
    out, start = None, 0
    for t in tensors:
        pads = [(0, 0)] * t.ndim
        pads[axis] = (start, total - start - t.shape[axis])
        start += t.shape[axis]
        part = t.pad(pads)
        out = part if out is None else out + part
    return out


def attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """softmax(q kᵀ · scale, masked) v over (..., L, D) × (..., S, D); `key_mask` 0/1 broadcasts to (..., L, S)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = q.matmul(k.transpose(-1, -2)) * scale  # (..., L, S)
    if key_mask is not None:
        scores = key_mask.where(scores, MASKED)
    return scores.softmax(-1).matmul(v)


def mark_output(graph: Graph, name: str, tensor: Tensor) -> None:
    """Make `tensor` the graph output `name`: a node of its own, never an alias of a leaf."""
    node = tensor.contiguous()
    taken = set(graph.outputs.values())
    if not node.view.is_identity or node.node.op in LEAF or node.node in taken:
        # Built directly, not `node + 0.0`: that folds a literal (an arange, a filled tensor) into
        # another literal, a leaf no kernel writes, and the caller's output array stays unwritten.
        zero = Tensor.full(graph, 0.0, node.shape)
        node = Tensor(graph, graph.add(Op.ADD, (node.node, zero.node), (node.view, zero.view), node.shape))
    graph.outputs[name] = node.node
    graph.output_shapes[name] = tensor.shape


# -- literals -------------------------------------------------------------------------------------


def literal(graph: Graph, kind: str, values: np.ndarray) -> Tensor:
    """A constant that belongs to the graph (positions, one-hot patterns), named after what it is
    and the node count, so that every literal of one lowering gets its own name."""
    return Tensor.constant(graph, f"{LITERAL_PREFIX}{kind}{len(graph.nodes)}", values)


def positions(graph: Graph, length: int) -> Tensor:
    """0, 1, …, length - 1 as a literal."""
    return literal(graph, "positions", np.arange(length, dtype=np.float32))


def literal_value(tensor: Tensor) -> np.ndarray | None:
    """The values of a tensor known while lowering (a literal or a scalar), else None (an input, a
    weight bound later, anything computed)."""
    node = tensor.node
    if node.is_scalar_const:
        source = np.float32(node.arg)
    elif node.op is Op.CONST and node.arg.startswith(LITERAL_PREFIX):
        source = tensor.graph.tensors[node.arg]
    else:
        return None
    return read_view(np.asarray(source, np.float32).reshape(node.shape), tensor.view)


# -- convolution ----------------------------------------------------------------------------------


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int],
         padding: Sequence[tuple[int, int]], dilation: Sequence[int], groups: int = 1) -> Tensor:
    """An n-d convolution of x (N, C, *spatial) by weight (O, C / groups, *kernel), by im2col in
    views: x padded with zeros (a masked view), each spatial axis unfolded into (output position,
    kernel offset) windows, and the patches contracted with the weight by the matmul (a sum of a
    product over C / groups · kernel elements). That contraction reads the windows as one axis,
    which no single view can say: the patches are copied once (the im2col matrix, kernel-size times
    the input; a 1×1 kernel without stride stays a view), and with padding the padded input before
    that (see `unfold`). The matrix is (C/G·K, P), output positions last: the filters times it is
    a plain matmul whose right operand is contiguous along its output row, as a linear layer's
    weight is once stored (in, out); the copy's index stays affine (the transposed matrix was
    re-copied by the layout pass through a flat index, six divisions per element)."""
    spatial = x.ndim - 2
    kernel = weight.shape[2:]
    if any(before or after for before, after in padding):
        x = x.pad(((0, 0), (0, 0)) + tuple(padding))
    for d in range(spatial):
        x = x.unfold(2 + d, kernel[d], stride[d], dilation[d])  # (N, C, *out, *kernel) once all are done
    batch, channels = x.shape[:2]
    out_sizes = x.shape[2:2 + spatial]
    patches = x.reshape((batch, groups, channels // groups) + x.shape[2:])  # (N, G, C/G, *out, *kernel)
    order = (0, 1, 2, *range(3 + spatial, 3 + 2 * spatial), *range(3, 3 + spatial))
    patches = patches.permute(order).reshape(batch, groups, -1, prod(out_sizes))  # (N, G, C/G·K, P)
    filters = weight.reshape(groups, weight.shape[0] // groups, -1)  # (G, O/G, C/G·K)
    out = filters.matmul(patches)  # (N, G, O/G, P): the channels' order, no copy to reshape
    out = out.reshape((batch, weight.shape[0]) + out_sizes)
    if bias is not None:
        out = out + bias.reshape((-1,) + (1,) * spatial)
    return out


def pool(x: Tensor, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int], reduce: str) -> Tensor:
    """Max or sum pooling of x (N, C, *spatial): each spatial axis unfolded into (output position,
    kernel offset) windows, as `conv` does, and the kernel axes reduced ("max" or "sum"). Views
    only without padding; padding counts as zero in a sum and never wins a max (MASKED there,
    picked by a padded 0/1 pattern of the input's extent)."""
    spatial = len(kernel)
    pads = ((0, 0), (0, 0)) + tuple((p, p) for p in padding)
    if any(padding):
        padded = x.pad(pads)
        x = Tensor.full(x.graph, 1.0, x.shape).pad(pads).where(padded, MASKED) if reduce == "max" else padded
    for d in range(spatial):
        x = x.unfold(2 + d, kernel[d], stride[d], dilation[d])  # (N, C, *out, *kernel) once all are done
    if reduce == "sum":
        return x.sum(list(range(2 + spatial, 2 + 2 * spatial)))
    for _ in range(spatial):
        x = x.max(-1)
    return x


# -- indexing: through GATHER, or as a product with a one-hot pattern -----------------------------


def _flat_ids(x: Tensor, indices: Sequence[Tensor | None]) -> tuple[list[int], Tensor]:
    """The indexed axes, and the index tensors broadcast together into one id per element: the
    row-major offset within the indexed axes (negative indices counted from the end)."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    axes = [d for d, ids in enumerate(indices) if ids is not None]
    sizes = [x.shape[d] for d in axes]
    shape = tuple(np.broadcast_shapes(*(indices[d].shape for d in axes)))
    rows = None
    for k, d in enumerate(axes):
        ids = indices[d]
        ids = (ids + (ids < 0.0) * float(x.shape[d])).broadcast_to(shape)
        stride = prod(sizes[k + 1:])
        term = ids * float(stride) if stride != 1 else ids
        rows = term if rows is None else rows + term
    return axes, rows


def _adjacent(axes: list[int]) -> bool:
    return axes == list(range(axes[0], axes[-1] + 1))


def index(x: Tensor, indices: Sequence[Tensor | None]) -> Tensor:
    """x[indices] with integer index tensors (torch's advanced indexing; None keeps an axis whole,
    a negative index counts from the end): the index tensors broadcast together to one row id per
    element, and one GATHER reads those rows of x seen as a table.

    Indexed axes next to each other (x[:, ids]) keep their place: the table is x with every axis
    up to the last indexed one as its rows (a view of a contiguous x), and a row id adds the
    offset of the leading coordinates (a literal). Axes apart (x[a, :, b]) move first and flatten
    into the rows (a copy of x), and the indexed dims come first in the result (numpy's rule)."""
    axes, rows = _flat_ids(x, indices)
    sizes, shape = [x.shape[d] for d in axes], rows.shape
    first, last = axes[0], axes[-1]
    if _adjacent(axes):
        lead, tail = x.shape[:first], x.shape[last + 1:]
        if lead:  # (*lead, *shape): the leading coordinates' offset plus the indexed one
            offsets = np.arange(prod(lead), dtype=np.float32).reshape(lead + (1,) * len(shape)) * prod(sizes)
            rows = rows.reshape((1,) * len(lead) + shape) + literal(x.graph, "offsets", offsets)
        table = x.reshape(prod(x.shape[:last + 1]), prod(tail))
        return table.embedding(rows).reshape(lead + shape + tail)
    rest = [d for d in range(x.ndim) if d not in axes]
    table = x.permute(axes + rest).reshape(prod(sizes), prod(x.shape[d] for d in rest))
    return table.embedding(rows).reshape(shape + tuple(x.shape[d] for d in rest))


def index_put(x: Tensor, indices: Sequence[Tensor | None], values: Tensor, accumulate: bool = False) -> Tensor:
    """x with x[indices] = values (+= with `accumulate`), integer index tensors as in `index`. A
    product with the one-hot pattern of the ids over the indexed positions (N positions, K ids:
    N·K multiply-adds per element of the other axes); a written position keeps none of x. Ids
    that repeat add up (torch leaves which one wins undefined without `accumulate`)."""
    axes, ids = _flat_ids(x, indices)
    rest = [d for d in range(x.ndim) if d not in axes]
    order = list(range(x.ndim)) if _adjacent(axes) else axes + rest
    lead = x.shape[:axes[0]] if _adjacent(axes) else ()
    tail = tuple(x.shape[d] for d in order[len(lead) + len(axes):])
    positions_count, count = prod(x.shape[d] for d in axes), prod(ids.shape)
    blocks = x.permute(order).reshape(lead + (positions_count, prod(tail)))  # (*lead, N, R)
    onehot = positions(x.graph, positions_count).reshape(-1, 1).eq(ids.reshape(1, count))  # (N, K)
    written = values.broadcast_to(lead + ids.shape + tail).reshape(lead + (count, prod(tail)))  # (*lead, K, R)
    added = onehot.matmul(written)  # (*lead, N, R)
    out = blocks + added if accumulate else blocks * (1.0 - onehot.sum(-1, keepdim=True).minimum(1.0)) + added
    out = out.reshape(tuple(x.shape[d] for d in order))
    return out.permute([order.index(d) for d in range(x.ndim)])


def take_along(x: Tensor, axis: int, ids: Tensor) -> Tensor:
    """torch.gather: out[..., i, ...] = x[..., ids[..., i, ...], ...] along `axis`, where the other
    axes of ids are positions in x (ids may be shorter there). One GATHER of single elements: x
    flattened into a (size, 1) table, each element's row its flat offset, ids times the axis's
    stride plus the offset of its other coordinates (a literal)."""
    axis = _normalize_axis(axis, x.ndim)
    strides = [prod(x.shape[d + 1:]) for d in range(x.ndim)]
    offsets = np.zeros(ids.shape, np.float32)
    for d in range(x.ndim):
        if d != axis:
            offsets += (np.arange(ids.shape[d], dtype=np.float32) * strides[d]).reshape(
                (1,) * d + (-1,) + (1,) * (ids.ndim - d - 1))
    rows = ids * float(strides[axis]) + literal(x.graph, "offsets", offsets)
    return x.reshape(-1, 1).embedding(rows).reshape(ids.shape)


def index_add(x: Tensor, axis: int, ids: Tensor, source: Tensor, alpha: float = 1.0) -> Tensor:
    """torch.index_add: source's slices k along `axis` added to x's slices ids[k]. A product with
    the one-hot (K, N) pattern ids[k] == n: K·N multiply-adds per row instead of K, so that
    repeated ids add up with no scatter primitive."""
    axis = _normalize_axis(axis, x.ndim)
    onehot = ids.reshape(-1, 1).eq(positions(x.graph, x.shape[axis]).reshape(1, -1))  # (K, N)
    added = source.transpose(axis, -1).matmul(onehot).transpose(axis, -1)
    return x + (added if alpha == 1 else added * float(alpha))


def scatter_add(x: Tensor, axis: int, ids: Tensor, source: Tensor) -> Tensor:
    """torch.scatter_add: out[..., ids[..., j, ...], ...] += source[..., j, ...] along `axis` (only
    ids' extent of source counts). A sum over j of the one-hot pattern ids[..., j] == n times the
    source: N·J multiply-adds per position of the other axes instead of J."""
    axis = _normalize_axis(axis, x.ndim)
    source = source.shrink([(0, size) for size in ids.shape])
    length = x.shape[axis]
    ids_last, source_last = ids.transpose(axis, -1), source.transpose(axis, -1)  # (..., J)
    onehot = ids_last.unsqueeze(-2).eq(positions(x.graph, length).reshape(length, 1))  # (..., N, J)
    added = (onehot * source_last.unsqueeze(-2)).sum(-1).transpose(axis, -1)  # ids' shape, N along axis
    return x + added.pad([(0, full - size) for full, size in zip(x.shape, added.shape, strict=True)])


def embedding_bag(table: Tensor, ids: Tensor, offsets: Tensor, mode: str, weights: Tensor | None = None,
                  padding_idx: int | None = None, include_last_offset: bool = False) -> Tensor:
    """torch's embedding_bag: the rows of `table` (V, C) at the flat `ids` (N,), reduced per bag
    (sum, mean or max; `weights` scale each row of a sum; rows at `padding_idx` count in no bag;
    an empty bag gives 0). Bag b holds ids[offsets[b]:offsets[b + 1]].

    Bags of one size known while lowering (offsets a literal arange: a 2-d input) are a reshape
    and a reduction. Otherwise a (bags, N) 0/1 membership from the offsets selects the rows: a
    sum is its product with the rows (a matmul, bags·N·C multiply-adds instead of N·C), a max a
    masked max over all N rows."""
    rows = table.embedding(ids)  # (N, C)
    count = ids.shape[0]
    starts = offsets.slice(0, 0, offsets.shape[0] - 1) if include_last_offset else offsets
    bags = starts.shape[0]
    keep = None if padding_idx is None else 1.0 - ids.eq(float(padding_idx))  # (N,)
    # `member` (0/1, shaped like the grouped rows but one column) says which rows count in a bag.
    known = literal_value(offsets)
    size = count // bags if bags and count % bags == 0 else 0
    if known is not None and size and np.array_equal(known[:bags], np.arange(0, count, size)) \
            and (not include_last_offset or known[-1] == count):
        layout = (bags, size, 1)  # a row per id, in its bag
        grouped = rows.reshape(bags, size, -1)  # (bags, L, C)
        member = None
    else:
        layout = (1, count, 1)  # every id, in every bag
        if include_last_offset:
            ends = offsets.slice(0, 1, offsets.shape[0])
        else:  # the next bag's start, and N for the last
            last = Tensor.full(offsets.graph, float(count), (1,))
            ends = cat([offsets.slice(0, 1, bags), last], 0) if bags > 1 else last
        position = positions(table.graph, count).reshape(1, count)
        member = (1.0 - (position < starts.reshape(bags, 1))) * (position < ends.reshape(bags, 1))  # (bags, N)
        member = member.reshape(bags, count, 1)
        grouped = rows.reshape(1, count, -1).broadcast_to((bags,) + rows.shape)  # (bags, N, C)
    if keep is not None:
        member = keep.reshape(layout) if member is None else member * keep.reshape(layout)
    if mode == "max":
        if member is None:
            return grouped.max(1)
        filled = member.where(grouped, MASKED).max(1)
        return filled * (0.0 < member.sum(1))  # an empty bag is 0, not MASKED
    scale = member
    if weights is not None:
        scale = weights.reshape(layout) if scale is None else scale * weights.reshape(layout)
    total = (grouped * scale).sum(1) if scale is not None else grouped.sum(1)
    if mode == "sum":
        return total
    if member is None:
        return total * (1.0 / size)
    return total / member.sum(1).maximum(1.0)
