"""The fusion ruleset: merge the loop that writes a buffer with the loop that reads it.

`Term.store(x)` is a buffer some loop writes and others read through views. Reading the
producer's expression instead (`view(store(x), v)` → `view(x, v)`) fuses the producer into its
consumer: an elementwise chain into the next elementwise op, an elementwise producer into a
reduction (a prologue), a reduction into its elementwise consumer (an epilogue). Both forms stay
in the e-graph; which buffers to keep is a cost question (recomputation under broadcast against
memory traffic), answered by extraction and measurement, not by the rule.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from egglog import EGraph, i64, ruleset, vars_

from lumos.compile.egraph.extract import (
    ENode,
    Serialized,
    build_graph,
    choose,
    default_cost,
    encode,
    serialize,
    stored_nodes,
)
from lumos.compile.egraph.terms import Encoding, Term, named
from lumos.compile.ir.graph import Graph, Node

(x,) = vars_("x", Term)
v, axis = vars_("v axis", i64)

fusion_rules = ruleset(
    named("inline producer", Term.view(Term.store(x), v), Term.view(x, v)),
    named("prologue into sum", Term.sum(Term.view(Term.store(x), v), axis), Term.sum(Term.view(x, v), axis)),
    named("prologue into max", Term.max(Term.view(Term.store(x), v), axis), Term.max(Term.view(x, v), axis)),
)


# ---------------------------------------------------------------------------------------------
# Fusion as a choice: every buffer the scheduler keeps, and every site it fuses, as a `store`
# in one e-graph; the fusion rules put the inlined form beside each. A program is an extraction:
# pricing a store as a free read keeps the buffer, pricing it out of reach inlines it.


@dataclass
class FusionSpace:
    encoding: Encoding
    serialized: Serialized
    rules: dict[str, int]
    seconds: float

    def extract(self, keep: set[Node]) -> dict[str, str]:
        """The program with the stores of `keep` available and every other store priced out."""
        allowed = {self.serialized.originals[node.id] for node in keep}

        def cost(enode: ENode) -> float:
            if enode.op == "Term.store":
                return STORE_READ if enode.eclass in allowed else math.inf
            return default_cost(enode)

        return choose(self.serialized, cost, cut=("Term.store",))

    def graph(self, keep: set[Node]) -> tuple[Graph, set[Node]]:
        """That program as a new graph, with the nodes it stores."""
        return build_graph(self.encoding, self.serialized, self.extract(keep))

    def stores(self, keep: set[Node]) -> set[Node]:
        """That program's buffers: the nodes (of the encoded graph) whose `store` it kept."""
        return stored_nodes(self.serialized, self.extract(keep), self.encoding.graph.nodes,
                            self.encoding.graph.outputs.values())


STORE_READ = 0.001
"""Reading a kept buffer costs next to nothing, whatever computed it (`choose` cuts its subtree)."""


def fusion_space(graph: Graph, stores: set[Node]) -> FusionSpace:
    started = time.perf_counter()
    egraph = EGraph()
    encoding = encode(egraph, graph, stores)
    report = egraph.run(fusion_rules.saturate())
    rules = {getattr(r, "name", None) or str(r): n for r, n in report.num_matches_per_rule.items() if n}
    return FusionSpace(encoding, serialize(egraph), rules, time.perf_counter() - started)
