"""The IR as egglog terms, and back.

One sort, `Term`: a tensor. A node is its op applied to operand terms, and every operand is
`Term.view(source, view_id)`: the source read through the view `views[view_id]` (views stay
opaque numbers in the e-graph; facts about them, such as "has no padding mask" or "composing
these two gives that one", are computed in Python and asserted as relations before a ruleset
runs). `Term.store(x)` marks a buffer written to memory (fusion.py decides whether to keep it).

`to_terms` encodes a graph; `to_graph` builds a new graph from extracted terms, sharing
identical subterms, so that the interpreter can check a ruleset before and after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egglog import EGraph, Expr, String, StringLike, f64, f64Like, i64, i64Like, relation, rule, union
from egglog.deconstruct import get_callable_args, get_callable_fn, get_literal_value

from lumos.compile.ir import Graph, Node, Op, View, contiguous_strides


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


UNARY = {Op.EXP2: Term.exp2, Op.LOG2: Term.log2, Op.SIN: Term.sin, Op.RECIP: Term.recip, Op.SQRT: Term.sqrt}
BINARY = {Op.ADD: Term.add, Op.MUL: Term.mul, Op.MOD: Term.mod, Op.LESS_THAN: Term.less_than}
REDUCE = {Op.SUM: Term.sum, Op.MAX: Term.max}

no_mask = relation("no_mask", i64)
"""The view has no padding mask (an elementwise op commutes with it)."""
identity = relation("identity", i64)
"""The view reads its whole source in order."""
composes = relation("composes", i64, i64, i64)
"""Reading through view a, then through view b, is reading through view c."""
same_shape = relation("same_shape", i64, i64)


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


def to_terms(graph: Graph, stores: set[Node] | None = None) -> Encoding:
    """Every node as a term; nodes in `stores` are wrapped in `Term.store` (a written buffer)."""
    encoding = Encoding(graph)
    for node in graph.nodes:
        operands = [Term.view(encoding.terms[src], i64(encoding.view_id(view, src.shape)))
                    for src, view in zip(node.srcs, node.views, strict=True)]
        if node.op is Op.INPUT:
            term = Term.input(String(node.arg))
        elif node.op is Op.CONST:
            term = Term.num(f64(node.arg)) if node.is_scalar_const else Term.tensor(String(node.arg))
        elif node.op in UNARY:
            term = UNARY[node.op](*operands)
        elif node.op in BINARY:
            term = BINARY[node.op](*operands)
        elif node.op in REDUCE:
            term = REDUCE[node.op](operands[0], i64(node.arg))
        elif node.op is Op.GATHER:
            term = Term.gather(*operands)
        else:
            raise NotImplementedError(node.op)
        if stores is not None and node in stores:
            term = Term.store(term)
        encoding.terms[node] = term
    return encoding


def run(encoding: Encoding, *rulesets, iterations: int = 8) -> tuple[EGraph, dict[str, Term], dict[str, int]]:
    """The graph's outputs in an e-graph, the rulesets run (saturating, or `iterations` rounds);
    returns the e-graph, a handle per output and how often each rule fired."""
    egraph = EGraph()
    roots = {name: egraph.let(f"out_{index}", encoding.terms[node])
             for index, (name, node) in enumerate(encoding.graph.outputs.items())}
    facts = encoding.facts()
    if facts:
        egraph.register(*facts)
    fired: dict[str, int] = {}
    for ruleset_ in rulesets:
        report = egraph.run(ruleset_ * iterations)
        for rule_, count in report.num_matches_per_rule.items():
            if count:
                name = getattr(rule_, "name", None) or str(rule_)
                fired[name] = fired.get(name, 0) + count
    return egraph, roots, fired


def to_graph(encoding: Encoding, extracted: dict[str, Term]) -> Graph:
    """A new graph computing the extracted output terms (constant tensors and inputs carried over)."""
    old = encoding.graph
    graph = Graph(tensors=dict(old.tensors), output_shapes=dict(old.output_shapes), batch=old.batch)
    inputs = {name: graph.add(Op.INPUT, shape=node.shape, arg=name) for name, node in old.inputs.items()}
    for name, node in inputs.items():
        node.batched = old.inputs[name].batched
    graph.inputs = inputs
    tensor_shapes = {node.arg: node.shape for node in old.nodes if node.op is Op.CONST and isinstance(node.arg, str)}
    built: dict[str, Node] = {}

    def operand(term) -> tuple[Node, View]:
        if get_callable_fn(term) == Term.view:
            source, view_id = get_callable_args(term)
            view = encoding.views[get_literal_value(view_id)]
            return node_of(source), view
        node = node_of(term)  # a bare tensor as an operand: read in order
        return node, View.contiguous(node.shape)

    def node_of(term) -> Node:
        key = str(term)
        if key in built:
            return built[key]
        fn, args = get_callable_fn(term), get_callable_args(term)
        if fn == Term.input:
            node = inputs[get_literal_value(args[0])]
        elif fn == Term.tensor:
            name = get_literal_value(args[0])
            node = graph.add(Op.CONST, shape=tensor_shapes[name], arg=name)
        elif fn == Term.num:
            node = graph.scalar(get_literal_value(args[0]))
        elif fn == Term.store:
            node = node_of(args[0])
        elif fn == Term.view:  # a view where a node is needed: a copy (x + 0)
            source, view = operand(term)
            node = graph.add(Op.ADD, (source, graph.scalar(0.0)), (view, View(view.shape, (0,) * len(view.shape))),
                             view.shape)
        else:
            op = next(op for table in (UNARY, BINARY, REDUCE) for op, maker in table.items() if maker == fn) \
                if fn != Term.gather else Op.GATHER
            if op in REDUCE.keys():
                source, view = operand(args[0])
                axis = get_literal_value(args[1])
                shape = tuple(1 if d == axis else size for d, size in enumerate(view.shape))
                node = graph.add(op, (source,), (view,), shape, arg=axis)
            elif op is Op.GATHER:
                (table, table_view), (ids, ids_view) = operand(args[0]), operand(args[1])
                node = graph.add(op, (table, ids), (table_view, ids_view), ids_view.shape + table_view.shape[1:])
            else:
                reads = [operand(arg) for arg in args]
                node = graph.add(op, [s for s, _ in reads], [v for _, v in reads], reads[0][1].shape)
        built[key] = node
        return node

    for name, term in extracted.items():
        graph.outputs[name] = node_of(term)
    return graph
