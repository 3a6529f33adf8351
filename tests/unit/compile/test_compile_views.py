"""Views: every movement op is a view whose reads match numpy, and none adds a node."""

from __future__ import annotations

import numpy as np
import pytest

from lumos.compile.ir.graph import Graph, IRError, Op, View, check_graph, mark_batch
from lumos.compile.ir.hl_ops import Tensor
from lumos.compile.ir.interpret import read_view

SOURCE = np.arange(3 * 17 * 5, dtype=np.float32).reshape(3, 17, 5)


def through(view: View) -> np.ndarray:
    return read_view(SOURCE, view)


def test_permute_expand_shrink_pad_match_numpy():
    base = View.contiguous(SOURCE.shape)
    np.testing.assert_array_equal(through(base.permute((2, 0, 1))), SOURCE.transpose(2, 0, 1))
    sliced = base.shrink(((1, 3), (2, 15), (0, 5)), (1, 3, 2))
    np.testing.assert_array_equal(through(sliced), SOURCE[1:3, 2:15:3, 0:5:2])
    padded = base.pad(((0, 0), (1, 2), (3, 0)))
    np.testing.assert_array_equal(through(padded), np.pad(SOURCE, ((0, 0), (1, 2), (3, 0))))
    column = base.shrink(((0, 3), (4, 5), (0, 5)))
    np.testing.assert_array_equal(through(column.expand((3, 7, 5))), np.broadcast_to(SOURCE[:, 4:5], (3, 7, 5)))
    # A slice of padding: the mask moves with it.
    np.testing.assert_array_equal(through(padded.shrink(((0, 3), (0, 4), (2, 6)))),
                                  np.pad(SOURCE, ((0, 0), (1, 2), (3, 0)))[:, 0:4, 2:6])


def test_reshape_splits_and_merges_strided_dims_or_refuses():
    base = View.contiguous(SOURCE.shape)
    split = base.reshape((3, 17, 5, 1))
    np.testing.assert_array_equal(through(split), SOURCE.reshape(3, 17, 5, 1))
    transposed = base.permute((2, 0, 1))  # (5, 3, 17)
    merged = transposed.reshape((5, 51))  # the last two dims are still one stretch of memory
    np.testing.assert_array_equal(through(merged), SOURCE.transpose(2, 0, 1).reshape(5, 51))
    assert base.permute((0, 2, 1)).reshape((3, 85)) is None  # needs a copy


def test_movement_ops_add_no_nodes_but_an_impossible_reshape_copies():
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 17, 5))
    y = x.permute(2, 0, 1).slice(2, 1, 9, 2).pad(((0, 0), (1, 1), (0, 0))).unsqueeze(0).expand(2, 5, 5, 4)
    assert len(graph.nodes) == 1 and y.shape == (2, 5, 5, 4)
    z = x.transpose(1, 2).reshape(3, 85)
    assert [node.op for node in graph.nodes] == [Op.INPUT, Op.CONST, Op.ADD] and z.shape == (3, 85)


def test_check_graph_names_a_broken_invariant():
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 4))
    graph.add(Op.ADD, (x.node, x.node), (View.contiguous((3, 4)), View.contiguous((3, 5))), (3, 4), origin="here")
    with pytest.raises(IRError, match="reads past the end"):
        check_graph(graph)


def _traced(rows: int, reduce_batch: bool) -> Graph:
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, 5))
    y = x.sum(0, keepdim=True).broadcast_to((rows, 5)) if reduce_batch else (x * 2.0).softmax(-1)
    graph.outputs["y"] = (y + 0.0).node
    return graph


def test_batch_is_symbolic_unless_something_mixes_rows():
    graph = _traced(3, reduce_batch=False)
    assert mark_batch(graph, _traced(4, reduce_batch=False)) and graph.batch == 3
    assert all(node.batched for node in graph.nodes if node.op is not Op.CONST)
    graph = _traced(3, reduce_batch=True)
    assert not mark_batch(graph, _traced(4, reduce_batch=True)) and graph.batch is None
