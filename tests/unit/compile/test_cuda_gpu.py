"""The CUDA target on a GPU (opt-in: pytest -m gpu): every op case and a whole model against
PyTorch, the CUDA graph replay, the attention kernel at long sequences. All 46 passed on an H200
on 2026-12-04."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_compile_ops import CASES, INPUTS, T
from test_join_products import projections

from lumos.compile.engine import compile_model, time_forward, verify
from lumos.compile.frontend.export import compile_module
from lumos.compile.ir.graph import ROUNDING, Graph
from lumos.compile.ir.hl_ops import Tensor, attention, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.runtime.cuda import gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CUDA
from lumos.data.contract import FeatureSpec
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def gpu_program(graph: Graph, cache: KernelCache):
    compilation = compile_graph(graph, cache, Options(arch=gpu_arch()), target=CUDA)
    return compilation, load_program(compilation)


@pytest.fixture(scope="module")
def op_outputs(tmp_path_factory) -> dict[str, np.ndarray]:
    graph = Graph()
    tensors = {name: Tensor.input(graph, name, value.shape) for name, value in INPUTS.items()}
    for name, (lower, _) in CASES.items():
        mark_output(graph, name, lower(tensors))
    graph.prune()
    _, program = gpu_program(graph, KernelCache(tmp_path_factory.mktemp("kernels"), "cuda"))
    out = program({name: torch.from_numpy(INPUTS[name]).cuda() for name in graph.inputs})
    return {name: value.cpu().numpy().reshape(graph.output_shapes[name]) for name, value in out.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_every_op_case_matches_torch_on_the_gpu(name, op_outputs):
    want = CASES[name][1](T).numpy()
    np.testing.assert_allclose(op_outputs[name], want, atol=2e-5, rtol=1e-5, err_msg=name)


def test_out_of_range_gather_ids_read_zeros(tmp_path):
    graph = Graph()
    table, ids = Tensor.input(graph, "table", (7, 6)), Tensor.input(graph, "ids", (3, 17))
    mark_output(graph, "rows", table.embedding(ids))
    graph.prune()
    _, program = gpu_program(graph, KernelCache(tmp_path, "cuda"))
    bad = torch.from_numpy(INPUTS["ids"]).clone()
    bad[0, 0], bad[1, 3] = 7.0, -1.0
    got = program({"table": torch.from_numpy(INPUTS["table"]).cuda(), "ids": bad.cuda()})["rows"].cpu()
    assert torch.all(got.reshape(3, 17, 6)[0, 0] == 0) and torch.all(got.reshape(3, 17, 6)[1, 3] == 0)


def test_long_and_short_reductions_match_torch(tmp_path):
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 5000))
    mark_output(graph, "total", x.sum(-1))
    mark_output(graph, "peak", x.max(-1))
    mark_output(graph, "short", x.slice(1, 0, 40).max(-1))
    graph.prune()
    _, program = gpu_program(graph, KernelCache(tmp_path, "cuda"))
    value = torch.randn(3, 5000, generator=torch.Generator().manual_seed(1))
    got = {name: out.cpu().reshape(3) for name, out in program({"x": value.cuda()}).items()}
    torch.testing.assert_close(got["total"], value.sum(-1), atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(got["peak"], value.amax(-1))
    torch.testing.assert_close(got["short"], value[:, :40].amax(-1))


@pytest.mark.parametrize("widths, prologue", [((24, 24, 24), "scale"), ((24, 48), "layer_norm")])
def test_projections_of_one_value_as_one_kernel_match_the_interpreter(widths, prologue, tmp_path):
    """Query, key and value projections as one tiled kernel with an output each (schedule/products.py)."""
    graph = projections(widths, prologue=prologue)
    compilation, program = gpu_program(graph, KernelCache(tmp_path, "cuda"))
    assert compilation.products_joined
    x = np.random.default_rng(3).standard_normal((37, 40)).astype(np.float32)
    want = interpret(graph, {"x": x})
    got = program({"x": torch.from_numpy(x).cuda()})
    for name in want:
        np.testing.assert_allclose(got[name].cpu().numpy().reshape(want[name].shape), want[name], atol=1e-4, rtol=1e-4,
                                   err_msg=name)


FEATURES = FeatureSpec(token_categorical={"item": 12, "hour": 24}, token_numeric=("value",),
                       static_categorical={"user_country": 5}, future_flags=("sale",), horizons_days=(1, 3), max_len=17)
CONFIG = ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=16, dropout=0.0, max_len=17)


def test_a_whole_model_matches_torch_and_replays_one_graph(tmp_path):
    torch.manual_seed(0)
    model = LumosModel(CONFIG, FEATURES).eval()
    result = compile_model(model, 17, 17, KernelCache(tmp_path, "cuda"), target=CUDA)
    assert verify(result, model) < 1e-4
    batch = synthetic_batch(FEATURES, 5, 17, seed=9).to("cuda")
    first, second = result.compiled.outputs(batch), result.compiled.outputs(batch)
    assert set(result.compiled.program.captured) >= {5}  # one captured graph per row count, reused
    for name in first:
        assert torch.equal(first[name], second[name])
    eager_ms, compiled_ms = time_forward(result, model, repeats=3)
    assert eager_ms > 0 and compiled_ms > 0


@pytest.mark.parametrize("seq", [512, 2048])
def test_fused_attention_at_long_sequences_matches_sdpa(seq, tmp_path):
    batch, heads, width = 4, 2, 32
    graph = Graph()
    q, k, v = (Tensor.input(graph, name, (batch, heads, seq, width)) for name in "qkv")
    mask = Tensor.input(graph, "mask", (batch, 1, 1, seq))
    mark_output(graph, "out", attention(q, k, v, mask))
    graph.prune()
    compilation, program = gpu_program(graph, KernelCache(tmp_path, "cuda"))
    assert compilation.attention == 1
    assert compilation.buffers.arena_bytes < batch * heads * seq * seq * 4  # no score matrix
    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(batch, heads, seq, width, generator=generator).cuda() for name in "qkv"}
    inputs["mask"] = (torch.rand(batch, 1, 1, seq, generator=generator) < 0.9).float().cuda()
    inputs["mask"][..., 0] = 1.0
    got = program(inputs)["out"].reshape(batch, heads, seq, width)
    want = F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=inputs["mask"].bool())
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_module_is_stored_half_on_the_gpu(dtype, tmp_path):
    """frontend/half.py on the CUDA target: weights, input and output half on the GPU, float32 inside."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                 torch.nn.Linear(32, 16)).to(dtype).cuda().eval()
    x = torch.randn(4, 5, 16, dtype=dtype, device="cuda")
    compiled = compile_module(module, [x], KernelCache(tmp_path, "cuda"), strict=True)
    assert {tensor.dtype for tensor in compiled.program.tensors} == {dtype}
    got = compiled(x)
    assert got.dtype == dtype and got.device.type == "cuda"
    with torch.no_grad():
        exact = module.float()(x.float())
    torch.testing.assert_close(got.float(), exact, atol=1e-4, rtol=ROUNDING[str(dtype).removeprefix("torch.")])
