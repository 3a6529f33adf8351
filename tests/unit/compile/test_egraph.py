"""egglog rulesets: each preserves semantics (the interpreter before and after on random inputs),
the schedule rules span the variants the search measures, the attention rules find online softmax."""

from __future__ import annotations

import numpy as np
import pytest

from lumos.compile.egraph.algebra import algebra_rules
from lumos.compile.egraph.attention import find_attention, fuse_attention
from lumos.compile.egraph.fusion import fusion_rules
from lumos.compile.egraph.rewrite import saturate
from lumos.compile.egraph.schedule import schedule_candidates
from lumos.compile.egraph.views import view_rules
from lumos.compile.ir.graph import LEAF, Graph
from lumos.compile.ir.hl_ops import Tensor, attention, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.render.c import render_library, tensor_names
from lumos.compile.runtime.kernel_cache import gcc
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.schedule.buffers import plan_buffers
from lumos.compile.schedule.kernels import KernelSchedule, schedule


def rewritten(graph: Graph, *rulesets, stores=None):
    after, _, report = saturate(graph, rulesets, stores)
    return after, report.rules


def assert_same(before: Graph, after: Graph, inputs) -> None:
    for name, want in interpret(before, inputs).items():
        np.testing.assert_allclose(interpret(after, inputs)[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


def computed(graph: Graph) -> int:
    return sum(node.op not in LEAF for node in graph.nodes)


@pytest.fixture
def redundant() -> tuple[Graph, dict[str, np.ndarray]]:
    """x·1, +0, exp2(log2 ·), recip(recip ·), constants to fold, a·c + b·c, at awkward sizes."""
    rng = np.random.default_rng(3)
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 17))
    w = Tensor.constant(graph, "w", rng.standard_normal((3, 17)).astype(np.float32))
    y = (x * 1.0 + 0.0).log2().exp2().recip().recip() * 2.0 * 3.0
    mark_output(graph, "y", (y * w + x * w).sum(1))
    return graph.prune(), {"x": (np.abs(rng.standard_normal((3, 17))) + 0.1).astype(np.float32)}


def test_algebra_preserves_semantics_and_removes_work(redundant):
    graph, inputs = redundant
    after, fired = rewritten(graph, algebra_rules, view_rules)
    assert {"x*1", "x+0", "exp2(log2 x)", "recip(recip x)", "fold (x*a)*b", "distribute a*c+b*c"} <= set(fired)
    assert computed(after) < computed(graph) // 2
    assert_same(graph, after, inputs)


