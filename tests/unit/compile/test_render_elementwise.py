"""The element loop of a fused kernel: short reductions written out, loop versioning on a padding
condition that the element loop does not change, both exact against the interpreter."""

from __future__ import annotations

import re

import numpy as np

from lumos.compile.ir.graph import Graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import compile_graph, load_program


def padded_projection(batch: int, steps: int, features: int, width: int) -> tuple[Graph, dict[str, np.ndarray]]:
    """cat([user, x @ Wᵀ + b]) along the sequence: the encoder's input, a linear layer over a few
    numeric features behind a one-step pad (the user token's slot)."""
    rng = np.random.default_rng(11)
    graph = Graph()
    x = Tensor.input(graph, "x", (batch, steps, features))
    user = Tensor.input(graph, "user", (batch, 1, width))
    w = Tensor.constant(graph, "w", rng.standard_normal((width, features)).astype(np.float32))
    b = Tensor.constant(graph, "b", rng.standard_normal((width,)).astype(np.float32))
    projected = (x.unsqueeze(2) * w.reshape(1, 1, width, features)).sum(3) + b  # (B, T, C)
    joined = projected.pad([(0, 0), (1, 0), (0, 0)]) + user.pad([(0, 0), (0, steps), (0, 0)])
    mark_output(graph, "y", joined * 2.0)
    inputs = {"x": rng.standard_normal((batch, steps, features)).astype(np.float32),
              "user": rng.standard_normal((batch, 1, width)).astype(np.float32)}
    return graph.prune(), inputs


def test_short_reductions_are_written_out_and_padding_versions_the_element_loop(kernel_cache):
    graph, inputs = padded_projection(3, 7, 2, 24)
    compilation = compile_graph(graph, kernel_cache)
    assert len(compilation.kernels) == 1, "the projection is fused into the padded sum"
    source = compilation.source
    assert not re.search(r"for \(int r\d+", source), "a 2-long reduction needs no loop"
    assert "if (i1 >= 1) {" in source and "} else {" in source
    got = load_program(compilation)(inputs)["y"]
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)


def test_longer_reductions_keep_their_loop(kernel_cache):
    graph, inputs = padded_projection(2, 5, 9, 16)
    compilation = compile_graph(graph, kernel_cache)
    assert re.search(r"for \(int r\d+ = 0; r\d+ < 9;", compilation.source)
    got = load_program(compilation)(inputs)["y"]
    np.testing.assert_allclose(got, interpret(graph, inputs)["y"], atol=1e-5, rtol=1e-5)
