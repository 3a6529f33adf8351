"""The attention ruleset: softmax by the max-rescaling identity, and online softmax.

softmax(x)_j = exp(x_j - m) / sum_k exp(x_k - m) holds for any m (the max-rescaling identity);
with m the row max it is what the graph computes. Then sum_j softmax(x)_j · v_j can run in one
pass over j with a running max m, running sum l and running output o: when m grows to m',
l ← l·exp(m - m') + exp(x_j - m') and o ← o·exp(m - m') + exp(x_j - m')·v_j; at the end o / l.
Nothing of length j is stored, so attention never writes its (sequence × sequence) score matrix
(render_c.KernelRenderer.render_attention emits the loop).

Rules:
- `softmax (max-shifted)`: exp2((x - max x)·c) / sum exp2((x - max x)·c) → softmax(x, c);
- `online softmax`: sum_j softmax(x, c)_j · v_j → online_softmax(x, v, c).

The e-graph is kept small: one per candidate (a sum of a product), over the few nodes above it;
nodes further up are opaque leaves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from egglog import EGraph, String, f64, i64, ruleset, vars_
from egglog.deconstruct import get_callable_args, get_callable_fn, get_literal_value

from lumos.compile.egraph.terms import Term, named, op_term
from lumos.compile.ir.graph import LEAF, REDUCE, Graph, Node, Op, contiguous_strides, is_product_sum

DEPTH = 10
"""How many producers above a candidate sum go into its e-graph."""

x, e, s, v, m = vars_("x e s v m", Term)
va, vb, vc, vd, ve, vf, vg, vh, vi, vj, vk, vl, vm = vars_("va vb vc vd ve vf vg vh vi vj vk vl vm", i64)
axis, axis2 = vars_("axis axis2", i64)
(c,) = vars_("c", f64)

_max = Term.max(Term.view(x, va), axis)
_shifted = Term.add(Term.view(x, vb), Term.view(Term.mul(Term.view(_max, vc), Term.view(Term.num(f64(-1.0)), vd)), ve))
_exp = Term.exp2(Term.view(Term.mul(Term.view(_shifted, vf), Term.view(Term.num(c), vg)), vh))

attention_rules = ruleset(
    named("softmax (max-shifted)",
          Term.mul(Term.view(_exp, vi), Term.view(Term.recip(Term.view(Term.sum(Term.view(_exp, vj), axis), vk)), vl)),
          Term.softmax(Term.view(x, va), axis, c)),
    named("online softmax",
          Term.sum(Term.view(Term.mul(Term.view(Term.softmax(Term.view(x, va), axis, c), vi), v), vm), axis2),
          Term.online_softmax(Term.view(x, va), v, c)),
    named("online softmax (values first)",
          Term.sum(Term.view(Term.mul(v, Term.view(Term.softmax(Term.view(x, va), axis, c), vi)), vm), axis2),
          Term.online_softmax(Term.view(x, va), v, c)),
)


@dataclass(frozen=True)
class AttentionMatch:
    """sum_j softmax(scores · scale)_j · values_j, as found in the graph."""

    out: Node
    """The sum over j: the attention output (what the fused kernel writes)."""
    product: Node
    """Its operand: probabilities × values."""
    probs_index: int
    """Which operand of `product` is the probabilities."""
    scores: Node
    """x (masked, scaled scores) of which the softmax is taken, over `axis`."""
    axis: int
    scale: float
    """exp(x) = exp2(x · scale)."""
    chain: frozenset[Node]
    """The softmax's own nodes (max, shift, exp, sum, reciprocal, probabilities)."""
    store: Node | None = None
    """The copy that only reorders `out`'s dims, written by the fused kernel in `out`'s place
    (the heads merged back: (B, H, L, D) → (B, L, H, D)); None: the kernel writes `out`."""
    store_strides: tuple[int, ...] = ()
    """With `store`: per dim of `out`, where the copy keeps it (its stride in the copy's buffer)."""
    keys_copy: Node | None = None
    """The stored copy that laid the keys out along the scores' sum (layout.transpose_activations),
    inlined instead: the kernel reads the keys where their producer wrote them and lays out each
    (batch, head)'s keys in a buffer of its own thread (render_c), one pass over memory fewer."""


