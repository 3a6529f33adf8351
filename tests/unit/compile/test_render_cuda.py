"""The CUDA target without a GPU: every CUDA kernel of the quickstart and SASRec-size models
compiles with NVRTC for sm_80 and sm_90, the kernel cache keys on NVRTC version, architecture and
flags, and gathers are bounds-checked. (Running the kernels needs a GPU: test_cuda_gpu.py.)"""

from __future__ import annotations

from urllib.parse import unquote

import numpy as np
import pytest
import torch

from lumos.compile.frontend.lumos_model import lower_model
from lumos.compile.kernel.gpu_ir import (
    Barrier,
    Grid,
    OnlineSoftmax,
    Shared,
    SharedRead,
    SliceLoop,
    SoftmaxState,
    StageRows,
    StageTile,
    ThreadTile,
    TileProduct,
    WarpReduce,
)
from lumos.compile.kernel.ir import Affine, Load, Masked, Reduce, Ref, RowOf
from lumos.compile.kernel.lower import lower_kernel
from lumos.compile.program import Options, compile_graph
from lumos.compile.render.cuda import HEADER, Launch, gpu_kernel
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.runtime.nvrtc import FLAGS, CudaBuildError, compile_cuda, nvrtc_toolchain, nvrtc_version
from lumos.compile.target import CUDA
from lumos.data.contract import FeatureSpec
from lumos.train.model import LumosModel, ModelConfig

pytest.importorskip("cuda.bindings.nvrtc", reason="the CUDA target needs cuda-bindings (the cuda extra)")

# benchmarks/compile.py's two models: the quickstart model (lumos/quickstart/train.toml's
# [model] with the quickstart data's features) and a SASRec-sized one.
QUICKSTART_FEATURES = FeatureSpec(
    token_categorical={"item": 502, "event_type": 6, "cat_device": 5, "cat_category": 10, "hour": 24, "weekday": 7,
                       "gap_bucket": 16},
    token_numeric=("value", "age_days"),
    static_categorical={"user_country": 8, "user_age_bucket": 7},
    static_numeric=("user_tenure_days",),
    future_flags=("holiday", "sale"),
    horizons_days=(7,),
    max_len=100,
)
SASREC_FEATURES = FeatureSpec(token_categorical={"item": 1702}, token_numeric=(), max_len=50)
SASREC_CONFIG = ModelConfig(d_model=64, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=64, dropout=0.0,
                            max_len=50, heads=("retrieval",))
ARCHS = ("sm_80", "sm_90")


def quickstart_model() -> LumosModel:
    from lumos.core.config import load_config
    from lumos.quickstart import RECIPES
    from lumos.train.config import TrainConfig

    return LumosModel(load_config(TrainConfig, RECIPES / "train.toml").model, QUICKSTART_FEATURES)


MODELS = {"quickstart": quickstart_model, "sasrec": lambda: LumosModel(SASREC_CONFIG, SASREC_FEATURES)}


def lowered(name: str, rows: int = 8):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    return lower_model(model, rows, model.features.max_len, symbolic_batch=True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-attention", "unfused"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_cuda_kernel_compiles_with_nvrtc(name, fused, tmp_path):
    compilation = compile_graph(lowered(name), KernelCache(tmp_path, "cuda"), Options(arch=ARCHS[0], fuse_attention=fused), target=CUDA)
    program = compilation.cuda
    kinds = compilation.stats()
    assert kinds["kernels"] == len(program.launches) > 20
    assert kinds.get("tiled_kernels", 0) > 0 and kinds.get("warp_kernels", 0) > 0 and kinds.get("elementwise_kernels", 0) > 0
    assert kinds.get("attention_kernels", 0) == (compilation.attention if fused else 0)
    if fused:  # the encoders' attentions take the shared-memory flash kernel; a decoder's single
        # query (its score's q·k not one contiguous read on SASRec) may take the warp-per-query one
        assert kinds.get("flash_kernels", 0) >= 2
        assert kinds.get("flash_kernels", 0) + kinds.get("attention_warp_kernels", 0) == compilation.attention
    if fused:
        assert compilation.attention == 4  # two encoder layers, one decoder self- and one cross-attention
    built = {ARCHS[0]: compilation.build.library.read_text()}
    for arch in ARCHS[1:]:
        built[arch] = compile_cuda(program.source, arch).code.decode()
    for arch, ptx in built.items():
        assert f".target {arch}" in ptx
        missing = [launch.name for launch in program.launches if f".entry {launch.name}(" not in ptx]
        assert not missing, f"{arch}: no PTX entry for {missing}"


def test_nvrtc_names_the_error_in_generated_code():
    with pytest.raises(CudaBuildError, match="undefined"):
        compile_cuda(HEADER + 'extern "C" __global__ void k(float* out) { out[0] = not_defined; }', "sm_80")
    assert nvrtc_version().split(".")[0].isdigit()


def test_nvrtc_leaves_python_objects_alone():
    """NVRTC writes its log into the buffer it is given; an empty log (size 1) once went into
    CPython's shared b" ", and every space that urllib decoded afterwards was a NUL."""
    for _ in range(2):
        compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "sm_80")
    assert b" " == bytes([32])
    assert unquote("a%20b") == "a b"


