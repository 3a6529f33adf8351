"""The views ruleset: movement ops compose.

A view of a view is one view when every step of the outer one lands in one dim of the inner one
(permute, expand, slice and split reshapes do; `terms.compose` decides in Python and asserts
`composes(a, b, c)`); a view that reads its whole source in order is no view at all. Together
they remove the copies that other rules leave behind (e.g. `exp2(log2 x)` → a view of x).
"""

from __future__ import annotations

from egglog import i64, ruleset, vars_

from lumos.compile.egraph.terms import Term, composes, identity, named

(x,) = vars_("x", Term)
a, b, c = vars_("a b c", i64)

view_rules = ruleset(
    named("compose views", Term.view(Term.view(x, a), b), Term.view(x, c), composes(a, b, c)),
    named("identity view", Term.view(x, a), x, identity(a)),
)