def find_attention(graph: Graph) -> tuple[list[AttentionMatch], dict[str, int]]:
    """Every sum of a product in `graph` that the attention rules rewrite to online softmax."""
    matches, fired = [], {}
    for node in graph.nodes:
        if not is_product_sum(node):
            continue
        product = node.srcs[0]
        if not any(src.op is Op.MUL and any(s.op is Op.RECIP for s in src.srcs) for src in product.srcs):
            continue  # no normalized probabilities: not worth an e-graph
        found, counts = _match(node)
        for name, count in counts.items():
            fired[name] = fired.get(name, 0) + count
        if found is not None:
            matches.append(found)
    return matches, fired


def _local_terms(root: Node) -> tuple[dict[Node, Term], list[Node]]:
    """Terms for the nodes within DEPTH producers of `root`; farther ones are opaque leaves."""
    depth = {root: 0}
    order = [root]
    for node in order:
        if depth[node] < DEPTH:
            for src in node.srcs:
                if src not in depth:
                    depth[src] = depth[node] + 1
                    order.append(src)
    terms: dict[Node, Term] = {}
    views: dict[object, int] = {}

    def view_id(view) -> i64:
        return i64(views.setdefault(view, len(views)))

    for node in sorted(order, key=lambda n: n.id):
        if node.is_scalar_const:
            terms[node] = Term.num(f64(node.arg))
            continue
        if depth[node] >= DEPTH or node.op in LEAF or node.op is Op.GATHER:
            terms[node] = Term.input(String(f"%{node.id}"))
            continue
        operands = [Term.view(terms[src], view_id(view)) for src, view in zip(node.srcs, node.views, strict=True)]
        terms[node] = op_term(node.op, operands, node.arg)
    return terms, order


def _match(out: Node) -> tuple[AttentionMatch | None, dict[str, int]]:
    terms, nodes = _local_terms(out)
    egraph = EGraph()
    root = egraph.let("root", terms[out])
    report = egraph.run(attention_rules.saturate())
    fired = {getattr(r, "name", None) or str(r): n for r, n in report.num_matches_per_rule.items() if n}
    if not any(name.startswith("online softmax") for name in fired):
        return None, fired
    extracted = egraph.extract(root)
    if get_callable_fn(extracted) != Term.online_softmax:
        return None, fired
    scores_view, _, scale = get_callable_args(extracted)
    scores_term = get_callable_args(scores_view)[0]
    # The scores node is what a MAX reads; only those candidates are printed (egglog formats each
    # term with black: printing every term took 1.5 s on a 2-layer encoder).
    wanted = str(scores_term)
    scores = next((node for node in {n.srcs[0] for n in nodes if n.op is Op.MAX}
                   if node in terms and str(terms[node]) == wanted), None)
    product = out.srcs[0]
    probs_index = next((i for i, src in enumerate(product.srcs) if src.op is Op.MUL and src.srcs and
                        any(s.op is Op.RECIP for s in src.srcs)), None)
    if scores is None or probs_index is None:
        return None, fired
    maxima = [n for n in nodes if n.op is Op.MAX and n.srcs[0] is scores]
    if len(maxima) != 1:
        return None, fired
    probs = product.srcs[probs_index]
    chain = _between(probs, scores)
    return AttentionMatch(out, product, probs_index, scores, maxima[0].arg, float(get_literal_value(scale)),
                          frozenset(chain)), fired


def _between(top: Node, bottom: Node) -> set[Node]:
    """Nodes on paths from `top` down to `bottom` (both ends: top included, bottom not)."""
    memo: dict[Node, bool] = {}

    def reaches(node: Node) -> bool:
        if node is bottom:
            return True
        if node not in memo:
            memo[node] = any([reaches(src) for src in node.srcs])  # a list: every path is explored
        return memo[node]

    reaches(top)
    return {node for node, hit in memo.items() if hit}


def supported(match: AttentionMatch, uses) -> bool:
    """The fused kernel handles one value dim (head size) and needs the softmax's nodes to serve
    only this attention (nothing else reads the probabilities or the maxima)."""
    product, out = match.product, match.out
    view = product.views[match.probs_index]
    value_dims = [d for d, size in enumerate(product.shape) if size > 1 and view.strides[d] == 0 and d != out.arg]
    inside = set(match.chain) | {product}
    return (len(value_dims) == 1 and product.shape[value_dims[0]] <= 1024 and out.arg == len(out.shape) - 1
            and all(consumer in inside for node in match.chain for consumer, _ in uses[node])
            and all(consumer in inside for consumer, _ in uses[match.scores]) and len(uses[product]) == 1)


