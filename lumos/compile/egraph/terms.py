"""The IR as egglog terms, and back.

One sort, `Term`: a tensor. A node is its op applied to operand terms, and every operand is
`Term.view(source, view_id)`: the source read through the view `views[view_id]` (views stay
opaque numbers in the e-graph; facts about them, such as "has no padding mask" or "composing
these two gives that one", are computed in Python and asserted as relations before a ruleset
runs). `Term.store(x)` marks a buffer written to memory (fusion.py decides whether to keep it).

`to_terms` encodes a graph; extract.py reads the cheapest program back out of an e-graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egglog import Expr, String, StringLike, f64, f64Like, i64, i64Like, relation, rule, union

from lumos.compile.ir.graph import LEAF, OPS, REDUCE, Graph, Node, Op, View, contiguous_strides


class Term(Expr):
    @classmethod
    def input(cls, name: StringLike) -> Term: ...

    @classmethod
    def tensor(cls, name: StringLike) -> Term: ...

    @classmethod
    def num(cls, value: f64Like) -> Term: ...

    @classmethod
    def view(cls, source: Term, view: i64Like) -> Term: ...

    @classmethod
    def store(cls, value: Term) -> Term: ...

    @classmethod
    def exp2(cls, x: Term) -> Term: ...

    @classmethod
    def log2(cls, x: Term) -> Term: ...

    @classmethod
    def sin(cls, x: Term) -> Term: ...

    @classmethod
    def recip(cls, x: Term) -> Term: ...

    @classmethod
    def sqrt(cls, x: Term) -> Term: ...

    @classmethod
    def add(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def mul(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def mod(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def less_than(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def sum(cls, x: Term, axis: i64Like) -> Term: ...

    @classmethod
    def max(cls, x: Term, axis: i64Like) -> Term: ...

    @classmethod
    def gather(cls, table: Term, ids: Term) -> Term: ...

    @classmethod
    def softmax(cls, x: Term, axis: i64Like, scale: f64Like) -> Term:
        """exp2(x · scale) / sum over `axis` of the same (shifted by any constant: the same value)."""

    @classmethod
    def online_softmax(cls, scores: Term, values: Term, scale: f64Like) -> Term:
        """sum_j softmax_j(scores · scale) · values_j, computed in one pass with a running max
        (attention.py): the score row is never stored."""


def _constructor(op: Op):
    constructor = getattr(Term, OPS[op].term, None)
    if constructor is None:
        raise NotImplementedError(f"Term has no constructor {OPS[op].term!r} for Op.{op.name}: declare it above")
    return constructor


CONSTRUCTORS = {op: _constructor(op) for op in Op if op not in LEAF}
"""Each non-leaf op's term constructor, named in ir/ops.py's table (a leaf is encoded from its arg)."""


def op_term(op: Op, operands: list[Term], arg=None) -> Term:
    """The term of a non-leaf op on its operands' terms; a reduction's axis (`arg`) comes last."""
    if op in REDUCE:
        return CONSTRUCTORS[op](operands[0], i64(arg))
    return CONSTRUCTORS[op](*operands)

no_mask = relation("no_mask", i64)
"""The view has no padding mask (an elementwise op commutes with it)."""
identity = relation("identity", i64)
"""The view reads its whole source in order."""
composes = relation("composes", i64, i64, i64)
"""Reading through view a, then through view b, is reading through view c."""
same_shape = relation("same_shape", i64, i64)
original = relation("original", Term, i64)
"""The term is (equivalent to) the node of this id in the encoded graph (extract.py reads it back)."""


def named(name: str, lhs: Term, rhs: Term, *conditions):
    """The rewrite lhs → rhs under `conditions`, under a name that `--explain` reports."""
    return rule(lhs, *conditions, name=name).then(union(lhs).with_(rhs))


@dataclass
class Encoding:
    """A graph as terms: one term per node, the views by id, the shape each view reads."""

    graph: Graph
    views: list[View] = field(default_factory=list)
    source_shapes: list[tuple[int, ...]] = field(default_factory=list)
    terms: dict[Node, Term] = field(default_factory=dict)
    _view_ids: dict[tuple, int] = field(default_factory=dict)

    def view_id(self, view: View, source_shape: tuple[int, ...]) -> int:
        key = (view, source_shape)
        if key not in self._view_ids:
            self._view_ids[key] = len(self.views)
            self.views.append(view)
            self.source_shapes.append(source_shape)
        return self._view_ids[key]

    def facts(self) -> list:
        """What the rulesets may assume about the views (computed here, asserted as relations)."""
        facts = []
        for index, view in enumerate(self.views):
            if view.mask is None:
                facts.append(no_mask(i64(index)))
                if view.is_identity and view.shape == self.source_shapes[index]:
                    facts.append(identity(i64(index)))
        known = list(enumerate(self.views))
        for a, first in known:
            for b, second in known:
                if first.shape == second.shape and self.source_shapes[a] == self.source_shapes[b]:
                    facts.append(same_shape(i64(a), i64(b)))
                if self.source_shapes[b] != first.shape:
                    continue
                composed = compose(first, self.source_shapes[a], second)
                if composed is not None:
                    facts.append(composes(i64(a), i64(b), i64(self.view_id(composed, self.source_shapes[a]))))
        return facts


def compose(first: View, source_shape: tuple[int, ...], second: View) -> View | None:
    """Reading a contiguous tensor of `first.shape` through `second`, where that tensor is
    `source` read through `first`, as one view of `source`; None when no single view can say it."""
    if first.mask is not None or second.mask is not None:
        return None
    inner = contiguous_strides(first.shape)
    offset, rest = first.offset, second.offset
    start = [0] * len(first.shape)
    for d, (size, stride, step) in enumerate(zip(first.shape, inner, first.strides, strict=True)):
        if size > 1:
            start[d], rest = divmod(rest, stride)
            offset += start[d] * step
    if rest:
        return None
    strides, reach = [], list(start)
    for size, stride in zip(second.shape, second.strides, strict=True):
        if stride == 0 or size == 1:
            strides.append(0)
            continue
        dims = [d for d in range(len(first.shape)) if first.shape[d] > 1 and inner[d] <= stride
                and stride % inner[d] == 0 and stride // inner[d] < first.shape[d]]
        if len(dims) != 1:
            return None
        reach[dims[0]] += (size - 1) * (stride // inner[dims[0]])
        strides.append(stride // inner[dims[0]] * first.strides[dims[0]])
    if any(last >= size for last, size in zip(reach, first.shape, strict=True)):
        return None  # a step would carry into the next dim
    composed = View(second.shape, tuple(strides), offset)
    return composed if _span(composed) <= max(1, _size(source_shape)) else None


def _size(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def _span(view: View) -> int:
    return view.offset + sum((size - 1) * stride for size, stride in zip(view.shape, view.strides, strict=True)) + 1


def to_terms(graph: Graph, stores: set[Node] | None = None, bind=None) -> Encoding:
    """Every node as a term; nodes in `stores` are wrapped in `Term.store` (a written buffer).
    With `bind` (node, term → term), each node's term is what `bind` returns: an `EGraph.let`
    keeps terms shallow (a nested term is expanded as a tree, exponential in shared subterms)."""
    encoding = Encoding(graph)
    for node in graph.nodes:
        operands = [Term.view(encoding.terms[src], i64(encoding.view_id(view, src.shape)))
                    for src, view in zip(node.srcs, node.views, strict=True)]
        if node.op is Op.INPUT:
            term = Term.input(String(node.arg))
        elif node.op is Op.CONST:
            term = Term.num(f64(node.arg)) if node.is_scalar_const else Term.tensor(String(node.arg))
        else:
            term = op_term(node.op, operands, node.arg)
        if stores is not None and node in stores:
            term = Term.store(term)
        encoding.terms[node] = term if bind is None else bind(node, term)
    return encoding