def test_the_compiler_runs_the_rules_and_compiles_the_extracted_program(redundant, kernel_cache):
    graph, inputs = redundant
    want = interpret(graph, inputs)["y"]
    ops = computed(graph)
    compilation = compile_graph(graph, kernel_cache)
    report = compilation.rewrite
    assert {"x*1", "exp2(log2 x)", "distribute a*c+b*c"} <= set(report.rules)
    assert report.ops_before == ops and report.ops_after == computed(compilation.graph) < ops // 2
    assert report.enodes >= report.eclasses > 0 and report.saturate_s > 0
    assert compilation.stats()["primitive_ops"] == report.ops_after  # what was scheduled is the extracted program
    np.testing.assert_allclose(load_program(compilation)(inputs)["y"].reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_views_compose_movement_ops():
    rng = np.random.default_rng(4)
    graph = Graph()
    x = Tensor.input(graph, "x", (5, 7))
    y = (x.permute((1, 0)) * 1.0).reshape((7, 5)).permute((1, 0)) * 1.0 + x
    mark_output(graph, "y", y.reshape((35,)).reshape((5, 7)).exp2())
    graph = graph.prune()
    after, fired = rewritten(graph, algebra_rules, view_rules)
    assert fired.get("compose views") and fired.get("identity view")
    assert computed(after) <= 3  # the add, the exp2 and the output copy: no copies for the views
    assert_same(graph, after, {"x": rng.standard_normal((5, 7)).astype(np.float32)})


def test_fusion_inlines_producers_and_preserves_semantics():
    rng = np.random.default_rng(5)
    graph = Graph()
    x = Tensor.input(graph, "x", (4, 9, 8))
    w = Tensor.constant(graph, "w", rng.standard_normal((8, 8)).astype(np.float32))
    mark_output(graph, "y", x.linear(w).gelu().layer_norm(None, None, 1e-5))
    graph = graph.prune()
    stores = {node for node in graph.nodes if node.op not in LEAF}  # every node its own loop
    after, fired = rewritten(graph, fusion_rules, stores=stores)
    assert fired.get("inline producer") and (fired.get("prologue into sum") or fired.get("prologue into max"))
    assert_same(graph, after, {"x": rng.standard_normal((4, 9, 8)).astype(np.float32)})


def test_store_survives_extraction_and_the_extraction_decides_what_is_stored():
    from lumos.compile.egraph.fusion import fusion_space

    rng = np.random.default_rng(5)
    graph = Graph()
    x = Tensor.input(graph, "x", (4, 9, 8))
    w = Tensor.constant(graph, "w", rng.standard_normal((8, 8)).astype(np.float32))
    mark_output(graph, "y", x.linear(w).gelu().layer_norm(None, None, 1e-5))
    graph = graph.prune()
    every = {node for node in graph.nodes if node.op not in LEAF}
    space = fusion_space(graph, every)
    assert space.rules.get("inline producer")
    outputs = set(graph.outputs.values())
    assert space.stores(every) == every  # every store available: every buffer kept
    assert space.stores(outputs) == outputs  # none but the output: everything inlined
    _, kernels_materialized = schedule(graph)
    assert space.stores(kernels_materialized) == kernels_materialized  # the scheduler's program is one extraction
    after, stored = space.graph(kernels_materialized)  # store survives extraction into a graph
    assert len(stored) == len(kernels_materialized) and set(after.outputs.values()) <= stored
    assert_same(graph, after, {"x": rng.standard_normal((4, 9, 8)).astype(np.float32)})


def test_schedule_rules_span_the_loop_variants():
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 17, 64))
    w = Tensor.constant(graph, "w", np.ones((64, 64), np.float32))
    mark_output(graph, "y", x.linear(w))
    kernels, _ = schedule(graph.prune())
    matmul = next(kernel for kernel in kernels if kernel.kind == "reduce")
    candidates, fired = schedule_candidates(matmul)
    assert len(set(candidates)) == len(candidates) >= 10
    assert {sched.tile for sched in candidates} >= {0, 16, 32}
    assert {sched.interchange for sched in candidates} == {None, True, False}
    assert {"swap:row-wise", "swap:dot", "tile:registers", "unroll:reduction", "parallelize:outermost"} <= set(fired)


def test_16_float_loops_are_candidates_where_a_kernel_computes_a_transcendental_and_give_its_values(kernel_cache):
    """On AVX-512 hosts a kernel with a 2^x (here GELU's erf before a matmul) is offered with its
    loops in 16-float vectors (gcc's own width there is 8), which renders, builds and computes the
    interpreter's values; a plain matmul is not offered it, nor is any kernel elsewhere."""
    from lumos.compile.egraph.schedule import has_avx512

    rng = np.random.default_rng(3)
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 17, 64))
    w = Tensor.constant(graph, "w", rng.standard_normal((64, 48)).astype(np.float32))
    mark_output(graph, "y", x.gelu().linear(w.transpose(0, 1)))
    mark_output(graph, "z", x.linear(w.transpose(0, 1)))
    graph = graph.prune()
    kernels, materialized = schedule(graph)
    gelu = next(k for k in kernels if k.node is graph.outputs["y"])
    plain = next(k for k in kernels if k.node is graph.outputs["z"])
    candidates, fired = schedule_candidates(gelu)
    assert not any(sched.wide for sched in schedule_candidates(plain)[0])
    if not has_avx512():
        assert not any(sched.wide for sched in candidates)
        return
    assert fired["vectorize:wide-loops"] and {sched.wide for sched in candidates} == {False, True}
    inputs = {"x": rng.standard_normal((3, 17, 64)).astype(np.float32)}
    want = interpret(graph, inputs)
    plan = plan_buffers(graph, kernels)
    for sched in (KernelSchedule(wide=True), next(s for s in candidates if s.wide and s.rows)):
        source = render_library(graph, kernels, materialized, plan, {gelu.name: sched})
        assert f"LUMOS_KERNEL LUMOS_WIDE void {gelu.name}(" in source and source.count("LUMOS_WIDE void") == 2
        program = NativeProgram(kernel_cache.build(source, gcc("gcc", Options().cflags)).library,
                                [(n, node.shape) for n, node in graph.inputs.items()],
                                [(n, node.shape) for n, node in graph.outputs.items()],
                                [graph.tensors[n] for n in tensor_names(graph)], plan.arena_bytes)
        got = program(inputs)
        np.testing.assert_allclose(got["y"].reshape(want["y"].shape), want["y"], rtol=1e-5, atol=1e-5)