STAGED_KEYS = 16384
"""Most floats of one (batch, head)'s keys a fused kernel lays out in its thread's buffer (64 KB,
on the stack, next to L2)."""


def fuse_attention(graph: Graph, materialized: set[Node], matches: list[AttentionMatch], stage_keys: bool = False):
    """Kernels with each supported attention computed by one online-softmax kernel: its softmax
    nodes, the scores and what only feeds them (down to the score products) are no longer stored.
    When the attention's only use is a stored copy that reorders its dims (the heads merged back
    into each row), the fused kernel writes that copy directly: one pass over the output fewer.
    With `stage_keys`, a stored copy that only transposes the keys for the scores is inlined too
    (AttentionMatch.keys_copy), where a (batch, head)'s keys fit STAGED_KEYS."""
    from lumos.compile.schedule.kernels import build_kernels

    uses = graph.consumers()
    outputs = set(graph.outputs.values())
    keep = set(materialized)
    used = []
    for match in matches:
        if not supported(match, uses):
            continue
        removed = set(match.chain) | {match.product, match.scores}
        stack = list(match.scores.srcs)
        while stack:
            node = stack.pop()
            if node in removed or node.op in LEAF:
                continue
            if not all(consumer in removed for consumer, _ in uses[node]):
                continue
            removed.add(node)
            if node.op not in REDUCE:  # the score product itself is computed inline, its inputs are not
                stack.extend(node.srcs)
        keep -= removed
        keys_copy = _keys_copy(removed, uses, keep) if stage_keys else None
        if keys_copy is not None:
            keep.discard(keys_copy)
            match = replace(match, keys_copy=keys_copy)
        reordered = None if match.out in outputs else _reordering_copy(match.out, uses, keep)
        if reordered is None:
            keep.add(match.out)
        else:  # the copy's kernel would only move the output's rows: the fused kernel writes them there
            match = replace(match, store=reordered[0], store_strides=reordered[1])
        used.append(match)
    kernels = build_kernels(graph, keep)
    by_out = {match.store or match.out: match for match in used}
    for kernel in kernels:
        kernel.attention = by_out.get(kernel.node)
    return kernels, keep, used


def _copied(node: Node) -> Node | None:
    """What `node` copies when it is x + 0 (a view made a node: hl_ops.contiguous, the layout
    pass), else None."""
    if node.op is not Op.ADD or len(node.srcs) != 2:
        return None
    for source, zero in (node.srcs, node.srcs[::-1]):
        if zero.is_scalar_const and zero.arg == 0.0:
            return source
    return None


def _keys_copy(inlined: set[Node], uses, materialized: set[Node]) -> Node | None:
    """The stored copy (x + 0) of a stored tensor that one of the scores' dot products reads and
    nothing else does, when a (batch, head)'s slice of it (its last two dims: the sum, then the keys) fits
    STAGED_KEYS; else None."""
    for node in inlined:
        if not is_product_sum(node):
            continue
        product = node.srcs[0]
        for copy in product.srcs:
            source = _copied(copy)
            if (source is not None and copy in materialized and (source in materialized or source.op is Op.INPUT)
                    and len(copy.shape) >= 2 and copy.shape[-1] * copy.shape[-2] <= STAGED_KEYS
                    and all(consumer is product for consumer, _ in uses[copy])):
                return copy
    return None


def _reordering_copy(out: Node, uses, materialized: set[Node]) -> tuple[Node, tuple[int, ...]] | None:
    """`out`'s only consumer, when it is a stored copy (x + 0) that reads every element of `out`
    once with its dims reordered, and, per dim of `out`, the copy's stride for it; else None."""
    if len(uses[out]) != 1:
        return None
    copy, index = uses[out][0]
    view = copy.views[index]
    if (_copied(copy) is not out or copy not in materialized or view.mask is not None or view.offset != 0
            or copy.size != out.size):
        return None
    copy_strides = contiguous_strides(copy.shape)
    where = {stride: (size, copy_strides[d]) for d, (size, stride) in enumerate(zip(copy.shape, view.strides, strict=True))
             if size > 1}
    strides = []
    for size, stride in zip(out.shape, contiguous_strides(out.shape), strict=True):
        if size == 1:
            strides.append(0)
        elif where.get(stride, (None,))[0] != size:
            return None
        else:
            strides.append(where.pop(stride)[1])
    if where or (out.batched and strides[0] != copy_strides[0]):  # the batch dim stays outermost
        return None
    return copy, tuple(strides)