def test_the_cuda_kernel_cache_keys_on_nvrtc_arch_and_flags(tmp_path):
    cache = KernelCache(tmp_path, "cuda")
    source = HEADER + 'extern "C" __global__ void k0(const int n, float* out) { if (threadIdx.x < n) out[threadIdx.x] = 1.0f; }'
    first = cache.build(source, nvrtc_toolchain("sm_80"))
    again = cache.build(source, nvrtc_toolchain("sm_80"))
    assert not first.hit and again.hit and again.key == first.key
    assert cache.key(source, nvrtc_toolchain("sm_90", FLAGS)) != first.key
    assert cache.key(source, nvrtc_toolchain("sm_80", (*FLAGS, "--extra-device-vectorization"))) != first.key
    assert cache.key(source + " ", nvrtc_toolchain("sm_80", FLAGS)) != first.key
    (first.library).write_bytes(b"corrupted")  # a broken entry is rebuilt, never used
    rebuilt = cache.build(source, nvrtc_toolchain("sm_80"))
    assert not rebuilt.hit and b".entry k0" in rebuilt.library.read_bytes()


def _loads(value, masked_by=()):
    """(load, the conditions around it) for every buffer read in an expression."""
    if isinstance(value, Load):
        yield value, masked_by
    elif isinstance(value, Masked):
        yield from _loads(value.x, masked_by + value.cond)
    for child in ("x", "a", "b"):
        if hasattr(value, child) and not isinstance(value, Masked):
            yield from _loads(getattr(value, child), masked_by)


def _statements(body):
    for stmt in body:
        yield stmt
        if isinstance(stmt, Reduce):
            yield from _statements(stmt.body)


def test_gathers_are_bounds_checked_on_cuda_only(tmp_path):
    graph = lowered("sasrec", rows=3)
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), target=CUDA)
    params = {node: f"b{node.id}" for node in graph.nodes}
    checked = unchecked = 0
    for kernel in compilation.kernels:
        if kernel.kind != "gather":
            continue
        for flag in (True, False):
            ir = lower_kernel(kernel, compilation.materialized, params, check_gathers=flag)
            for stmt in _statements(ir.body):
                for load, conditions in _loads(stmt.value):
                    rows = [i for _, i in load.offset.terms if isinstance(i, RowOf)] if isinstance(load.offset, Affine) else []
                    for row in rows:
                        guarded = {(c.op, c.bound) for c in conditions if c.index == row}
                        if flag:
                            assert guarded == {(">=", 0), ("<", row.rows)}, f"{kernel.name}: unchecked gather"
                            checked += 1
                        else:
                            assert not guarded
                            unchecked += 1
    assert checked == unchecked > 0


def test_launch_grids_cover_every_output():
    per_element = Launch("k0", "elementwise", (256, 1, 1), True, 3264, 256, 1, ())
    assert per_element.grid(8) == -(-8 * 3264 // 256) and per_element.grid(1) == 13
    tiles = Launch("k1", "tiled", (16, 16, 1), True, 1, 16, 4, ())  # rows of a batch in tiles of 16, 4 column tiles
    assert tiles.grid(17) == 2 * 4 and tiles.grid(16) == 4
    fixed = Launch("k2", "warp", (256, 1, 1), False, 101, 8, 1, ())
    assert fixed.grid(1) == fixed.grid(256) == 13


def test_every_op_case_compiles_with_nvrtc(tmp_path):
    """test_compile_ops' graph (every primitive and high-level op, awkward sizes, broadcasts and
    non-contiguous views), which test_cuda_gpu.py runs on a GPU, builds for both architectures."""
    from test_compile_ops import CASES, INPUTS

    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, mark_output

    graph = Graph()
    tensors = {name: Tensor.input(graph, name, value.shape) for name, value in INPUTS.items()}
    for name, (lower, _) in CASES.items():
        mark_output(graph, name, lower(tensors))
    graph.prune()
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), target=CUDA)
    assert compilation.attention >= 1
    assert f".entry {compilation.cuda.launches[-1].name}(" in compile_cuda(compilation.cuda.source, "sm_90").code.decode()


def test_long_attention_is_one_kernel_without_a_score_matrix(tmp_path):
    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, attention, mark_output

    batch, heads, seq, width = 4, 2, 2048, 32
    graph = Graph()
    q, k, v = (Tensor.input(graph, name, (batch, heads, seq, width)) for name in "qkv")
    mark_output(graph, "out", attention(q, k, v, Tensor.input(graph, "mask", (batch, 1, 1, seq))))
    graph.prune()
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), Options(arch="sm_90"), target=CUDA)
    assert compilation.attention == 1 and [launch.kind for launch in compilation.cuda.launches].count("flash") == 1
    assert compilation.buffers.arena_bytes < batch * heads * seq * seq * 4


