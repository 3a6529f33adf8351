"""The fusion ruleset: merge the loop that writes a buffer with the loop that reads it.

`Term.store(x)` is a buffer some loop writes and others read through views. Reading the
producer's expression instead (`view(store(x), v)` → `view(x, v)`) fuses the producer into its
consumer: an elementwise chain into the next elementwise op, an elementwise producer into a
reduction (a prologue), a reduction into its elementwise consumer (an epilogue). Both forms stay
in the e-graph; which buffers to keep is a cost question (recomputation under broadcast against
memory traffic), answered by extraction and measurement, not by the rule.
"""

from __future__ import annotations

from egglog import i64, ruleset, vars_

from lumos.compile.egraph.terms import Term, named

(x,) = vars_("x", Term)
v, axis = vars_("v axis", i64)

fusion_rules = ruleset(
    named("inline producer", Term.view(Term.store(x), v), Term.view(x, v)),
    named("prologue into sum", Term.sum(Term.view(Term.store(x), v), axis), Term.sum(Term.view(x, v), axis)),
    named("prologue into max", Term.max(Term.view(Term.store(x), v), axis), Term.max(Term.view(x, v), axis)),
)
