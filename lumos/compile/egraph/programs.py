"""Fusion as e-graph rewrites: every buffer a program could write, and every way to fuse it away.

fusion.py starts from the scheduler's program and only offers to store what it fused. Here the
e-graph starts from no fusion at all: every computed node is `Term.store(x)`, a kernel of its own.
The rules put the fused form beside each read of a store, under facts computed from schedule/
(kernels.py's legality rules, asserted as relations):

- fuse producer into consumer: `view(store(x), v)` → `view(x, v)` where `may_inline(store(x))`,
  i.e. where no rule of the scheduler forces the buffer (graph outputs, broadcast reads that are
  not row-wise, gather tables, reductions read through padding);
- recompute instead of store: the same rewrite for a node with several consumers (`shared`): each
  consumer computes it again, instead of one kernel writing it and the others reading it;
- siblings: kernels that reduce the same rows of a common buffer into outputs of the same shape
  are `joinable` (one kernel with several outputs, schedule/siblings.py), derived by a rule over
  kernel-level facts (what each kernel reads, which kernels are row statistics, the order);
- products: kernels that each multiply the same value, read the same way, by a weight of their
  own (a query/key/value projection) are `products_joinable` (one tiled matmul with an output
  each, schedule/products.py: CUDA target), by a rule over the same kind of facts.

A program is one extraction. The scheduler's program (`choose_materialized`) is the extraction
that prices its own buffers as free reads and every other store out of reach; others price the
buffers differently (`EXTRACTIONS`): all the fusion legality allows, or memory traffic against
recomputation. What they store differently from the scheduler is a *proposal*; the genome of
search/genome.py is one gene per family of proposals (identical layers flip together), and
the hill-climb there measures which to keep.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field

from egglog import EGraph, Expr, i64, i64Like, relation, rule, ruleset, vars_

from lumos.compile.egraph.extract import ENode, Serialized, choose, default_cost, encode, serialize, stored_nodes
from lumos.compile.egraph.terms import Encoding, Term, named
from lumos.compile.ir.graph import LEAF, REDUCE, UNARY, Graph, Node
from lumos.compile.schedule.kernels import Kernel, materialized_and_forced

(x,) = vars_("x", Term)
(v,) = vars_("v", i64)

may_inline = relation("may_inline", Term)
"""No legality rule of the scheduler forces this store: its consumers may compute it themselves."""
shared = relation("shared", Term)
"""The store has several consumers: inlining it recomputes it in each."""

program_rules = ruleset(
    named("fuse producer into consumer", Term.view(Term.store(x), v), Term.view(x, v), may_inline(Term.store(x))),
    named("recompute instead of store", Term.view(Term.store(x), v), Term.view(x, v),
          may_inline(Term.store(x)), shared(Term.store(x))),
)


# ---------------------------------------------------------------------------------------------
# Sibling kernels: a rule over kernel-level facts (a kernel is its index in the program).


class Launch(Expr):
    def __init__(self, index: i64Like) -> None: ...


reads_buffer = relation("reads_buffer", i64, i64)
"""Kernel a reads the buffer of node id b."""
row_statistic = relation("row_statistic", i64)
"""The kernel is a plain reduction (no matrix product, no attention): schedule/siblings.py."""
may_follow = relation("may_follow", i64, i64)
"""Kernel b may move up to kernel a's place: same output shape, reads nothing written between."""
joinable = relation("joinable", i64, i64)

a, b, buffer = vars_("a b buffer", i64)
sibling_rules = ruleset(
    rule(row_statistic(a), row_statistic(b), may_follow(a, b), reads_buffer(a, buffer), reads_buffer(b, buffer),
         name="siblings: one kernel for reductions of the same rows").then(joinable(a, b)),
)


