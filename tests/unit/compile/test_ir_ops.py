"""The op table (ir/ops.py) and the one definition of a matrix product (ir/graph.py)."""

from __future__ import annotations

import pytest

from lumos.compile.ir import ops
from lumos.compile.ir.graph import Graph, Op, is_matmul, is_product_sum, matmul_sum
from lumos.compile.ir.hl_ops import Tensor, mark_output


def test_an_op_without_a_row_fails_loudly(monkeypatch):
    monkeypatch.delitem(ops.OPS, Op.SIN)
    with pytest.raises(NotImplementedError, match="Op.SIN has no row"):
        ops._check_table()


def test_a_primitive_without_a_reference_fails_loudly(monkeypatch):
    monkeypatch.setitem(ops.OPS, Op.SIN, ops.OpInfo(ops.Group.UNARY, None, "sin"))
    with pytest.raises(NotImplementedError, match="Op.SIN: every op but a leaf"):
        ops._check_table()


def test_groups_are_read_off_the_table():
    assert ops.UNARY == {Op.EXP2, Op.LOG2, Op.SIN, Op.RECIP, Op.SQRT}
    assert ops.REDUCE == {Op.SUM, Op.MAX}
    assert ops.COMMUTATIVE == {Op.ADD, Op.MUL}
    assert all(ops.OPS[op].arity == 2 for op in ops.BINARY | {Op.GATHER})


def _graph(build) -> tuple[Graph, dict]:
    graph = Graph()
    x, w = Tensor.input(graph, "x", (3, 5)), Tensor.input(graph, "w", (4, 5))
    mark_output(graph, "out", build(x, w))
    graph.prune()
    return graph, graph.consumers()


def test_a_linear_layer_is_one_matmul():
    graph, uses = _graph(lambda x, w: x.linear(w))
    (product,) = [node for node in graph.nodes if node.op is Op.MUL]
    (reduction,) = [node for node in graph.nodes if node.op is Op.SUM]
    assert matmul_sum(product, uses) is reduction
    assert is_matmul(reduction) and is_product_sum(reduction)


def _sum_and_max_of_squares(x, w):
    squares = x * x
    return x.linear(w) + squares.sum(1, keepdim=True) + squares.max(1, keepdim=True)


def test_a_product_read_twice_is_not_summed_as_a_matmul():
    graph, uses = _graph(_sum_and_max_of_squares)
    (squares,) = [node for node in graph.nodes if node.op is Op.MUL and len(uses[node]) == 2]
    assert matmul_sum(squares, uses) is None


def test_a_sum_over_one_element_is_not_a_matmul():
    graph, _ = _graph(lambda x, w: (x.unsqueeze(2) * x.unsqueeze(2)).sum(2))
    (reduction,) = [node for node in graph.nodes if node.op is Op.SUM]
    assert is_product_sum(reduction) and not is_matmul(reduction)
