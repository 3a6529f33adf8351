"""The program as data: primitive ops read through views (`graph`), the high-level ops written once
in those primitives (`hl_ops`: matmul, softmax, layer norm, attention), and the numpy reference
interpreter (`interpret`) that every later stage is checked against.

The op set is one table (`ops`): a new primitive op is a member of `Op` and a row of `OPS` (its
group, properties, numpy reference and e-graph term name); the interpreter, the e-graph terms and
the lowering take their entries from it, and an op without a row fails at import. Besides the row
it needs its `Term` constructor (egraph/terms.py), a `Tensor` method that builds it (hl_ops), and
its printer entries in render/ (the C and CUDA syntax stays there, not in the IR). A matrix product
is one predicate, `is_matmul` / `matmul_sum` in `graph`, that every stage asks.
"""