def attention_graph(length: int = 17, queries: int | None = None, D: int = 8,
                    keys_transposed: bool = False, projected_keys: bool = False) -> tuple[Graph, dict[str, np.ndarray]]:
    """Self-attention over `length` tokens, or `queries` slots' cross-attention to them; heads of
    size D; the keys stored (B, H, D, length), as the compiled model keeps them, when `keys_transposed`;
    with `projected_keys`, keys and values one linear layer's output (B, length, 2·H·D) split into
    heads, as a model computes them (the layout pass then copies the keys transposed)."""
    rng = np.random.default_rng(6)
    graph = Graph()
    B, H = 3, 2
    shapes = {"q": (B, H, queries or length, D), "k": (B, H, D, length) if keys_transposed else (B, H, length, D),
              "v": (B, H, length, D)}
    if projected_keys:
        shapes = {"q": shapes["q"], "x": (B, length, H * D), "w": (H * D, 2 * H * D)}
        q, x, w = (Tensor.input(graph, name, shape) for name, shape in shapes.items())
        kv = x.linear(w.transpose(0, 1))
        k, v = (kv.slice(2, at, at + H * D).reshape(B, length, H, D).permute(0, 2, 1, 3) for at in (0, H * D))
    else:
        q, k, v = (Tensor.input(graph, name, shape) for name, shape in shapes.items())
    k = k.transpose(2, 3) if keys_transposed else k
    mask = Tensor.input(graph, "mask", (B, 1, 1, length))
    mark_output(graph, "y", attention(q, k, v, mask))
    inputs = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    inputs["mask"] = (rng.random((B, 1, 1, length)) > 0.3).astype(np.float32)
    return graph.prune(), inputs


def fused_kernels(graph: Graph, kernel_cache):
    """The scheduler's kernels with the attention rules' fused kernel in place of what it covers."""
    compilation = compile_graph(graph, kernel_cache)
    kernels, materialized, _ = fuse_attention(graph, compilation.materialized, find_attention(graph)[0])
    return kernels, materialized


def run_fused(graph: Graph, inputs, kernel_cache, kernels, materialized, plan, schedules=None) -> tuple[np.ndarray, str]:
    """The fused program's output (shaped like the graph's) and its C."""
    source = render_library(graph, kernels, materialized, plan, schedules)
    program = NativeProgram(kernel_cache.build(source, gcc("gcc", Options().cflags)).library,
                            [(n, node.shape) for n, node in graph.inputs.items()],
                            [(n, node.shape) for n, node in graph.outputs.items()],
                            [graph.tensors[n] for n in tensor_names(graph)], plan.arena_bytes)
    return program(inputs)["y"].reshape(graph.output_shapes["y"]), source


def test_a_fused_attention_counts_each_of_its_two_products_once(kernel_cache):
    """q·kᵀ and p·v: 2·T·T·D flops each per (batch, head), however many nodes use the scores."""
    from lumos.compile.search.cost_model import kernel_flops

    graph, _ = attention_graph(17, D=8, keys_transposed=True)
    (fused,) = [kernel for kernel in fused_kernels(graph, kernel_cache)[0] if kernel.attention is not None]
    assert kernel_flops(fused) == 2 * (2 * 3 * 2 * 17 * 17 * 8)


