"""The e-graph pass of the compiler: the whole graph through the algebra and view rules, and the
cheapest equivalent program extracted in its place (program.py's `egraph` pass).

The graph goes in once: identical layers differ only in their weights' names, so their terms
are distinct, but the rules match each of them in the same saturation run (about a second for
the quickstart model's 550 nodes), and extraction is linear in the e-graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from egglog import EGraph

from lumos.compile.egraph.algebra import algebra_rules
from lumos.compile.egraph.extract import ENode, build_graph, choose, default_cost, encode, replace_graph, serialize
from lumos.compile.egraph.views import view_rules
from lumos.compile.ir.graph import LEAF, Graph, Node

ITERATIONS = 8
"""Rounds per ruleset and pass; two passes (algebra, then views, twice) reach a fixpoint on the
models here: a rule that fires in the second pass found what the first one's rewrites exposed."""
PASSES = 2


@dataclass
class RewriteReport:
    enodes: int = 0
    """Term e-nodes after saturation (relations about views not counted)."""
    eclasses: int = 0
    saturate_s: float = 0.0
    extract_s: float = 0.0
    rules: dict[str, int] = field(default_factory=dict)
    """How often each rule matched."""
    ops_before: int = 0
    ops_after: int = 0
    """Computed nodes (not inputs or constants) of the graph before and after."""

    def as_dict(self) -> dict:
        return asdict(self)


def computed(graph: Graph) -> int:
    return sum(node.op not in LEAF for node in graph.nodes)


def saturate(graph: Graph, rulesets, stores: set[Node] | None = None,
             cost: Callable[[ENode], float] = default_cost) -> tuple[Graph, set[Node], RewriteReport]:
    """The cheapest program (by `cost`) equivalent to `graph` under `rulesets`, as a new graph,
    with the nodes it stores (`store` terms: `stores` wraps those of `graph`, see fusion.py)."""
    report = RewriteReport(ops_before=computed(graph))
    started = time.perf_counter()
    egraph = EGraph()
    encoding = encode(egraph, graph, stores)
    facts = encoding.facts()
    if facts:
        egraph.register(*facts)
    for _ in range(PASSES):
        for ruleset_ in rulesets:
            run = egraph.run(ruleset_ * ITERATIONS)
            for rule_, count in run.num_matches_per_rule.items():
                if count:
                    name = getattr(rule_, "name", None) or str(rule_)
                    report.rules[name] = report.rules.get(name, 0) + count
    report.saturate_s = time.perf_counter() - started
    started = time.perf_counter()
    serialized = serialize(egraph)
    report.enodes, report.eclasses = serialized.term_nodes, serialized.term_classes
    new, stored = build_graph(encoding, serialized, choose(serialized, cost))
    report.ops_after = computed(new)
    report.extract_s = time.perf_counter() - started
    return new, stored, report


def rewrite_graph(graph: Graph, rulesets=(algebra_rules, view_rules)) -> RewriteReport:
    """Rewrite `graph` in place into the cheapest program the rulesets reach from it (kept as
    traced when that is no cheaper)."""
    new, _, report = saturate(graph, rulesets)
    if report.ops_after < report.ops_before and not _outputs_become_leaves(graph, new):
        replace_graph(graph, new)
    else:
        report.ops_after = report.ops_before
    return report


def _outputs_become_leaves(old: Graph, new: Graph) -> bool:
    """True when an output the traced graph computes (such as a module returning an input, which
    the frontend writes as a copy) would be an input or constant itself after the rewrite: the
    later passes write outputs only from kernels, so such a program is kept as traced."""
    return any(new.outputs[name].op in LEAF and node.op not in LEAF for name, node in old.outputs.items())