def sibling_pairs(kernels: list[Kernel]) -> tuple[list[tuple[Kernel, Kernel]], dict[str, int]]:
    """The pairs (earlier, later) of kernels the sibling rule finds joinable, and its matches.
    Whether the joined kernel reads the earlier output only in place is checked when it is built
    (join_siblings' `lowers`)."""
    from lumos.compile.schedule.siblings import _row_statistic

    written_at = {node: position for position, kernel in enumerate(kernels) for node in kernel.outputs}
    facts = []
    for index, kernel in enumerate(kernels):
        facts += [reads_buffer(i64(index), i64(node.id)) for node in kernel.reads]
        if _row_statistic(kernel):
            facts.append(row_statistic(i64(index)))
    following = []
    for first, earlier in enumerate(kernels):
        for later in range(first + 1, len(kernels)):
            kernel = kernels[later]
            if kernel.node.shape == earlier.node.shape and not any(
                    written_at.get(node, -1) > first and node not in earlier.outputs for node in kernel.reads):
                following.append((first, later))
    facts += [may_follow(i64(first), i64(later)) for first, later in following]
    egraph = EGraph()
    if facts:
        egraph.register(*facts)
    report = egraph.run(sibling_rules.saturate())
    pairs = [(kernels[first], kernels[later]) for first, later in following
             if _holds(egraph, joinable(i64(first), i64(later)))]
    fired = {getattr(r, "name", None) or str(r): n for r, n in report.num_matches_per_rule.items() if n}
    return pairs, fired


# ---------------------------------------------------------------------------------------------
# Matrix products of one value: a rule over kernel-level facts, as for siblings.


weight_product = relation("weight_product", i64, i64, i64)
"""(a, value, read): kernel a is one matrix product of a weight of its own by the node `value`,
read the way numbered `read` (schedule/products.py: product_read; the same number, the same
operand position, view and output shape, each but the width)."""
runs_beside = relation("runs_beside", i64, i64)
"""(a, b): kernel b may run at kernel a's place: it reads nothing written from a (a's own output
included) up to b, so neither depends on the other."""
products_joinable = relation("products_joinable", i64, i64)

value, read = vars_("value read", i64)
product_rules = ruleset(
    rule(weight_product(a, value, read), weight_product(b, value, read), runs_beside(a, b),
         name="products: one kernel for matrix products of one value").then(products_joinable(a, b)),
)


def weight_products(kernels: list[Kernel]) -> dict[int, tuple[int, int]]:
    """Each kernel of one weight product, by index: (its value's node id, the number of its read)."""
    from lumos.compile.schedule.products import product_read

    reads: dict[tuple, int] = {}
    products = {}
    for index, kernel in enumerate(kernels):
        found = product_read(kernel)
        if found is not None:
            node, how = found
            products[index] = (node.id, reads.setdefault(how, len(reads)))
    return products


def product_facts(kernels: list[Kernel], products: dict[int, tuple[int, int]]) -> list:
    """The facts the products rule matches: each weight product's value and read, and which of
    them may run beside an earlier one."""
    facts = [weight_product(i64(index), i64(node), i64(how)) for index, (node, how) in products.items()]
    written_at = {node: position for position, kernel in enumerate(kernels) for node in kernel.outputs}
    for first in products:
        for later in products:
            if first < later and not any(first <= written_at.get(node, -1) < later for node in kernels[later].reads):
                facts.append(runs_beside(i64(first), i64(later)))
    return facts


def product_pairs(kernels: list[Kernel], rules=product_rules) -> tuple[list[tuple[Kernel, Kernel]], dict[str, int]]:
    """The pairs (earlier, later) of kernels the products rule finds joinable, and its matches.
    Whether a joined kernel maps to one tiled matmul is checked when it is built (join_products'
    `lowers`). `rules`: the ruleset to run (a test runs a broken one)."""
    products = weight_products(kernels)
    facts = product_facts(kernels, products)
    egraph = EGraph()
    if facts:
        egraph.register(*facts)
    report = egraph.run(rules.saturate())
    pairs = [(kernels[first], kernels[later]) for first in products for later in products
             if first < later and _holds(egraph, products_joinable(i64(first), i64(later)))]
    fired = {getattr(r, "name", None) or str(r): n for r, n in report.num_matches_per_rule.items() if n}
    return pairs, fired