def test_attention_rules_find_online_softmax_and_the_fused_kernel_never_stores_scores(kernel_cache):
    graph, inputs = attention_graph()
    matches, fired = find_attention(graph)
    assert len(matches) == 1 and fired["softmax (max-shifted)"] and fired["online softmax"]
    compilation = compile_graph(graph, kernel_cache)
    kernels, materialized, used = fuse_attention(graph, compilation.materialized, matches)
    assert used and [kernel.kind for kernel in kernels] == ["attention"]
    plan = plan_buffers(graph, kernels)
    assert plan.arena_bytes < matches[0].scores.size * 4 <= compilation.buffers.arena_bytes
    got, _ = run_fused(graph, inputs, kernel_cache, kernels, materialized, plan)
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)


def test_the_search_reports_and_verifies_the_fused_attention(kernel_cache):
    graph, inputs = attention_graph(33)
    compilation = compile_graph(graph, kernel_cache, Options(search_budget_s=0.001, search_cache=False), inputs)
    report = compilation.search.attention
    assert report["matches"] == 1 and report["verified"] and report["score_bytes_not_written"] == 3 * 2 * 33 * 33 * 4
    assert report["chosen"] == (report["fused_ms"] < report["unfused_ms"])
    got = load_program(compilation)(inputs)["y"].reshape(graph.output_shapes["y"])
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head", [16, 12])
def test_a_fused_attention_can_read_the_keys_untransposed_and_gives_the_same_values(kernel_cache, head):
    """With stage_keys, the copy that transposes the keys is no kernel of its own: the fused kernel
    lays out each (batch, head)'s keys in its thread's buffer (transposed in registers where the
    head splits into vectors, else one float at a time), for every way it blocks queries."""
    graph, inputs = attention_graph(37, D=head, projected_keys=True)
    compilation = compile_graph(graph, kernel_cache)
    copies, _, _ = fuse_attention(graph, compilation.materialized, find_attention(graph)[0])
    kernels, materialized, used = fuse_attention(graph, compilation.materialized, find_attention(graph)[0], stage_keys=True)
    assert used[0].keys_copy is not None and used[0].keys_copy not in materialized
    assert len(kernels) == len(copies) - 1  # the transposing copy's kernel is gone
    plan = plan_buffers(graph, kernels)
    want = interpret(graph, inputs)["y"]
    for blocks in (KernelSchedule(), KernelSchedule(rows=1), KernelSchedule(rows=4, lanes=16), KernelSchedule(tile=16, rows=3)):
        got, source = run_fused(graph, inputs, kernel_cache, kernels, materialized, plan,
                                {kernel.name: blocks for kernel in kernels})
        assert "kt[" in source and "staged_at" in source and (
            ("lumos_transpose8(t);" in source or "lumos_transpose16(t);" in source) == (head == 16))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_search_times_the_keys_staged_against_their_transposed_copies_and_keeps_the_faster(kernel_cache):
    graph, inputs = attention_graph(40, D=16, projected_keys=True)
    compilation = compile_graph(graph, kernel_cache, Options(search_budget_s=0.001, search_cache=False), inputs)
    staged = compilation.search.attention["staged_keys"]
    assert staged["verified"] and staged["chosen"] == (staged["staged_ms"] < staged["copies_ms"])
    copies = [kernel for kernel in compilation.kernels if kernel.node.origin.startswith("layout")]
    search = compilation.search
    assert bool(copies) != (staged["chosen"] and search.attention["chosen"] and search.confirmed["kept"])
    got = load_program(compilation)(inputs)["y"].reshape(graph.output_shapes["y"])
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)


def test_key_blocks_are_distinct_candidates_of_a_fused_attention(kernel_cache):
    from lumos.compile.search.climb import make_groups

    (group,) = make_groups(*fused_kernels(attention_graph(70)[0], kernel_cache), seed=0)
    assert {candidate.schedule.tile for candidate in group.candidates} >= {0, 8, 16, 64}


@pytest.mark.parametrize("queries, per_block, D, keys_transposed, keys_per_block, lanes", [
    (17, 1, 8, False, 8, 0), (17, 2, 16, True, 8, 0), (17, 4, 8, False, 8, 0), (17, 4, 8, True, 8, 0),
    (17, 8, 8, True, 8, 0), (1, 4, 8, True, 8, 0), (17, 4, 6, False, 8, 0), (17, 4, 8, True, 17, 0),
    (17, 2, 16, True, 0, 0), (17, 8, 16, True, 0, 16), (17, 4, 16, True, 8, 16), (17, 2, 32, False, 16, 16),
    (17, 4, 32, True, 17, 16), (17, 4, 8, True, 0, 16)])