def test_long_reductions_take_a_block_each_and_short_ones_a_warp(tmp_path):
    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, mark_output

    graph = Graph()
    x = Tensor.input(graph, "x", (3, 5000))
    mark_output(graph, "total", x.sum(-1))
    mark_output(graph, "peak", x.slice(1, 0, 40).max(-1))
    graph.prune()
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), target=CUDA)
    kinds = sorted(launch.kind for launch in compilation.cuda.launches)
    assert kinds == ["block", "warp"]
    source = {launch.kind: compilation.cuda.kernels[launch.name] for launch in compilation.cuda.launches}
    assert "+= 256)" in source["block"] and "partial[warp]" in source["block"]  # the block's threads share the steps
    assert "+= 32)" in source["warp"] and "partial" not in source["warp"]


def test_the_cuda_header_ships_with_the_package():
    import tomllib
    from importlib import resources
    from pathlib import Path

    header = resources.files("lumos.compile.render").joinpath("lumos_cuda.h")
    assert HEADER == header.read_text() and "lumos_warp_sum" in HEADER
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert "*.h" in pyproject["tool"]["setuptools"]["package-data"]["lumos.compile.render"]


def _mapped(graph, tmp_path):
    """Every kernel of `graph` lowered and mapped to threads (kernel/gpu_tiles.py, gpu_attention.py)."""
    compilation = compile_graph(graph, KernelCache(tmp_path, "cuda"), target=CUDA)
    params = {node: f"b{node.id}" for node in compilation.graph.nodes}
    return [gpu_kernel(kernel, compilation.materialized, params)[0] for kernel in compilation.kernels], compilation


def test_the_tiled_matmul_is_an_ir_pass_that_stages_between_barriers(tmp_path):
    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, mark_output

    graph = Graph()
    x = Tensor.input(graph, "x", (37, 40))
    w = Tensor.constant(graph, "w", np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32))
    mark_output(graph, "y", x.layer_norm(None, None, 1e-5).linear(w).gelu())
    graph.prune()
    mapped, compilation = _mapped(graph, tmp_path)
    tiled = [ir for ir in mapped if any(isinstance(s, Grid) and s.kind == "tiled" for s in ir.body)]
    assert len(tiled) == 1
    shared, grid, (slices,), (tile,) = ([s for s in tiled[0].body if isinstance(s, kind)]
                                        for kind in (Shared, Grid, SliceLoop, ThreadTile))
    assert [s.name for s in shared] == ["tile_value", "tile_weight"] and grid[0].threads == (16, 16, 1)
    assert [type(s) for s in slices.body] == [StageTile, StageTile, Barrier, TileProduct, Barrier]
    value, weight = slices.body[:2]
    assert value.prologue and weight.prologue is None  # the layer norm runs as the value is staged
    assert len(tile.binds) == 2 and tile.body[0].value == Ref("sum")  # the epilogue starts from the summed tile
    source = compilation.cuda.kernels[tiled[0].name]
    assert source.count("__syncthreads();") == 2


def test_attention_maps_to_flash_or_a_warp_per_query_as_ir(tmp_path):
    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, attention, mark_output

    graph = Graph()
    q, k, v = (Tensor.input(graph, name, (2, 2, 70, 16)) for name in "qkv")
    mark_output(graph, "out", attention(q, k, v, None))
    graph.prune()
    mapped, _ = _mapped(graph, tmp_path)
    (flash,) = [ir for ir in mapped if any(isinstance(s, SoftmaxState) for s in ir.body)]
    state = next(s for s in flash.body if isinstance(s, SoftmaxState))
    assert state.query is not None and state.query.depth == 16 and state.width == 16
    (keys,) = [s for s in flash.body if isinstance(s, SliceLoop)]
    assert [type(s) for s in keys.body[:4]] == [Barrier, StageRows, StageRows, Barrier]
    step = keys.body[-1].body[-1]
    assert isinstance(step, OnlineSoftmax) and step.value == SharedRead("value_tile", ("jj", "dd"))


def test_long_reductions_are_lane_reductions_in_the_ir(tmp_path):
    from lumos.compile.ir.graph import Graph
    from lumos.compile.ir.hl_ops import Tensor, mark_output

    graph = Graph()
    x = Tensor.input(graph, "x", (3, 5000))
    mark_output(graph, "total", x.sum(-1))
    graph.prune()
    (mapped,), _ = _mapped(graph, tmp_path)
    (reduce,) = [s for s in mapped.body if isinstance(s, WarpReduce)]
    assert reduce.stride == 256 and reduce.lane == "threadIdx.x"
    assert any(isinstance(s, Barrier) and s.why for s in mapped.body)  # partial is reused: wait first
