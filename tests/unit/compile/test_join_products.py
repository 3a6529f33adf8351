"""Matrix products of one value as one kernel with several outputs on the CUDA target
(schedule/products.py, kernel/gpu_tiles.py: tiled_matmuls): which kernels join, what the joined
kernel's IR holds, that it builds with NVRTC, and that it computes what the interpreter does, run
on the CPU (cuda_on_cpu.py: g++, a pthread per CUDA thread, barriers as pthread barriers);
test_cuda_gpu.py runs it on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cuda_on_cpu import run_on_cpu
from test_products_rule import BATCH, TOKENS, D, self_attention

from lumos.compile.ir.graph import Graph, mark_batch
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.ir.interpret import interpret
from lumos.compile.kernel.gpu_ir import Grid, Shared, SliceLoop, StageTile, ThreadTile, TileProduct
from lumos.compile.kernel.ir import Load, Store
from lumos.compile.program import Options, compile_graph
from lumos.compile.render.cuda import gpu_kernel
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.schedule.layout import relayout
from lumos.compile.target import CUDA

pytest.importorskip("cuda.bindings.nvrtc", reason="the CUDA target needs cuda-bindings (the cuda extra)")


def projections(widths=(24, 24, 24), rows: int = 37, depth: int = 40, prologue: str = "scale",
                inner: tuple[int, ...] = ()) -> Graph:
    """x → a prologue → one linear layer (weight and bias) per width, each a graph output: a
    self-attention's query, key and value projections at awkward sizes, over x of shape (rows,
    *inner, depth). The prologue's output (x·2 + 1, or a layer norm) is stored: a matmul operand
    read by several is not recomputed."""
    rng = np.random.default_rng(0)
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, *inner, depth))
    value = x * 2.0 + 1.0 if prologue == "scale" else x.layer_norm(None, None, 1e-5)
    for name, width in zip("qkv", widths, strict=False):
        weight = Tensor.constant(graph, f"w{name}", rng.standard_normal((width, depth)).astype(np.float32))
        bias = Tensor.constant(graph, f"b{name}", rng.standard_normal((width,)).astype(np.float32))
        mark_output(graph, name, value.linear(weight, bias))
    graph.prune()
    return graph


def cuda(graph: Graph, tmp_path, **options):
    return compile_graph(graph, KernelCache(tmp_path, "cuda"), Options(arch="sm_80", **options), target=CUDA)


def test_query_key_value_projections_are_one_tiled_kernel_with_three_outputs(tmp_path):
    compilation = cuda(projections(), tmp_path)
    (joined,) = [kernel for kernel in compilation.kernels if kernel.also]
    assert compilation.products_joined == [joined.name] and len(joined.outputs) == 3
    assert {compilation.graph.outputs[name] for name in "qkv"} == set(joined.outputs)
    params = {node: f"b{node.id}" for node in compilation.graph.nodes}
    mapped, _ = gpu_kernel(joined, compilation.materialized, params)
    assert mapped.outputs == ("out", "out1", "out2")
    shared = [s.name for s in mapped.body if isinstance(s, Shared)]
    assert shared == ["tile_value", "tile_weight", "tile_weight1", "tile_weight2"]
    (grid,) = [s for s in mapped.body if isinstance(s, Grid)]
    (slices,) = [s for s in mapped.body if isinstance(s, SliceLoop)]
    stages = [s for s in slices.body if isinstance(s, StageTile)]
    assert grid.kind == "tiled"
    assert [s.tile for s in stages] == ["tile_value", "tile_weight", "tile_weight1", "tile_weight2"]
    assert isinstance(stages[0].value, Load)  # the value: one buffer, staged once for all three products
    assert [p.acc for p in slices.body if isinstance(p, TileProduct)] == ["sum", "sum1", "sum2"]
    epilogues = [s for s in mapped.body if isinstance(s, ThreadTile)]
    assert [bool(tile.binds) for tile in epilogues] == [True, False, False]  # indices bound once
    launch = next(launch for launch in compilation.cuda.launches if launch.name == joined.name)
    assert [where for where, _ in launch.buffers[:3]] == ["output"] * 3
    # One compilation unit: the names of the three outputs' locals stay apart.
    assert f".entry {joined.name}(" in compilation.build.library.read_text()


def test_without_the_join_each_projection_is_a_kernel(tmp_path):
    compilation = cuda(projections(), tmp_path, join_products=False)
    assert compilation.products_joined == [] and not any(kernel.also for kernel in compilation.kernels)
    assert compilation.stats()["tiled_kernels"] == 3


def test_projections_of_different_widths_join_under_their_own_column_bounds(tmp_path):
    """The Lumos model projects the query (d) and the concatenated key/value (2d) from one input."""
    compilation = cuda(projections(widths=(24, 48), prologue="layer_norm"), tmp_path)
    (joined,) = [kernel for kernel in compilation.kernels if kernel.also]
    params = {node: f"b{node.id}" for node in compilation.graph.nodes}
    mapped, _ = gpu_kernel(joined, compilation.materialized, params)
    epilogues = [s for s in mapped.body if isinstance(s, ThreadTile)]
    assert [tile.bounds[-1].extent for tile in epilogues] == [24, 48]
    (grid,) = [s for s in mapped.body if isinstance(s, Grid)]
    assert grid.digits[0] == ("col_tile", 3)  # the widest output's column tiles
    assert f".entry {joined.name}(" in compilation.build.library.read_text()


def test_a_product_that_reads_another_is_not_joined(tmp_path):
    """k = (x W_k) + q reads q: it cannot run beside the kernel that writes q."""
    rng = np.random.default_rng(1)
    graph = Graph()
    x = Tensor.input(graph, "x", (37, 40))
    q = x.linear(Tensor.constant(graph, "wq", rng.standard_normal((24, 40)).astype(np.float32)))
    mark_output(graph, "q", q)
    wk = Tensor.constant(graph, "wk", rng.standard_normal((24, 40)).astype(np.float32))
    mark_output(graph, "k", x.linear(wk) + q)
    graph.prune()
    compilation = cuda(graph, tmp_path)
    assert compilation.products_joined == [] and compilation.stats()["tiled_kernels"] == 2


def test_products_of_different_values_are_not_joined(tmp_path):
    rng = np.random.default_rng(2)
    graph = Graph()
    x, y = Tensor.input(graph, "x", (37, 40)), Tensor.input(graph, "y", (37, 40))
    for name, value in (("q", x), ("k", y)):
        weight = Tensor.constant(graph, f"w{name}", rng.standard_normal((24, 40)).astype(np.float32))
        mark_output(graph, name, value.linear(weight))
    graph.prune()
    assert cuda(graph, tmp_path).products_joined == []


def test_a_self_attention_joins_the_key_it_stores_transposed(tmp_path):
    """With transpose_activations (the default) the key's kernel writes it transposed for the
    attention's scores: in the joined kernel the key is summed like the query and value, over the
    same rows and columns, and only its store steps differently (schedule/layout.py: relayout).
    Built with NVRTC, and run on the CPU against the interpreter."""
    graph = self_attention()
    compilation = cuda(graph, tmp_path)
    (joined,) = [kernel for kernel in compilation.kernels if kernel.also]
    assert compilation.products_joined == [joined.name] and len(joined.outputs) == 3
    assert sum(relayout(node) is not None for node in joined.outputs) == 1  # the key
    params = {node: f"b{node.id}" for node in compilation.graph.nodes}
    mapped, _ = gpu_kernel(joined, compilation.materialized, params)
    epilogues = [s for s in mapped.body if isinstance(s, ThreadTile)]
    stores = {s.buffer: s.offset for tile in epilogues for s in tile.body if isinstance(s, Store)}
    row_major = ((D * TOKENS, "i0"), (D, "i1"), (1, "i2"))  # (batch, token, column)
    transposed = ((D * TOKENS, "i0"), (1, "i1"), (TOKENS, "i2"))  # each column's tokens side by side
    assert sorted(tuple((coef, index.name) for coef, index in offset.live_terms) for offset in stores.values()) \
        == sorted([row_major, row_major, transposed])
    assert f".entry {joined.name}(" in compilation.build.library.read_text()
    x = np.random.default_rng(5).standard_normal((BATCH, TOKENS, D)).astype(np.float32)
    _check(run_on_cpu(compilation, {"x": x}, tmp_path), interpret(graph, {"x": x}))


@pytest.mark.parametrize("widths", [(24, 24, 24), (24, 48)], ids=["qkv", "q-and-kv"])
@pytest.mark.parametrize("join", [True, False], ids=["joined", "apart"])
def test_the_joined_kernel_matches_the_interpreter(widths, join, tmp_path):
    graph = projections(widths)
    compilation = cuda(graph, tmp_path, join_products=join)
    assert bool(compilation.products_joined) == join
    x = np.random.default_rng(3).standard_normal((37, 40)).astype(np.float32)
    _check(run_on_cpu(compilation, {"x": x}, tmp_path), interpret(graph, {"x": x}))


@pytest.mark.parametrize("inner", [(), (19,)], ids=["batch-rows", "batch-of-sequences"])
def test_the_joined_kernel_runs_to_the_runtime_row_count(inner, tmp_path):
    """A symbolic batch: the row tiles (batch rows) or the outer loop (batch of sequences) run to
    n, fewer rows than traced."""
    graph = projections(rows=37, inner=inner)
    assert mark_batch(graph, projections(rows=38, inner=inner))
    compilation = cuda(graph, tmp_path)
    assert compilation.products_joined
    x = np.random.default_rng(4).standard_normal((21, *inner, 40)).astype(np.float32)
    _check(run_on_cpu(compilation, {"x": x}, tmp_path), interpret_rows(graph, x))


def interpret_rows(graph: Graph, x: np.ndarray) -> dict[str, np.ndarray]:
    """The interpreter over the traced batch, x padded with zeros: the first rows of each output."""
    rows = x.shape[0]
    padded = np.zeros((graph.inputs["x"].shape[0], *x.shape[1:]), np.float32)
    padded[:rows] = x
    return {name: value[:rows] for name, value in interpret(graph, {"x": padded}).items()}


def _check(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name in want:
        assert np.abs(want[name]).max() > 1
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.slow  # about 30 s: 63 kernels under g++, a pthread per CUDA thread
def test_a_whole_model_with_joined_projections_matches_the_interpreter_on_the_cpu(tmp_path):
    """A small Lumos model's CUDA program (its self-attentions' query and key/value projections
    joined; tiled, warp, flash, warp-per-query and elementwise kernels), run on the CPU."""
    from lumos.compile.engine import compile_model
    from lumos.compile.frontend.lumos_model import batch_tensors
    from lumos.data.contract import FeatureSpec
    from lumos.train.memory import synthetic_batch
    from lumos.train.model import LumosModel, ModelConfig

    features = FeatureSpec(token_categorical={"item": 12, "hour": 24}, token_numeric=("value",),
                           static_categorical={"user_country": 5}, future_flags=("sale",), horizons_days=(1, 3),
                           max_len=17)
    config = ModelConfig(d_model=32, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=64, dropout=0.0, max_len=17)
    torch.manual_seed(0)
    model = LumosModel(config, features).eval()
    compilation = compile_model(model, 4, 17, KernelCache(tmp_path, "cuda"), target=CUDA).compilation
    assert len(compilation.products_joined) == 3
    assert {launch.kind for launch in compilation.cuda.launches} >= {"tiled", "warp", "flash", "elementwise"}
    inputs = {name: value.float().numpy() for name, value in
              batch_tensors(synthetic_batch(features, 4, 17, seed=9), features).items() if name in compilation.graph.inputs}
    got, want = run_on_cpu(compilation, inputs, tmp_path), interpret(compilation.graph, inputs)
    for name in want:
        np.testing.assert_allclose(got[name].reshape(want[name].shape), want[name], atol=1e-4, rtol=1e-4, err_msg=name)
