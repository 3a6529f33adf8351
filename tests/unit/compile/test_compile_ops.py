"""Every primitive and high-level op against PyTorch, in the interpreter and in generated C.

All cases go into one graph (one output each), so the C backend builds one library for them all.
Sizes are awkward (3, 17, 6), operands broadcast and come through non-contiguous views.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lumos.compile.ir.graph import LEAF, Graph, Op, check_graph
from lumos.compile.ir.hl_ops import Tensor, attention, cat, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import compile_graph, load_program

rng = np.random.default_rng(0)
INPUTS = {
    "x": rng.standard_normal((3, 17, 6)).astype(np.float32),
    "pos": (rng.random((3, 17, 6)) + 0.1).astype(np.float32),
    "row": rng.standard_normal((6,)).astype(np.float32),
    "w": rng.standard_normal((5, 6)).astype(np.float32),
    "y": rng.standard_normal((3, 6, 17)).astype(np.float32),
    "ids": rng.integers(0, 7, (3, 17)).astype(np.float32),
    "table": rng.standard_normal((7, 6)).astype(np.float32),
    "mask": (rng.random((3, 17)) < 0.7).astype(np.float32),
}
INPUTS["mask"][:, 0] = 1.0  # every row has a key to attend to
T = {name: torch.from_numpy(value) for name, value in INPUTS.items()}


def attention_reference(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, :])


# name → (lowering with hl_ops, reference with torch)
CASES = {
    # primitives
    "exp2": (lambda t: t["x"].exp2(), lambda t: torch.exp2(t["x"])),
    "log2": (lambda t: t["pos"].log2(), lambda t: torch.log2(t["pos"])),
    "sin": (lambda t: t["x"].sin(), lambda t: torch.sin(t["x"])),
    "recip": (lambda t: t["pos"].recip(), lambda t: 1 / t["pos"]),
    "sqrt": (lambda t: t["pos"].sqrt(), lambda t: torch.sqrt(t["pos"])),
    "add_broadcast": (lambda t: t["x"] + t["row"], lambda t: t["x"] + t["row"]),
    "mul_transposed": (lambda t: t["x"] * t["y"].transpose(1, 2), lambda t: t["x"] * t["y"].transpose(1, 2)),
    "mod": (lambda t: (t["x"] * 5.0) % 1.5, lambda t: torch.fmod(t["x"] * 5, 1.5)),
    "less_than": (lambda t: t["x"] < t["row"], lambda t: (t["x"] < t["row"]).float()),
    "sum_middle_axis": (lambda t: t["x"].sum(1), lambda t: t["x"].sum(1)),
    "max_last_axis": (lambda t: t["x"].max(-1), lambda t: t["x"].amax(-1)),
    "gather": (lambda t: t["table"].embedding(t["ids"]), lambda t: F.embedding(t["ids"].long(), t["table"])),
    # high level
    "sub": (lambda t: t["x"] - t["pos"], lambda t: t["x"] - t["pos"]),
    "neg": (lambda t: -t["x"], lambda t: -t["x"]),
    "div": (lambda t: t["x"] / t["pos"], lambda t: t["x"] / t["pos"]),
    "exp": (lambda t: t["x"].exp(), lambda t: torch.exp(t["x"])),
    "log": (lambda t: t["pos"].log(), lambda t: torch.log(t["pos"])),
    "log1p": (lambda t: t["pos"].log1p(), lambda t: torch.log1p(t["pos"])),
    "maximum": (lambda t: t["x"].maximum(t["row"]), lambda t: torch.maximum(t["x"], t["row"])),
    "minimum": (lambda t: t["x"].minimum(t["row"]), lambda t: torch.minimum(t["x"], t["row"])),
    "relu": (lambda t: t["x"].relu(), lambda t: torch.relu(t["x"])),
    "sign_abs": (lambda t: t["x"].sign() + t["x"].abs(), lambda t: torch.sign(t["x"]) + torch.abs(t["x"])),
    "clamp": (lambda t: t["x"].clamp(-0.5, 0.7), lambda t: t["x"].clamp(-0.5, 0.7)),
    "tanh": (lambda t: t["x"].tanh(), lambda t: torch.tanh(t["x"])),
    "gelu": (lambda t: (t["x"] * 3.0).gelu(), lambda t: F.gelu(t["x"] * 3)),
    "gelu_tanh": (lambda t: t["x"].gelu("tanh"), lambda t: F.gelu(t["x"], approximate="tanh")),
    "mean": (lambda t: t["x"].mean(1, keepdim=True), lambda t: t["x"].mean(1, keepdim=True)),
    "var": (lambda t: t["x"].var(-1), lambda t: t["x"].var(-1, unbiased=False)),
    "softmax": (lambda t: t["x"].softmax(1), lambda t: torch.softmax(t["x"], 1)),
    "layer_norm": (lambda t: t["x"].layer_norm(t["row"], t["row"] * 0.5, 1e-5),
                   lambda t: F.layer_norm(t["x"], (6,), t["row"], t["row"] * 0.5)),
    "matmul_batched": (lambda t: t["x"].matmul(t["y"]), lambda t: t["x"] @ t["y"]),
    "linear": (lambda t: t["x"].linear(t["w"], t["w"].select(1, 0)), lambda t: F.linear(t["x"], t["w"], t["w"][:, 0])),
    "matmul_broadcast": (lambda t: t["y"].transpose(1, 2).matmul(t["w"].transpose(0, 1)),
                         lambda t: t["y"].transpose(1, 2) @ t["w"].T),
    "where": (lambda t: (t["x"] < 0.0).where(t["pos"], t["x"]), lambda t: torch.where(t["x"] < 0, t["pos"], t["x"])),
    "masked_fill": (lambda t: t["x"].masked_fill(t["mask"].unsqueeze(-1), -2.0),
                    lambda t: t["x"].masked_fill(t["mask"].bool()[..., None], -2.0)),
    "cat": (lambda t: cat([t["x"], t["pos"].slice(1, 0, 4)], 1), lambda t: torch.cat([t["x"], t["pos"][:, :4]], 1)),
    "strided_slice_pad": (lambda t: t["x"].slice(1, 1, 17, 3).pad(((0, 0), (2, 1), (0, 0))),
                          lambda t: F.pad(t["x"][:, 1::3], (0, 0, 2, 1))),
    "reshape_copy": (lambda t: t["y"].transpose(1, 2).reshape(3, 102) * 2.0,
                     lambda t: t["y"].transpose(1, 2).reshape(3, 102) * 2),
    "inline_through_merging_reshape": (lambda t: ((t["y"] * 2.0).reshape(3, 102) + 1.0).sum(-1),
                                       lambda t: ((t["y"] * 2).reshape(3, 102) + 1).sum(-1)),
    "attention_masked": (lambda t: attention(t["x"], t["x"] * 0.5, t["pos"], t["mask"].unsqueeze(1)),
                         lambda t: attention_reference(t["x"], t["x"] * 0.5, t["pos"], t["mask"])),
    "softmax_of_sum_of_matmul": (lambda t: (t["x"].matmul(t["y"]).sum(-1, keepdim=True) * 0.1).softmax(1).sum(1),
                                 lambda t: torch.softmax((t["x"] @ t["y"]).sum(-1, keepdim=True) * 0.1, 1).sum(1)),
}


@pytest.fixture(scope="module")
def graph() -> Graph:
    graph = Graph()
    tensors = {name: Tensor.input(graph, name, value.shape) for name, value in INPUTS.items()}
    for name, (lower, _) in CASES.items():
        mark_output(graph, name, lower(tensors))
    graph.prune()
    check_graph(graph)
    return graph


@pytest.fixture(scope="module")
def native_outputs(graph, kernel_cache) -> dict[str, np.ndarray]:
    program = load_program(compile_graph(graph, kernel_cache))
    program.threads = 3  # more threads than cores: kernels that skip a barrier must still be independent
    out = program({name: INPUTS[name] for name in graph.inputs})
    return {name: value.reshape(graph.output_shapes[name]) for name, value in out.items()}


@pytest.fixture(scope="module")
def interpreted(graph) -> dict[str, np.ndarray]:
    return interpret(graph, {name: INPUTS[name] for name in graph.inputs})


def _check(name: str, got: np.ndarray) -> None:
    want = CASES[name][1](T).numpy()
    assert got.shape == want.shape, name
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_matches_torch(name, interpreted):
    _check(name, interpreted[name])


@pytest.mark.parametrize("name", list(CASES))
def test_generated_c_matches_torch(name, native_outputs):
    _check(name, native_outputs[name])


def test_every_primitive_op_is_covered(graph):
    used = {node.op for node in graph.nodes}
    assert set(Op) - LEAF - used == set(), "add a case for every primitive"


@pytest.mark.parametrize("case", ["linear", "matmul_transposed", "attention", "sum_of_products_over_a_broadcast_axis"])
def test_products_are_summed_without_their_product_array_and_agree(case):
    """The interpreter sums a matrix product (a MUL read only by a SUM) by einsum over each
    operand's own axes; it must give what the MUL-then-SUM primitives give."""
    from lumos.compile.ir.interpret import read_view, run_node, summed_products

    graph = Graph()
    t = {name: Tensor.input(graph, name, value.shape) for name, value in INPUTS.items()}
    out = {
        "linear": lambda: t["x"].linear(t["w"]),
        "matmul_transposed": lambda: t["x"].matmul(t["y"].transpose(1, 2).transpose(1, 2)),
        "attention": lambda: attention(t["x"], t["pos"], t["x"], t["mask"].unsqueeze(1)),
        "sum_of_products_over_a_broadcast_axis": lambda: (t["x"] * t["row"]).sum(1),
    }[case]()
    mark_output(graph, "out", out)
    graph = graph.prune()
    assert summed_products(graph), "the case holds a product the interpreter sums by einsum"
    naive = {}
    for node in graph.nodes:
        naive[node] = (np.asarray(INPUTS[node.arg], np.float32) if node.op is Op.INPUT else
                       run_node(node, [read_view(naive[s], v) for s, v in zip(node.srcs, node.views, strict=True)], graph.tensors))
    np.testing.assert_allclose(interpret(graph, INPUTS)["out"], naive[graph.outputs["out"]].reshape(out.shape),
                               rtol=1e-5, atol=1e-5)
