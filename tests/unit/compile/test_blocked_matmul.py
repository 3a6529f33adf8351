"""The register-blocked matmul micro-kernel: exact at sizes no block divides, one verified search
candidate among the others, and rejected by the search when it computes something else."""

from __future__ import annotations

import re

import numpy as np
import pytest

from lumos.compile.egraph.schedule import schedule_candidates
from lumos.compile.ir.graph import Graph, Op
from lumos.compile.ir.hl_ops import Tensor, attention, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.kernel import tiles
from lumos.compile.kernel.cpu_ir import For, MulAdd
from lumos.compile.kernel.ir import Binary
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.render.c import render_library, tensor_names
from lumos.compile.runtime.kernel_cache import gcc
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.schedule.kernels import KernelSchedule


def block_layer(batch: int, rows: int, width: int, hidden: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """x + W2·gelu(W1·layer_norm(x) + b1): a matmul with a fused prologue (layer norm), one with
    epilogues (bias, GELU; residual) and one whose prologue is GELU."""
    rng = np.random.default_rng(7)
    graph = Graph()
    x = Tensor.input(graph, "x", (batch, rows, width))
    w1 = Tensor.constant(graph, "w1", rng.standard_normal((hidden, width)).astype(np.float32) * 0.3)
    b1 = Tensor.constant(graph, "b1", rng.standard_normal((hidden,)).astype(np.float32))
    w2 = Tensor.constant(graph, "w2", rng.standard_normal((width, hidden)).astype(np.float32) * 0.3)
    h = x.layer_norm(None, None, 1e-5).linear(w1, b1).gelu()
    mark_output(graph, "y", x + h.linear(w2))
    return graph.prune(), {"x": rng.standard_normal((batch, rows, width)).astype(np.float32)}


def run_with(graph: Graph, inputs, kernel_cache, schedule: KernelSchedule) -> tuple[np.ndarray, str]:
    """The program with `schedule` on every kernel: its output and its C."""
    compilation = compile_graph(graph, kernel_cache)
    source = render_library(graph, compilation.kernels, compilation.materialized, compilation.buffers,
                            {kernel.name: schedule for kernel in compilation.kernels})
    program = NativeProgram(kernel_cache.build(source, gcc("gcc", Options().cflags)).library,
                            [(n, v.shape) for n, v in graph.inputs.items()], [(n, v.shape) for n, v in graph.outputs.items()],
                            [graph.tensors[n] for n in tensor_names(graph)], compilation.buffers.arena_bytes)
    return program(inputs)["y"], source


@pytest.mark.parametrize("sizes", [(3, 17, 19, 37), (2, 5, 24, 48), (1, 3, 7, 33)])
@pytest.mark.parametrize("block", [(4, 16, 0), (6, 16, 0), (2, 32, 0), (4, 32, 16), (2, 16, 16)])
def test_the_blocked_matmul_is_exact_when_no_block_divides_the_sizes(kernel_cache, sizes, block):
    """Row remainders (17 rows by 4 or 6; 3 rows in a block of 4 or 6), column remainders
    (37 = 2·16 + 5 = 32 + 5), odd reduction lengths (19, 7), with the prologue and epilogues fused;
    in vectors of 8 floats and of 16 (gcc splits those in two where the host lacks AVX-512)."""
    graph, inputs = block_layer(*sizes)
    rows, tile, lanes = block
    got, source = run_with(graph, inputs, kernel_cache, KernelSchedule(interchange=True, tile=tile, rows=rows, lanes=lanes))
    assert f"lumos_f{lanes or 8} acc" in source and "_blk[" in source  # the micro-kernel, in vectors of that width
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-4, rtol=1e-4)


def test_the_blocked_matmul_computes_attention_products(kernel_cache):
    """q·kᵀ and P·V: the shared operand depends on batch and head, so the rows blocked are the queries."""
    rng = np.random.default_rng(3)
    graph = Graph()
    q, k, v = (Tensor.input(graph, name, (2, 2, 11, 16)) * 0.5 for name in "qkv")  # computed (x·1 is removed)
    mask = Tensor.input(graph, "mask", (2, 1, 1, 11))
    mark_output(graph, "y", attention(q, k, v, mask))
    graph = graph.prune()
    inputs = {name: rng.standard_normal((2, 2, 11, 16)).astype(np.float32) for name in "qkv"}
    inputs["mask"] = (rng.random((2, 1, 1, 11)) > 0.3).astype(np.float32)
    inputs["mask"][..., 0] = 1.0
    got, source = run_with(graph, inputs, kernel_cache, KernelSchedule(interchange=True, tile=8, rows=4))
    assert len(re.findall(r"lumos_f8 \w+_blk\[", source)) == 2  # both products blocked
    want = interpret(graph, inputs)["y"]
    np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-4, rtol=1e-4)


def test_the_egraph_offers_blocks_for_matmuls_only(kernel_cache):
    graph, _ = block_layer(3, 17, 19, 37)
    compilation = compile_graph(graph, kernel_cache)
    offered = {kernel.kind: any(s.rows for s in schedule_candidates(kernel)[0]) for kernel in compilation.kernels}
    assert offered["reduce"] and not offered.get("elementwise", False)
    assert not any(s.rows for kernel in compilation.kernels  # the benchmark's "unblocked" search
                   for s in schedule_candidates(kernel, register_blocks=False)[0])


@pytest.mark.slow  # 40 s: test_a_wrong_blocked_kernel_is_rejected_and_never_chosen stays in the default run
def test_the_search_verifies_every_blocked_candidate(kernel_cache):
    graph, inputs = block_layer(3, 17, 19, 37)
    compilation = compile_graph(graph, kernel_cache, Options(search_budget_s=120, search_cache=False), inputs)
    blocked = [c for g in compilation.search.groups for c in g.candidates if c.schedule.rows]
    assert blocked and all(c.verified and c.ms is not None for c in blocked)  # all tried, none wrong
    got = load_program(compilation)(inputs)["y"]
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # 40-60 s of searching: CI's slow run
def test_a_wrong_blocked_kernel_is_rejected_and_never_chosen(kernel_cache, monkeypatch):
    """A bug only the micro-kernel has (each product added twice to its sums): every blocked
    candidate is rejected by the check against the interpreter, and the program stays right."""
    register_block = tiles.register_block

    def add_twice(stmts: list) -> None:
        for stmt in stmts:
            if isinstance(stmt, MulAdd):
                stmt.a = Binary(Op.ADD, stmt.a, stmt.a)
            elif isinstance(stmt, For):
                add_twice(stmt.body)

    def broken(ir, schedule, bfloat16=frozenset()):
        blocked = register_block(ir, schedule, bfloat16)
        if blocked is not None:
            add_twice(blocked.body)
        return blocked

    monkeypatch.setattr(tiles, "register_block", broken)
    graph, inputs = block_layer(3, 17, 19, 37)
    compilation = compile_graph(graph, kernel_cache, Options(search_budget_s=120, search_cache=False), inputs)
    blocked = [c for g in compilation.search.groups for c in g.candidates if c.schedule.rows]
    assert blocked and all(c.rejected == "differs from the interpreter" for c in blocked)
    assert not any(schedule.rows for schedule in compilation.schedules.values())
    got = load_program(compilation)(inputs)["y"]
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-4, rtol=1e-4)
