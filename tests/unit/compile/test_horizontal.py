"""Horizontal fusion: linear layers on the same input become one matmul, and nothing else changes."""

from __future__ import annotations

import numpy as np
import torch

from lumos.compile.ir.graph import Graph, Op, View, check_graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.ir.interpret import interpret, read_view
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.schedule.horizontal import _column_range_view, fuse_linear_layers, weight_value

RNG = np.random.default_rng(0)
ROWS, LENGTH, WIDTH, HEADS = 3, 5, 8, 2
WEIGHTS = {
    "query.weight": RNG.normal(size=(WIDTH, WIDTH)), "query.bias": RNG.normal(size=WIDTH),
    "key_value.weight": RNG.normal(size=(2 * WIDTH, WIDTH)), "key_value.bias": RNG.normal(size=2 * WIDTH),
    "other.weight": RNG.normal(size=(WIDTH, WIDTH)),
}
X = RNG.normal(size=(ROWS, LENGTH, WIDTH)).astype(np.float32)


def attention_block() -> Graph:
    """Query and key/value projections of one normed input, split into heads, keys and values
    read at an offset: the views horizontal fusion must re-express. `other` reads another input."""
    graph = Graph()
    x = Tensor.input(graph, "x", X.shape)
    w = {name: Tensor.constant(graph, name, value) for name, value in WEIGHTS.items()}
    normed = x.layer_norm(None, None, 1e-5)
    q = normed.linear(w["query.weight"], w["query.bias"]).reshape(ROWS, LENGTH, HEADS, WIDTH // HEADS)
    kv = normed.linear(w["key_value.weight"], w["key_value.bias"])
    k = kv.slice(2, 0, WIDTH).reshape(ROWS, LENGTH, HEADS, WIDTH // HEADS)
    v = kv.slice(2, WIDTH, 2 * WIDTH).reshape(ROWS, LENGTH, HEADS, WIDTH // HEADS)
    out = ((q * k).sum(3, keepdim=True) * v).reshape(ROWS, LENGTH, WIDTH)
    out = out + x.exp().linear(w["other.weight"])
    mark_output(graph, "out", out)
    graph.prune()
    return graph


def matmul_weights(graph: Graph) -> list[str]:
    return sorted(src.arg for node in graph.nodes if node.op is Op.MUL for src in node.srcs
                  if src.op is Op.CONST and isinstance(src.arg, str) and len(src.shape) == 2)


def test_query_and_key_value_become_one_matmul_with_the_same_result():
    graph = attention_block()
    expected = interpret(graph, {"x": X})["out"]
    assert fuse_linear_layers(graph) == 1
    check_graph(graph)
    assert matmul_weights(graph) == ["other.weight", "query.weight|key_value.weight"]
    assert graph.tensors["query.weight|key_value.weight"].shape == (3 * WIDTH, WIDTH)
    assert "query.bias|key_value.bias" in graph.tensors
    np.testing.assert_allclose(interpret(graph, {"x": X})["out"], expected, rtol=1e-5, atol=1e-5)


def test_the_compiled_program_matches_with_and_without_the_fusion(kernel_cache):
    results = {}
    for fuse in (True, False):
        compilation = compile_graph(attention_block(), kernel_cache, Options(fuse_linear_layers=fuse))
        results[fuse] = load_program(compilation)({"x": X})["out"]
        assert any("|" in name for name in compilation.graph.tensors) == fuse
    np.testing.assert_allclose(results[True], results[False], rtol=1e-5, atol=1e-5)


def test_a_stored_plan_rebuilds_the_joined_weight_from_the_model():
    weights = {name: torch.from_numpy(value).float() for name, value in WEIGHTS.items()}
    joined = weight_value("query.weight|key_value.weight#T", weights)
    np.testing.assert_array_equal(joined, np.concatenate([WEIGHTS["query.weight"], WEIGHTS["key_value.weight"]]).T
                                  .astype(np.float32))
    assert weight_value("query.weight|missing.weight", weights) is None


def test_column_ranges_are_read_in_whole_rows_or_refused():
    rows, columns, width, start = 4, 6, 10, 3
    old = np.arange(rows * columns, dtype=np.float32).reshape(rows, columns)
    new = np.zeros((rows, width), np.float32)
    new[:, start:start + columns] = old
    heads = View((rows, 2, 3), (columns, 3, 1), offset=0)  # a head split of each row
    second = View((rows, 3), (columns, 1), offset=3)  # the second half of each row (a value slice)
    for view in (heads, second, View.contiguous((rows, columns)).permute((1, 0))):
        np.testing.assert_array_equal(read_view(new.ravel(), _column_range_view(view, columns, width, start)),
                                      read_view(old.ravel(), view))
    assert _column_range_view(View((12,), (2,)), columns, width, start) is None  # walks across rows
    assert _column_range_view(View.contiguous((rows, columns)).pad(((0, 0), (1, 0))), columns, width, start) is None
