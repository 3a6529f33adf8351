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
        node = node + 0.0
    graph.outputs[name] = node.node
    graph.output_shapes[name] = tensor.shape