def test_query_blocks_are_exact_when_they_do_not_divide_the_queries(kernel_cache, queries, per_block, D, keys_transposed,
                                                                    keys_per_block, lanes):
    """17 queries in blocks of 2, 4 or 8 leave a partial last block; one query (a decoder slot's
    cross-attention) has no query loop to block. Heads of 8 and 16 accumulate in vectors, of 6 not.
    With the keys stored along the sequence, a block's scores are register-blocked products over
    tiles of keys, the keys left over zero-padded to one more vector (17 keys in blocks of 8: two
    tiles, then one key padded; all 17 keys in one block, given or the default of 32 cut to 17: a
    tile of 16, then one padded). In 16-float vectors (lanes 16, where the head size is a multiple
    of 16; a head of 8 keeps 8-float ones): 17 keys are a tile of 16 and one padded, a block of 8
    keys only the padded vector. (On a host without AVX-512 gcc splits those vectors in two.)
    Blocks of 17 and 8 keys, and a last block of one, cover both the P·V loop's pairs of keys
    and the key left over."""
    graph, inputs = attention_graph(17, queries, D, keys_transposed)
    kernels, materialized = fused_kernels(graph, kernel_cache)
    schedules = {kernel.name: KernelSchedule(tile=keys_per_block, rows=per_block, lanes=lanes) for kernel in kernels}
    got, source = run_fused(graph, inputs, kernel_cache, kernels, materialized, plan_buffers(graph, kernels), schedules)
    assert f"{min(queries, per_block) if queries > 1 else 1} queries at a time" in source
    vw = 16 if lanes == 16 and D % 16 == 0 else 8
    assert (f"lumos_f{vw} o[" in source) == (D % 8 == 0)
    # Fewer than 8 output vectors in a block (FMA chains): odd keys go to a second set of sums.
    assert (f"lumos_f{vw} o1[" in source) == (D % 8 == 0 and min(queries, per_block) * D // vw < 8)
    blocked = keys_transposed and queries > 1 and per_block > 1
    assert (f"lumos_f{vw} sa[" in source) == blocked
    # The mask and scale run on the product tiles' vectors, with the running maximum.
    assert (f"mx[q] = lumos_max{vw}(mx[q], sv);" in source) == blocked
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)


def test_query_blocks_are_candidates_of_a_fused_attention(kernel_cache):
    from lumos.compile.search.climb import make_groups

    (group,) = make_groups(*fused_kernels(attention_graph(17)[0], kernel_cache), seed=0)
    # 8 queries is the default at head size 8 (16 accumulators / 1 vector, at most 8): the same C
    # as rows 0, so it is offered once.
    assert {candidate.schedule.rows for candidate in group.candidates} == {0, 1, 2, 4}


def test_16_float_vectors_are_candidates_of_a_fused_attention_on_avx512_hosts(kernel_cache):
    from lumos.compile.egraph.schedule import has_avx512
    from lumos.compile.search.climb import make_groups

    def lanes(D: int) -> set[int]:
        (group,) = make_groups(*fused_kernels(attention_graph(17, D=D)[0], kernel_cache), seed=0)
        return {candidate.schedule.lanes for candidate in group.candidates}

    assert lanes(16) == ({0, 16} if has_avx512() else {0})
    assert lanes(8) == {0}  # a head of 8 floats is half a 16-float vector: not offered


