"""Fusion as e-graph rewrites (egraph/programs.py) and the search over the extracted programs
(search/genome.py): the e-graph proposes programs the scheduler would not make, every one of
them computes what the interpreter computes, and the climb keeps only verified programs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lumos.cli.compile import program_lines
from lumos.compile.egraph.programs import program_space
from lumos.compile.ir.graph import Graph, check_graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.schedule.kernels import choose_materialized
from lumos.compile.search.climb import Bench, random_inputs
from lumos.compile.search.genome import climb_programs, propose

CFLAGS = ("-O3", "-march=native", "-fopenmp")


def _shared_chain(rows: int = 5, width: int = 33) -> Graph:
    """A chain of six elementwise ops read by two reductions: the scheduler stores it (more than
    four ops, two consumers); fusing everything legal recomputes it in both."""
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, width))
    w = Tensor.input(graph, "w", (width,))
    h = ((x * w + 1.0).exp() * 0.5 + x.abs()).sqrt()
    mark_output(graph, "sum", (h * 3.0).sum(-1, keepdim=True))
    mark_output(graph, "max", h.max(-1, keepdim=True))
    graph.prune()
    check_graph(graph)
    return graph


def _layer_norms(rows: int, width: int, norms: int = 2) -> Graph:
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, width))
    for layer in range(norms):
        x = x.layer_norm(Tensor.input(graph, f"w{layer}", (width,)), Tensor.input(graph, f"b{layer}", (width,)), 1e-5)
        x = x.gelu() if layer < norms - 1 else x
    mark_output(graph, "y", x)
    graph.prune()
    check_graph(graph)
    return graph


def _mlp(rows: int = 6) -> Graph:
    """Linear → GELU → linear → residual → layer norm: products, prologues, epilogues."""
    rng = np.random.default_rng(0)
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, 16))
    hidden = x.linear(Tensor.constant(graph, "w1", rng.standard_normal((24, 16)) * 0.3),
                      Tensor.constant(graph, "b1", rng.standard_normal(24))).gelu()
    out = hidden.linear(Tensor.constant(graph, "w2", rng.standard_normal((16, 24)) * 0.3)) + x
    mark_output(graph, "y", out.layer_norm(None, None, 1e-5))
    graph.prune()
    check_graph(graph)
    return graph


def _bench(graph: Graph, kernel_cache, seed: int = 0) -> Bench:
    return Bench(graph, set(), random_inputs(graph, seed), kernel_cache, "gcc", CFLAGS)


def test_the_scheduler_program_is_one_extraction_among_several():
    for graph in (_shared_chain(), _layer_norms(4, 9), _mlp()):
        space = program_space(graph)
        extractions = space.extractions()
        assert extractions["scheduler"] == choose_materialized(graph)
        assert set(extractions) == {"scheduler", "fuse all legal", "memory traffic"}
        for stored in extractions.values():  # no extraction inlines what the legality facts force
            assert space.forced <= stored


def test_the_egraph_proposes_a_fusion_the_scheduler_does_not_make():
    graph = _shared_chain()
    found = propose(graph)
    assert found.rules.get("recompute instead of store") and found.rules.get("fuse producer into consumer")
    recompute = [p for p in found.proposals if p.kind == "recompute"]
    assert recompute, [p.describe() for p in found.proposals]
    chain = recompute[0].nodes[0]
    assert chain in choose_materialized(graph)  # the scheduler stores it
    fused = found.build(frozenset({recompute[0].key}))
    assert chain not in fused.materialized
    assert len(fused.kernels) < len(found.build(frozenset()).kernels)


@pytest.mark.parametrize("make", [_shared_chain, lambda: _layer_norms(7, 17), pytest.param(_mlp, marks=pytest.mark.slow)],
                         ids=["chain", "norms", "mlp"])
def test_every_extracted_program_computes_what_the_interpreter_does(make, kernel_cache):
    graph = make()
    found = propose(graph)
    space = found.space
    programs = {name: (stored, None) for name, stored in space.extractions().items()}
    for proposal in found.proposals:  # each gene alone, and all of them at once
        programs[proposal.describe()] = (None, frozenset({proposal.key}))
    programs["every gene"] = (None, frozenset(p.key for p in found.proposals))
    bench = _bench(graph, kernel_cache)
    want = interpret(graph, bench.inputs)
    fingerprints = set()
    for name, (stored, genes) in programs.items():
        if genes is not None:
            program = found.build(genes)
            kernels, stored = program.kernels, program.materialized
        else:
            from lumos.compile.schedule.kernels import build_kernels
            kernels = build_kernels(graph, stored)
        fingerprints.add((frozenset(stored), tuple(len(k.outputs) for k in kernels)))
        native, _ = bench.program(kernels, stored, {}, reuse=True)
        got = native(bench.inputs)
        for output in graph.outputs:
            np.testing.assert_allclose(got[output].reshape(want[output].shape), want[output], rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name}: {output}")
    assert len(fingerprints) >= 2  # the e-graph offered more than the scheduler's program


def test_the_climb_times_each_program_once_and_keeps_only_verified_ones(kernel_cache):
    graph = _layer_norms(16, 33)
    found = propose(graph)
    assert any(p.kind == "siblings" for p in found.proposals)
    best = climb_programs(found, _bench(graph, kernel_cache), budget_s=15.0, max_steps=3)
    tried = found.tried
    assert tried[0].genes == frozenset() and tried[0].ms is not None  # the scheduler's program first
    assert len({program.fingerprint for program in tried}) == len(tried)
    assert best in tried and best.ms is not None and not best.rejected
    report = found.report()
    assert len(report["tried"]) == len(tried) and sum(t["kept"] for t in report["tried"]) == 1
    assert {p["kind"] for p in report["proposed"]} >= {"siblings"}


def test_explain_lists_the_proposals_and_which_were_kept(kernel_cache):
    graph = _shared_chain(rows=32)
    options = Options(egraph_fusion=True, search_budget_s=4.0, search_cache=False)
    compilation = compile_graph(graph, kernel_cache, options)
    programs = compilation.programs
    lines = program_lines(programs)
    assert lines[0].startswith(f"e-graph programs: {len(programs['proposed'])} proposals the scheduler would not make")
    assert any("recompute sqrt[32, 33]" in line and line.lstrip().startswith(("kept", "not kept")) for line in lines)
    assert any(line.startswith("  timed [the scheduler's program]") for line in lines)
    inputs = random_inputs(graph, 1)
    got, want = load_program(compilation)(inputs), interpret(graph, inputs)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], rtol=1e-4, atol=1e-4)


def test_the_kept_genome_is_cached(kernel_cache):
    """A second compile of the same graph on this machine takes the kept genome from the search
    cache and times nothing."""
    options = Options(egraph_fusion=True, search_budget_s=2.0)
    first = compile_graph(_shared_chain(rows=24), kernel_cache, options)
    again = compile_graph(_shared_chain(rows=24), kernel_cache, options)
    assert again.programs["cached"] and "cached" not in first.programs
    assert again.programs["kept"] == first.programs["kept"]
    assert [len(k.outputs) for k in again.kernels] == [len(k.outputs) for k in first.kernels]


def test_without_a_budget_the_proposals_are_reported_and_the_program_is_the_schedulers(kernel_cache):
    graph = _shared_chain()
    plain = compile_graph(graph, kernel_cache, Options())
    proposed = compile_graph(_shared_chain(), kernel_cache, Options(egraph_fusion=True))
    assert plain.programs is None and proposed.programs["proposed"] and not proposed.programs["tried"]
    assert proposed.source == plain.source


@pytest.mark.parametrize("rows, width, offset", [(1, 1, 0.0), (7, 3, 0.0), (19, 17, 1000.0), (9, 783, 1000.0),
                                                 (5, 1025, 1e4), (13, 64, -3.0)])
def test_layer_norm_statistics_in_one_kernel_against_torch(rows, width, offset, kernel_cache):
    """The sibling gene puts a layer norm's mean and variance in one kernel, two-pass: the mean over
    the row first, then Σ(x − mean)² over the same row, still in cache. Two-pass rather than
    Welford: the same arithmetic as two kernels (bit-identical results, asserted), vectorizable
    sums with no division per element, and no E[x²] − E[x]² cancellation on rows far from zero.
    Against torch in float64 on awkward shapes (one column, odd widths, rows not a multiple of the
    block of 8, means of 1000 and 1e4); the largest error seen is printed (pytest -s)."""
    graph = _layer_norms(rows, width, norms=1)
    found = propose(graph)
    siblings = frozenset(p.key for p in found.proposals if p.kind == "siblings")
    joined, separate = found.build(siblings), found.build(frozenset())
    if width > 1:
        assert [len(kernel.outputs) for kernel in joined.kernels][0] == 2  # mean and variance: one kernel
    bench = _bench(graph, kernel_cache)
    inputs = {name: value + (np.float32(offset) if name == "x" else 0) for name, value in bench.inputs.items()}
    got = bench.program(joined.kernels, joined.materialized, {}, reuse=True)[0](inputs)["y"].reshape(rows, width)
    apart = bench.program(separate.kernels, separate.materialized, {}, reuse=True)[0](inputs)["y"].reshape(rows, width)
    np.testing.assert_array_equal(got, apart)
    t = {name: torch.from_numpy(value).double() for name, value in inputs.items()}
    want = F.layer_norm(t["x"], (width,), t["w0"], t["b0"], 1e-5).numpy()
    error = float(np.max(np.abs(got - want)))
    print(f"layer norm {rows}×{width} + {offset}: max error {error:.2e} against torch (float64)")
    spacing = float(np.spacing(np.float32(abs(offset) + 4)))  # float32's step at the row's values
    assert error <= 1e-4 + 8 * spacing * float(np.max(np.abs(inputs["w0"])))
