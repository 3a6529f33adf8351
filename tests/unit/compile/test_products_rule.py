"""The products rule (egraph/programs.py): which kernels the e-graph finds joinable as matrix
products of one value, on the CUDA target's kernels up to its products pass (no NVRTC needed).
It must find exactly a self-attention's query/key/value triple, and nothing where two products
share the input but read it differently or where one depends on the other; a rule with one of
its conditions dropped finds more, and fails the same checks."""

from __future__ import annotations

import numpy as np
import pytest
from egglog import i64, rule, ruleset, vars_

from lumos.cli.compile import program_lines
from lumos.compile.compilation import Compilation, Options
from lumos.compile.egraph.programs import (
    a,
    b,
    product_pairs,
    product_proposals,
    product_rules,
    products_joinable,
    read,
    runs_beside,
    value,
    weight_product,
)
from lumos.compile.ir.graph import Graph, Op, check_graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.program import run_passes
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.schedule.kernels import Kernel
from lumos.compile.target import CUDA

D, HEADS, TOKENS, BATCH = 16, 2, 7, 3


def _weight(graph: Graph, name: str, rows: int, columns: int, seed: int) -> Tensor:
    rng = np.random.default_rng(seed)
    return Tensor.constant(graph, name, (rng.standard_normal((rows, columns)) * 0.3).astype(np.float32))


def self_attention() -> Graph:
    """A pre-norm self-attention block: layer norm → query, key and value projections → attention
    → output projection (a product of another value) → residual."""
    graph = Graph()
    x = Tensor.input(graph, "x", (BATCH, TOKENS, D))
    normed = x.layer_norm(None, None, 1e-5)
    heads = [normed.linear(_weight(graph, f"w{name}", D, D, seed)).reshape(BATCH, TOKENS, HEADS, D // HEADS)
             .permute(0, 2, 1, 3) for seed, name in enumerate("qkv")]
    q, k, v = heads
    probs = (q.matmul(k.transpose(-1, -2)) * (1.0 / np.sqrt(D // HEADS))).softmax(-1)
    attended = probs.matmul(v).permute(0, 2, 1, 3).reshape(BATCH, TOKENS, D)
    mark_output(graph, "y", x + attended.linear(_weight(graph, "wo", D, D, 3)))
    graph.prune()
    check_graph(graph)
    return graph


def two_products(depends: bool = False, other_read: bool = False) -> Graph:
    """Two products of x: the second reads q (k = x W_k + q), or reads x another way (its
    transpose: the same buffer, read across its rows)."""
    graph = Graph()
    x = Tensor.input(graph, "x", (D, D))
    bias = Tensor.constant(graph, "bias", np.ones(D, np.float32))  # both outputs of one shape
    q = x.linear(_weight(graph, "wq", D, D, 0), bias)
    mark_output(graph, "q", q)
    k = (x.transpose(0, 1) if other_read else x).linear(_weight(graph, "wk", D, D, 1), bias)
    mark_output(graph, "k", k + q if depends else k)
    graph.prune()
    check_graph(graph)
    return graph


def cuda_kernels(graph: Graph, tmp_path, through: str = "attention", **options) -> list[Kernel]:
    """The CUDA target's kernels after its pass `through` (by default as the products pass receives them)."""
    names = [name for name, _ in CUDA.passes]
    compilation = Compilation(graph, Options(arch="sm_80", **options), CUDA.name)
    return run_passes(CUDA.passes[:names.index(through) + 1], compilation, KernelCache(tmp_path, "cuda")).kernels


def weight(kernel: Kernel) -> str:
    """The name of the weight a kernel multiplies by ("wq"; the layout pass stores it as "wq#T")."""
    (name,) = {src.arg for node in kernel.unique_fused for src in node.srcs
               if src.op is Op.CONST and not src.is_scalar_const and len(src.shape) == 2}
    return name.removesuffix("#T")


def found(graph: Graph, tmp_path, rules=product_rules, **options) -> set[frozenset[str]]:
    pairs, _ = product_pairs(cuda_kernels(graph, tmp_path, **options), rules)
    return {frozenset((weight(earlier), weight(later))) for earlier, later in pairs}


def check_rule(rules, tmp_path) -> None:
    pair = frozenset
    triple = {pair({"wq", "wk"}), pair({"wq", "wv"}), pair({"wk", "wv"})}
    assert found(self_attention(), tmp_path, rules, transpose_activations=False) == triple
    assert found(self_attention(), tmp_path, rules) == triple  # the key stored transposed: see the test below
    assert found(two_products(), tmp_path, rules) == {pair({"wq", "wk"})}
    assert found(two_products(other_read=True), tmp_path, rules) == set()
    assert found(two_products(depends=True), tmp_path, rules) == set()


def test_the_rule_finds_exactly_the_query_key_value_triple(tmp_path):
    """Not the output projection (another value), and not a pair that reads x another way or
    that depends on the other. With the layout pass's transposed activations (the default), the
    key's kernel writes it transposed for the attention: how an output is written is no part of
    the read, so the key joins all the same (the joined kernel stores it through its own steps)."""
    check_rule(product_rules, tmp_path)


def _broken(*conditions):
    return ruleset(rule(*conditions, name="broken").then(products_joinable(a, b)))


(other_read,) = vars_("other_read", i64)


@pytest.mark.parametrize("rules, exposed_by", [
    (_broken(weight_product(a, value, read), weight_product(b, value, other_read), runs_beside(a, b)),
     {"other_read": True}),
    (_broken(weight_product(a, value, read), weight_product(b, value, read)), {"depends": True}),
], ids=["reads-ignored", "dependency-ignored"])
def test_a_rule_with_a_condition_dropped_fails_the_checks(rules, exposed_by, tmp_path):
    assert found(two_products(**exposed_by), tmp_path, rules)  # the pair the dropped condition kept out
    with pytest.raises(AssertionError):
        check_rule(rules, tmp_path)


def test_the_products_pass_keeps_every_gene_and_explain_lists_them(tmp_path):
    kernels = cuda_kernels(self_attention(), tmp_path, transpose_activations=False)
    proposals, fired = product_proposals(kernels)
    assert [p.kind for p in proposals] == ["products"] and fired  # q, k and v: one family
    for join in (True, False):
        compilation = Compilation(self_attention(), Options(arch="sm_80", transpose_activations=False,
                                                            join_products=join), CUDA.name)
        names = [name for name, _ in CUDA.passes]
        run_passes(CUDA.passes[:names.index("products") + 1], compilation, KernelCache(tmp_path, "cuda"))
        joined = [kernel for kernel in compilation.kernels if kernel.also]
        assert [len(kernel.outputs) for kernel in joined] == [3] * join
        assert len(compilation.kernels) == len(kernels) - 2 * join
        assert compilation.products_joined == [kernel.name for kernel in joined]
        lines = program_lines(compilation.programs)
        assert lines[0].startswith("e-graph programs: 1 proposals the scheduler would not make (products")
        assert lines[1].startswith(f"  {'kept' if join else 'not kept'}: one matmul kernel for")