def test_the_softmax_exponent_is_exp2_to_two_ulp_where_it_is_used(kernel_cache):
    """lumos_exp2f_nonpositive, the fused attention's 2^x for x <= 0: within 2.4e-7 of 2^x down
    to 2^-126, 0 below 2^-127 (and at -inf, and at the masks' -1e30 · log2 e), NaN for NaN."""
    import ctypes

    from lumos.compile.render.c import HEADER

    source = HEADER + ("void exps(const float* x, float* y, int n) {\n"
                       "  for (int i = 0; i < n; i++) y[i] = lumos_exp2f_nonpositive(x[i]);\n}\n")
    library = ctypes.CDLL(str(kernel_cache.build(source, gcc("gcc", Options().cflags)).library))
    x = np.concatenate([np.linspace(-126.0, 0.0, 200_001), [-0.0, -1e-8, -0.5, -1.5, -125.9, -126.0]]).astype(np.float32)
    low = np.array([-127.0, -127.5, -128.0, -1e30, -np.inf], np.float32)
    special = np.concatenate([x, low, [np.nan]]).astype(np.float32)
    y = np.empty_like(special)
    pointer = ctypes.POINTER(ctypes.c_float)
    library.exps(special.ctypes.data_as(pointer), y.ctypes.data_as(pointer), ctypes.c_int(special.size))
    exact = np.exp2(x.astype(np.float64))
    assert np.max(np.abs(y[:x.size] / exact - 1)) < 2.5e-7
    assert np.all(y[x.size:x.size + low.size] == 0.0) and np.isnan(y[-1])


@pytest.mark.parametrize("lanes", [8, 16])
def test_the_vector_softmax_steps_match_the_scalar_ones_and_the_last_keys_read_nothing_past_them(kernel_cache, lanes):
    """lumos_exp2_nonpositive8/16 to the scalar one's accuracy, with its 0 below 2^-127 and NaN;
    lumos_sum_lanes; lumos_loadN_first at the very end of a readable page (the next one
    unreadable: a read past the n floats would crash), zeros after them; lumos_firstN."""
    import ctypes
    import mmap

    from lumos.compile.render.c import HEADER

    n = lanes
    source = HEADER + f"""
void exps(const float* x, float* y, int count) {{
  for (int i = 0; i < count; i += {n}) lumos_store{n}(&y[i], lumos_exp2_nonpositive{n}(lumos_load{n}(&x[i])));
}}
float sum(const float* x) {{ return lumos_sum_lanes{n}(lumos_load{n}(x)); }}
void load_first(const float* p, int count, float* y) {{ lumos_store{n}(y, lumos_load{n}_first(p, count)); }}
void first(const float* p, int count, float* y) {{ lumos_store{n}(y, lumos_first{n}(lumos_load{n}(p), count, -INFINITY)); }}
"""
    library = ctypes.CDLL(str(kernel_cache.build(source, gcc("gcc", Options().cflags)).library))
    library.sum.restype = ctypes.c_float
    pointer = ctypes.POINTER(ctypes.c_float)
    x = np.concatenate([np.linspace(-126.0, 0.0, 100_000), [-0.0, -1e-8, -0.5, -127.0, -128.0, -1e30, -np.inf, np.nan]])
    x = np.concatenate([x, np.zeros(-x.size % n)]).astype(np.float32)
    y = np.empty_like(x)
    library.exps(x.ctypes.data_as(pointer), y.ctypes.data_as(pointer), ctypes.c_int(x.size))
    normal = x >= -126.0
    assert np.max(np.abs(y[normal] / np.exp2(x[normal].astype(np.float64)) - 1)) < 2.5e-7
    assert np.all(y[(x < -126.5)] == 0.0) and np.isnan(y[np.isnan(x)]).all()
    values = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    assert abs(library.sum(values.ctypes.data_as(pointer)) - values.sum(dtype=np.float64)) < 1e-5

    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 0) == 0  # PROT_NONE
    out = np.empty(n, np.float32)
    for count in range(1, n):
        start = base + page - 4 * count
        ctypes.memmove(start, values.ctypes.data, 4 * count)
        library.load_first(ctypes.cast(start, pointer), ctypes.c_int(count), out.ctypes.data_as(pointer))
        np.testing.assert_array_equal(out, np.concatenate([values[:count], np.zeros(n - count, np.float32)]))
        library.first(values.ctypes.data_as(pointer), ctypes.c_int(count), out.ctypes.data_as(pointer))
        np.testing.assert_array_equal(out, np.concatenate([values[:count], np.full(n - count, -np.inf, np.float32)]))
    assert libc.mprotect(ctypes.c_void_p(base + page), ctypes.c_size_t(page), 3) == 0  # readable again, to unmap
    del out