def _holds(egraph: EGraph, fact) -> bool:
    try:
        egraph.check(fact)
    except Exception:  # egglog raises when the fact does not hold
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The fusion e-graph and its extractions


STORE_READ = 0.001
"""Reading a buffer the extraction keeps costs next to nothing, whatever computed it."""
MEMORY_COST = 2.0
"""Per element of a stored buffer: written once, read back (the memory-traffic extraction)."""
OP_COST = 0.25
"""Per element of an inlined elementwise op; a 2^x, log, sine, reciprocal or square root: 1.
Elementwise kernels on the CPU are bound by memory: a few ops recomputed cost less than a buffer."""


@dataclass
class ProgramSpace:
    """The e-graph of every fusion, the scheduler's program in it, and the buffers no program may
    inline (its legality facts)."""

    graph: Graph
    encoding: Encoding
    serialized: Serialized
    heuristic: set[Node]
    forced: set[Node]
    rules: dict[str, int]
    seconds: float

    def stores(self, keep: set[Node]) -> set[Node]:
        """The buffers of the program that keeps the stores of `keep` (each a cheap read) and
        prices every other store out of reach."""
        allowed = {self.serialized.originals[node.id] for node in keep}

        def priced(enode: ENode) -> float:
            if enode.op == "Term.store":
                return STORE_READ if enode.eclass in allowed else math.inf
            return default_cost(enode)

        chosen = choose(self.serialized, priced, cut=("Term.store",))
        stored = stored_nodes(self.serialized, chosen, self.encoding.graph.nodes, self.graph.outputs.values())
        return {node for node in stored if node.op not in LEAF}

    def fuse_all_keep(self) -> set[Node]:
        """The stores that fusing everything legal still keeps: the forced ones, and a node with
        several consumers whose inlined form holds a reduction (never recomputed)."""
        uses = self.graph.consumers()
        keep, reduces = set(self.forced), {}
        for node in self.graph.nodes:
            reduces[node] = node.op in REDUCE or any(reduces[src] for src in node.srcs if src not in keep)
            if node.op not in LEAF and reduces[node] and len(uses[node]) > 1:
                keep.add(node)
        return keep

    def traffic_keep(self) -> set[Node]:
        """The stores that memory traffic against recomputation prices as worth keeping: a node
        with several consumers is stored when recomputing it for all but one costs more than
        writing and reading it back; a node with one consumer is fused (tree costs over the
        e-graph cannot price this: a store's producer runs once, however many read it)."""
        uses = self.graph.consumers()
        keep, cone = set(self.forced), {}
        for node in self.graph.nodes:
            if node.op in LEAF:
                cone[node] = 0.0
                continue
            own = node.size * (1.0 if node.op in UNARY or node.op in REDUCE else OP_COST)
            cone[node] = own + sum(cone[src] for src in node.srcs if src not in keep)
            if len(uses[node]) > 1 and (len(uses[node]) - 1) * cone[node] > MEMORY_COST * node.size:
                keep.add(node)
        return keep

    def extractions(self) -> dict[str, set[Node]]:
        """Each named extraction's buffers: the scheduler's, all fusion legal (no reduction
        recomputed), and memory traffic against recomputation."""
        return {"scheduler": self.stores(self.heuristic),
                "fuse all legal": self.stores(self.fuse_all_keep()),
                "memory traffic": self.stores(self.traffic_keep())}


