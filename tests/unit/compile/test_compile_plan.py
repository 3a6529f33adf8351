"""Scheduling and buffer planning: fusion, reuse lowering peak memory, no live buffers overlapping."""

from __future__ import annotations

import numpy as np

from lumos.compile.ir.graph import Graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.schedule.buffers import plan_buffers
from lumos.compile.schedule.kernels import schedule


def mlp_stack(layers: int = 4) -> tuple[Graph, dict[str, np.ndarray]]:
    """x → (linear → gelu) × layers → layer norm: a chain whose intermediates die one by one."""
    rng = np.random.default_rng(1)
    graph = Graph()
    x = Tensor.input(graph, "x", (5, 17, 8))
    inputs = {"x": rng.standard_normal((5, 17, 8)).astype(np.float32)}
    for layer in range(layers):
        w = Tensor.constant(graph, f"w{layer}", rng.standard_normal((8, 8)).astype(np.float32) * 0.3)
        x = x.linear(w).gelu()
    mark_output(graph, "y", x.layer_norm(None, None, 1e-5))
    return graph.prune(), inputs


def test_elementwise_chains_fuse_into_their_reduction():
    graph, _ = mlp_stack(1)
    kernels, _ = schedule(graph)
    matmul = kernels[0]
    # The matmul's multiply is computed inside the reduction, and gelu's chain after it.
    assert matmul.kind == "reduce" and len({id(n) for n in matmul.fused}) > 10
    assert len(kernels) < sum(1 for node in graph.nodes if node.op.name not in ("INPUT", "CONST")) // 5


def test_reuse_lowers_peak_memory_and_live_buffers_never_overlap():
    graph, _ = mlp_stack(4)
    kernels, _ = schedule(graph)
    shared, unshared = plan_buffers(graph, kernels), plan_buffers(graph, kernels, reuse=False)
    assert shared.arena_bytes < unshared.arena_bytes == shared.unshared_bytes < shared.per_node_bytes
    buffers = list(shared.buffers.values())
    for a in buffers:
        for b in buffers:
            if a is not b and a.first <= b.last and b.first <= a.last:
                assert a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset, (a, b)


def test_shared_and_unshared_plans_compute_the_same(kernel_cache):
    graph, inputs = mlp_stack(4)
    shared = load_program(compile_graph(graph, kernel_cache))(inputs)["y"]
    unshared = load_program(compile_graph(graph, kernel_cache, Options(reuse_buffers=False)))(inputs)["y"]
    np.testing.assert_array_equal(shared, unshared)


def test_kernels_skip_a_barrier_only_when_independent():
    from lumos.compile.render.c import barriers

    graph = Graph()
    x = Tensor.input(graph, "x", (5, 8))
    w = Tensor.constant(graph, "w", np.ones((8, 8), np.float32))
    a, b = x.linear(w), (x * 2.0).exp()  # independent: no barrier between them
    mark_output(graph, "a", a)
    mark_output(graph, "b", b)
    mark_output(graph, "y", (a + b).softmax(-1))
    graph.prune()
    kernels, _ = schedule(graph)
    keep = barriers(graph, kernels, plan_buffers(graph, kernels))
    assert keep[-1] and not all(keep)
    start = 0
    for index, barrier in enumerate(keep):  # within a run between barriers, nothing reads another's output
        if barrier:
            run = kernels[start:index + 1]
            written = {kernel.node for kernel in run}
            assert not any(node in written for kernel in run for node in kernel.reads)
            start = index + 1