def test_a_score_epilogue_runs_on_the_tiles_vectors_only_when_every_lane_is_a_plain_sum_or_product():
    """Scale and a mask read along the keys: vector code (the mask one load per 8 keys). A max
    (a clamp) or a select has no vector spelling here, and a read that moves by more than one
    along the keys is no single load: those keep the per-score pass (None)."""
    from lumos.compile.ir.graph import Op, View
    from lumos.compile.kernel.ir import Affine, Binary, Let, Load, Num, Reduce, Ref, Var
    from lumos.compile.kernel.online_softmax import vector_epilogue
    from lumos.compile.kernel.passes import ScoreDot
    from lumos.compile.render.cstyle import C, block_lines, expr

    def _vector_epilogue(scores: ScoreDot, score: Ref) -> tuple[list[str], str] | None:
        found = vector_epilogue(scores, score)
        return None if found is None else (block_lines(found[0], C), expr(found[1]))

    def mask(stride: int) -> Load:
        view = View((4, 17), (17 * stride, stride))
        return Load("b9", Affine(0, ((17 * stride, Var("i0")), (stride, Var("j")))), view, (Var("i0"), Var("j")))

    def scores(*epilogue: Let) -> ScoreDot:
        dot = Reduce("acc1", Op.SUM, "r2", 16, [], Num(0.0))
        return ScoreDot(dot, mask(1), Num(1.0), list(epilogue))

    scaled = Let("v1", Binary(Op.MUL, Ref("acc1"), Num(0.25)))
    lines, score = _vector_epilogue(scores(scaled, Let("v2", Binary(Op.ADD, Ref("v1"), mask(1)))), Ref("v2"))
    assert lines == ["const lumos_f8 v1 = (acc1 * 0.25f);", "const lumos_f8 v2 = (v1 + lumos_load8(&b9[(17 * i0 + j)]));"]
    assert score == "v2"
    assert _vector_epilogue(scores(scaled, Let("v2", Binary(Op.ADD, Ref("v1"), mask(2)))), Ref("v2")) is None
    assert _vector_epilogue(scores(scaled, Let("v2", Binary(Op.MAX, Ref("v1"), Num(-5.0)))), Ref("v2")) is None
    assert _vector_epilogue(scores(scaled), Ref("elsewhere")) is None  # a value not computed from the product


def test_the_fused_attention_writes_the_merged_heads(kernel_cache):
    """x (B, T, H·D) → q, k, v projected and split into heads → attention → heads merged back
    (a copy that reorders the output's dims, stored: the output projection reads it) → + x. The
    fused kernel writes the merged heads itself: no kernel of its own for the copy."""
    rng = np.random.default_rng(8)
    graph = Graph()
    B, T, H, D = 2, 19, 2, 8
    x = Tensor.input(graph, "x", (B, T, H * D))
    mask = Tensor.input(graph, "mask", (B, 1, 1, T))
    w = {name: Tensor.constant(graph, name, rng.standard_normal((H * D, H * D)).astype(np.float32) * 0.3)
         for name in ("wq", "wk", "wv", "wo")}
    q, k, v = (x.linear(w[name]).reshape(B, T, H, D).transpose(1, 2) for name in ("wq", "wk", "wv"))
    mark_output(graph, "y", attention(q, k, v, mask).transpose(1, 2).reshape(B, T, H * D).linear(w["wo"]) + x)
    graph = graph.prune()
    inputs = {"x": rng.standard_normal((B, T, H * D)).astype(np.float32),
              "mask": (rng.random((B, 1, 1, T)) > 0.3).astype(np.float32)}
    inputs["mask"][..., 0] = 1.0
    compilation = compile_graph(graph, kernel_cache)
    kernels, materialized, used = fuse_attention(graph, compilation.materialized, find_attention(graph)[0])
    (fused,) = [kernel for kernel in kernels if kernel.attention is not None]
    assert used[0].store is fused.node and fused.node.shape == (B, T, H, D)
    assert used[0].out not in materialized and [k for k in kernels if k.node is fused.node] == [fused]
    got, source = run_fused(graph, inputs, kernel_cache, kernels, materialized, plan_buffers(graph, kernels),
                            {kernel.name: KernelSchedule(rows=4) for kernel in kernels})
    assert "(its dims reordered)" in source
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)