def program_space(graph: Graph, recompute_cheap: bool = True) -> ProgramSpace:
    started = time.perf_counter()
    heuristic, forced = materialized_and_forced(graph, recompute_cheap)
    computed = {node for node in graph.nodes if node.op not in LEAF}
    uses = graph.consumers()
    egraph = EGraph()
    encoding = encode(egraph, graph, computed)
    facts = []
    for node in computed - forced:
        facts.append(may_inline(encoding.terms[node]))
        if len(uses[node]) > 1:
            facts.append(shared(encoding.terms[node]))
    if facts:
        egraph.register(*facts)
    report = egraph.run(program_rules.saturate())
    serialized = serialize(egraph)
    rules = {getattr(r, "name", None) or str(r): n for r, n in report.num_matches_per_rule.items() if n}
    return ProgramSpace(graph, encoding, serialized, heuristic, forced, rules, time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------
# Proposals: what an extraction stores differently from the scheduler, by family


def family(node: Node) -> str:
    """Identical nodes of identical layers: the same op, shape, argument and operand ops and views."""
    operands = [(src.op.name, src.shape, view.shape, view.strides) for src, view in zip(node.srcs, node.views, strict=True)]
    text = repr((node.op.name, node.shape, node.arg, operands))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Proposal:
    """A family of nodes that an extraction of the e-graph stores differently from the scheduler."""

    key: str
    kind: str
    """fuse (the scheduler stores it, the e-graph inlines it into its consumer), recompute (the
    same, and it has several consumers), store (the scheduler fuses it, the e-graph stores it),
    siblings (two kernels as one with two outputs) or products (two matrix products of one value
    as one tiled matmul with an output each)."""
    nodes: list[Node]
    extractions: list[str]
    pairs: list[tuple[Node, Node]] = field(default_factory=list)
    """For siblings and products: (the earlier kernel's node, the later one's), one pair per copy."""

    def describe(self) -> str:
        node = self.nodes[0]
        where = node.origin.split(' ("')[0][:50] or "-"
        what = {"fuse": "fuse", "recompute": "recompute", "store": "store",
                "siblings": "one kernel for", "products": "one matmul kernel for"}[self.kind]
        subject = f"{node.op.name.lower()}{list(node.shape)}"
        if self.kind in ("siblings", "products"):
            subject += f" and {self.pairs[0][1].op.name.lower()}{list(self.pairs[0][1].shape)}"
        return f"{what} {subject} ×{len(self.pairs) or len(self.nodes)} ({where}; {', '.join(self.extractions)})"


def fusion_proposals(space: ProgramSpace) -> list[Proposal]:
    """Every family an extraction stores differently from the scheduler."""
    uses = space.graph.consumers()
    by_key: dict[str, Proposal] = {}
    for name, stored in space.extractions().items():
        if name == "scheduler":
            continue
        for node in sorted(space.heuristic ^ stored, key=lambda n: n.id):
            if node in space.heuristic:
                kind = "recompute" if len(uses[node]) > 1 else "fuse"
            else:
                kind = "store"
            key = f"{kind}:{family(node)}"
            proposal = by_key.setdefault(key, Proposal(key, kind, [], []))
            if node not in proposal.nodes:
                proposal.nodes.append(node)
            if name not in proposal.extractions:
                proposal.extractions.append(name)
    return list(by_key.values())


def sibling_proposals(kernels: list[Kernel]) -> tuple[list[Proposal], dict[str, int]]:
    pairs, fired = sibling_pairs(kernels)
    return _pair_proposals("siblings", pairs), fired


def product_proposals(kernels: list[Kernel]) -> tuple[list[Proposal], dict[str, int]]:
    """The products rule's pairs as proposals, one per family of pairs (identical layers together)."""
    pairs, fired = product_pairs(kernels)
    return _pair_proposals("products", pairs), fired


def _pair_proposals(kind: str, pairs: list[tuple[Kernel, Kernel]]) -> list[Proposal]:
    by_key: dict[str, Proposal] = {}
    for earlier, later in pairs:
        key = f"{kind}:{family(earlier.node)}:{family(later.node)}"
        proposal = by_key.setdefault(key, Proposal(key, kind, [], [f"{kind} rule"]))
        proposal.nodes += [earlier.node, later.node]
        proposal.pairs.append((earlier.node, later.node))
    return list(by_key.values())

