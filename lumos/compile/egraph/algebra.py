"""The algebra ruleset: identities that remove work, on terms whose operands are views.

x·1 → x, x+0 → x, exp2(log2 x) → x, recip(recip x) → x, constant folding (also through a product
or sum with a constant), and distributivity where it removes a multiply (a·c + b·c → (a+b)·c).
An elementwise op commutes with a view that has no padding mask, so `exp2(view(log2 x, v))` is
`view(x, v)`; through padding it is not (exp2(0) is 1), so those rules need `no_mask(v)`, which
Python asserts for the views that have none.
"""

from __future__ import annotations

from egglog import f64, i64, ruleset, vars_

from lumos.compile.egraph.terms import Term, identity, named, no_mask, same_shape

x, y, z = vars_("x y z", Term)
v, w, u = vars_("v w u", i64)
a, b = vars_("a b", f64)


def _num(value, view) -> Term:
    return Term.view(Term.num(value), view)


algebra_rules = ruleset(
    named("x*1", Term.mul(x, _num(f64(1.0), v)), x),
    named("1*x", Term.mul(_num(f64(1.0), v), x), x),
    named("x+0", Term.add(x, _num(f64(0.0), v)), x),
    named("0+x", Term.add(_num(f64(0.0), v), x), x),
    named("exp2(log2 x)", Term.exp2(Term.view(Term.log2(x), v)), Term.view(x, v), no_mask(v)),
    named("recip(recip x)", Term.recip(Term.view(Term.recip(x), v)), Term.view(x, v), no_mask(v)),
    named("fold a+b", Term.add(_num(a, v), _num(b, w)), _num(a + b, v), same_shape(v, w)),
    named("fold a*b", Term.mul(_num(a, v), _num(b, w)), _num(a * b, v), same_shape(v, w)),
    named("fold a+b (same view)", Term.add(_num(a, v), _num(b, v)), _num(a + b, v)),
    named("fold a*b (same view)", Term.mul(_num(a, v), _num(b, v)), _num(a * b, v)),
    named("fold (x*a)*b", Term.mul(Term.view(Term.mul(x, _num(a, v)), u), _num(b, w)), Term.mul(x, _num(a * b, v)),
          identity(u), same_shape(v, w)),
    named("fold (x+a)+b", Term.add(Term.view(Term.add(x, _num(a, v)), u), _num(b, w)), Term.add(x, _num(a + b, v)),
          identity(u), same_shape(v, w)),
    named("distribute a*c+b*c", Term.add(Term.view(Term.mul(x, z), v), Term.view(Term.mul(y, z), w)),
          Term.mul(Term.view(Term.add(x, y), v), z), identity(v), identity(w)),
)
