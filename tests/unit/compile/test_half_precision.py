"""bfloat16 and float16 modules: stored in their own dtype, computed in float32 (frontend/half.py):
half weights held half, half inputs read and outputs written half by the kernels themselves,
within the dtype's tolerance of eager in that dtype."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from cuda_on_cpu import run_on_cpu
from torch import nn

from lumos.compile.frontend.export import CompiledModule, build_exported, compile_module, export_module
from lumos.compile.frontend.half import (
    TOLERANCE,
    eager_output_dtypes,
    float32_copy,
    from_stored,
    half_storage,
)
from lumos.compile.frontend.partition import PartitionedModule
from lumos.compile.frontend.torch_backend import make_backend
from lumos.compile.ir.graph import ROUNDING
from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CUDA

C = 16


def mlp(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(C, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, C)).to(dtype).eval()


def encoder(dtype: torch.dtype, width: int = C) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=2 * width, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(dtype).eval()


class Attention(nn.Module):
    """Linear, layer norm and a softmax attention of the sizes a small model has, written out."""

    def __init__(self, width: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.norm, self.qkv, self.out = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, T, D) each
        scores = (q @ k.transpose(-1, -2)) / (c // self.heads) ** 0.5
        mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        return x + self.out(mixed)


def check(got: torch.Tensor, module: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> None:
    with torch.no_grad():
        want = module(x)
        exact = module.float()(x.float())  # what the program computes: float32 throughout
        module.to(dtype)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    # Closer to the float32 computation than eager in half precision is (it rounds after every op):
    # the float32 result rounded once.
    name = str(dtype).removeprefix("torch.")
    torch.testing.assert_close(got.float(), exact, atol=1e-4, rtol=ROUNDING[name])


def stores_half(compiled: CompiledModule, module: nn.Module, dtype: torch.dtype) -> None:
    """The program holds every weight in `dtype` (half the bytes of float32), keeps no float32
    copy, and its kernels load them as that dtype (the rendered C's pointer types and conversions)."""
    name = str(dtype).removeprefix("torch.")
    assert isinstance(compiled, CompiledModule)
    weights = sum(tensor.numel() for tensor in module.parameters())
    held = compiled.program.tensors
    assert {array.dtype for array in held} == {np.dtype(np.uint16 if dtype is torch.bfloat16 else np.float16)}
    assert sum(array.nbytes for array in held) == 2 * weights == sum(p.numel() * 4 for p in module.parameters()) // 2
    assert compiled.compilation.graph.tensors == {}  # no float32 copy left behind
    source = compiled.compilation.source
    kernels = [line for line in source.splitlines() if line.startswith("LUMOS_KERNEL ") and "{" in line]
    # Every kernel that reads a weight reads it through a half pointer, never a float one...
    calls = re.findall(r"\(const lumos_" + name + r"\*\)tensors\[\d+\]", source)
    assert len(calls) >= len(held), "every weight is passed to its kernels as a half pointer"
    assert not re.search(r"[^)]tensors\[\d+\]", source), "no weight is passed as float32"
    assert any(f"const lumos_{name}* restrict" in line for line in kernels)
    # ...and converts as it loads it (the input and output too: read and written half).
    assert f"lumos_from_{name}(" in source.split("LUMOS_KERNEL", 1)[1]
    assert f"lumos_to_{name}(" in source.split("LUMOS_KERNEL", 1)[1]
    assert f"(const lumos_{name}*)inputs[0]" in source and f"(lumos_{name}*)outputs[0]" in source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compile_module_stores_a_half_precision_module_in_its_dtype(dtype, kernel_cache):
    module = mlp(dtype)
    compiled = compile_module(module, [torch.randn(4, 5, C, dtype=dtype)], kernel_cache, strict=True)
    name = str(dtype).removeprefix("torch.")
    assert compiled.max_error < 1e-4 + ROUNDING[name] * 4  # against the float32 copy: one rounding (|x| < 4)
    assert next(module.parameters()).dtype == dtype  # the module is left as it was
    stores_half(compiled, module, dtype)
    x = torch.randn(4, 5, C, dtype=dtype)
    check(compiled(x), module, x, dtype)
    check(compiled(x[:3]), module, x[:3], dtype)  # the symbolic batch: fewer rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_sized_ops_in_half_precision(dtype, kernel_cache):
    torch.manual_seed(0)
    module = Attention().to(dtype).eval()
    x = torch.randn(2, 12, 32, dtype=dtype)
    compiled = compile_module(module, [x], kernel_cache, strict=True)
    stores_half(compiled, module, dtype)
    check(compiled(x), module, x, dtype)


def test_a_float16_encoder_layer_in_half_precision(kernel_cache):
    module = encoder(torch.float16)
    x = torch.randn(2, 6, C, dtype=torch.float16)
    compiled = compile_module(module, [x], kernel_cache, strict=True)
    stores_half(compiled, module, torch.float16)
    check(compiled(x), module, x, torch.float16)


@pytest.mark.slow  # 30 s of schedule search
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_searched_kernels_load_half_weights_in_vectors(dtype, kernel_cache):
    """With the search, the register-blocked matmuls and the fused attention: weights loaded a
    vector at a time, widened in registers (never a float32 copy), and the searched kernels checked
    against the interpreter at their half outputs within one rounding."""
    module = encoder(dtype, width=64)
    x = torch.randn(4, 16, 64, dtype=dtype)
    compiled = compile_module(module, [x], kernel_cache, strict=True, search_budget=20)
    stores_half(compiled, module, dtype)
    name = str(dtype).removeprefix("torch.")
    source = compiled.compilation.source
    assert re.search(rf"lumos_load(8|16)(_pair)?_{name}\(&b\d+\[", source)
    if dtype is torch.bfloat16:  # a register-blocked matmul loads its weight two vectors at a time
        assert re.search(r"lumos_load(8|16)_pair_bfloat16\(&b\d+\[", source) and "_interleaved(&" in source
    check(compiled(x), module, x, dtype)


def test_a_half_kernel_is_searched_and_cached_apart_from_its_float32_twin(tmp_path):
    """The search cache keys a kernel by its C with its buffers' dtypes: a kernel reading bfloat16
    weights gets an entry of its own next to its float32 twin's, and a second bfloat16 compile
    finds all of its entries (nothing measured)."""
    cache = KernelCache(tmp_path, "cpu")
    x = torch.randn(4, 5, C)

    def entries() -> set[str]:
        return {path.name for path in (tmp_path / "cpu" / "search").rglob("*.json")}

    def searched(dtype: torch.dtype):
        compiled = compile_module(mlp(dtype), [x.to(dtype)], cache, strict=True, search_budget=1)
        return compiled.compilation.search, entries()

    single, single_entries = searched(torch.float32)
    half, half_entries = searched(torch.bfloat16)
    assert half.rounds >= 1 and not half.cache_hit  # the float32 choices are not reused for it
    by_kernel = {}
    for search in (single, half):
        for group in search.groups:
            report = group.report()
            by_kernel.setdefault((report["kind"], tuple(report["shape"]), report["origin"]), set()).add(group.key)
    twins = [keys for keys in by_kernel.values() if len(keys) == 2]
    assert twins, "a kernel with a key per dtype: the first linear's matmul reads a weight"
    assert len(half_entries - single_entries) >= len(twins)  # stored apart: the float32 ones stay
    again, again_entries = searched(torch.bfloat16)
    assert again.cache_hit and again.rounds == 0 and again_entries == half_entries
    assert {group.key for group in again.groups} == {group.key for group in half.groups}


def test_torch_compile_takes_a_bfloat16_encoder(kernel_cache):
    torch._dynamo.reset()
    module = encoder(torch.bfloat16)
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True))
    x = torch.randn(2, 6, C, dtype=torch.bfloat16)
    with torch.no_grad():
        got = fast(x)
    check(got, module, x, torch.bfloat16)
    torch._dynamo.reset()


class Mixed(nn.Module):
    """Integer ids and a float32 buffer in a bfloat16 model; a half output that another output
    reads; a float32 and a bool output."""

    def __init__(self):
        super().__init__()
        self.embed, self.linear = nn.Embedding(500, C), nn.Linear(C, C)
        self.register_buffer("scale", torch.tensor(3.0))

    def forward(self, ids, x):
        hidden = self.linear(self.embed(ids) + x)
        return hidden, (hidden * 2).sum(-1), hidden.float() * self.scale, ids > 3


def test_only_what_the_module_holds_half_is_stored_half(kernel_cache):
    torch.manual_seed(0)
    module = Mixed().to(torch.bfloat16)
    module.scale = module.scale.float()
    module.eval()
    ids, x = torch.randint(0, 500, (4, 7)), torch.randn(4, 7, C, dtype=torch.bfloat16)
    compiled = compile_module(module, [ids, x], kernel_cache, strict=True)  # verified: float32 inside
    storage = compiled.compilation.graph.storage
    assert storage.inputs == {"x": "bfloat16"} and storage.outputs == {"output0": "bfloat16", "output1": "bfloat16"}
    assert set(storage.tensors) == {"embed.weight", "linear.bias", "linear.weight#T"}  # not the float32 scale
    with torch.no_grad():
        want = module(ids, x)
    got = compiled(ids, x)
    assert [value.dtype for value in got] == [value.dtype for value in want]
    for have, expected in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(have, expected, atol=TOLERANCE[torch.bfloat16] * 4, rtol=TOLERANCE[torch.bfloat16])
    assert torch.equal(got[3], want[3])


class CumulativeBetweenLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x):
        return self.second(torch.cumprod(self.first(x).tanh(), dim=1))  # cumprod: no lowering, runs in eager


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_partitioned_half_module_stores_its_partitions_half(dtype, kernel_cache):
    """Part eager, part compiled: the eager op runs in the module's dtype, and each partition is
    compiled as a whole half module is: what it reads (the activations, the weights PyTorch passes
    it) read half and what it returns written half, computed in float32."""
    torch.manual_seed(0)
    module = CumulativeBetweenLinears().to(dtype).eval()
    x = torch.randn(3, C, dtype=dtype)
    with pytest.warns(Warning, match="cumprod"):
        compiled = compile_module(module, [x], kernel_cache)
    assert isinstance(compiled, PartitionedModule) and len(compiled.partitions) == 2
    name = str(dtype).removeprefix("torch.")
    for part in compiled.partitions:
        assert isinstance(part, CompiledModule)
        assert part.input_dtypes == [dtype] * 3  # the activation, the linear's weight and bias
        assert [output.dtype for output in part.outputs] == [dtype]
        source = part.compilation.source
        assert f"(const lumos_{name}*)inputs[0]" in source and f"(lumos_{name}*)outputs[0]" in source
        assert "(const float*)inputs" not in source, "nothing the partition reads is widened by PyTorch"
    got = compiled(x)
    with torch.no_grad():
        want = module(x)
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


# ---------------------------------------------------------------------------------------------
# The CUDA target: built by NVRTC (no GPU needed) and run on the CPU (cuda_on_cpu.py)


def cuda_compilation(module: nn.Module, x: torch.Tensor, tmp_path):
    """The module's CUDA program as compile_module would build it for CUDA tensors."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="the CUDA target needs cuda-bindings (the cuda extra)")
    twin, wide = float32_copy(module), [x.float()]
    dtypes = eager_output_dtypes(module, [x])
    compilation, _ = build_exported(twin, export_module(twin, wide), wide, KernelCache(tmp_path, "cuda"),
                                    Options(arch="sm_80"), CUDA, 0,
                                    lambda graph, used: half_storage(module, [x], dtypes, graph, used))
    return compilation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make", [mlp, lambda dtype: Attention().to(dtype).eval(), encoder], ids=["mlp", "attention", "encoder"])
def test_cuda_kernels_store_half_and_compute_float32(make, dtype, tmp_path):
    torch.manual_seed(0)
    module = make(dtype)
    x = torch.randn(2, 6, 32 if isinstance(module, Attention) else C, dtype=dtype)
    compilation = cuda_compilation(module, x, tmp_path)  # NVRTC built it (the build pass)
    name = str(dtype).removeprefix("torch.")
    source = compilation.cuda.source
    assert f"const lumos_{name}* __restrict__" in source and f"lumos_from_{name}(" in source
    assert f"lumos_to_{name}(" in source  # the output, written half
    got = run_on_cpu(compilation, {"x" if "x" in compilation.graph.inputs else next(iter(compilation.graph.inputs)):
                                   x.float().numpy()}, tmp_path)
    (output,) = got.values()
    have = from_stored(output).reshape(x.shape)
    assert have.dtype is dtype
    with torch.no_grad():
        exact = float32_copy(module)(x.float())
    torch.testing.assert_close(have.float(), exact, atol=1e-4, rtol=ROUNDING[name])


# ---------------------------------------------------------------------------------------------
# The C header's conversions, against torch's


CONVERSIONS = r"""
void widen_bfloat16(const lumos_bfloat16* h, float* f, int n) { for (int i = 0; i < n; i++) f[i] = lumos_from_bfloat16(h[i]); }
void round_bfloat16(const float* f, lumos_bfloat16* h, int n) { for (int i = 0; i < n; i++) h[i] = lumos_to_bfloat16(f[i]); }
void widen_float16(const lumos_float16* h, float* f, int n) { for (int i = 0; i < n; i++) f[i] = lumos_from_float16(h[i]); }
void round_float16(const float* f, lumos_float16* h, int n) { for (int i = 0; i < n; i++) h[i] = lumos_to_float16(f[i]); }
/* n a multiple of 32: every vector form, each load stored back through the matching store */
void vectors(const lumos_bfloat16* b, const lumos_float16* h, lumos_bfloat16* b8, lumos_bfloat16* b16,
             lumos_float16* h8, lumos_float16* h16, float* pairs8, float* pairs16, int n) {
  for (int i = 0; i < n; i += 32) {
    for (int k = 0; k < 32; k += 8) lumos_store8_bfloat16(b8 + i + k, lumos_load8_bfloat16(b + i + k));
    for (int k = 0; k < 32; k += 16) lumos_store16_bfloat16(b16 + i + k, lumos_load16_bfloat16(b + i + k));
    for (int k = 0; k < 32; k += 8) lumos_store8_float16(h8 + i + k, lumos_load8_float16(h + i + k));
    for (int k = 0; k < 32; k += 16) lumos_store16_float16(h16 + i + k, lumos_load16_float16(h + i + k));
    lumos_f8 e8, o8; lumos_f16 e16, o16;
    for (int k = 0; k < 32; k += 16) { lumos_load8_pair_bfloat16(b + i + k, &e8, &o8); lumos_store8_interleaved(pairs8 + i + k, e8, o8); }
    lumos_load16_pair_bfloat16(b + i, &e16, &o16);
    lumos_store16_interleaved(pairs16 + i, e16, o16);
  }
}
"""


def test_the_c_conversions_match_torch_for_every_half_value(tmp_path):
    """Every one of the 65,536 bit patterns of each half dtype widens as torch widens it (NaNs as
    NaNs), float32 values round as torch rounds them (ties, overflow, subnormals, infinities), and
    the vector forms agree with the scalar ones."""
    import ctypes
    import subprocess

    from lumos.compile.render.c import HALF_HEADER, HEADER

    source = tmp_path / "conversions.c"
    source.write_text(HEADER + HALF_HEADER + CONVERSIONS)
    library = tmp_path / "conversions.so"
    subprocess.run(["gcc", "-O3", "-march=native", "-shared", "-fPIC", "-fopenmp", str(source), "-o", str(library)],
                   check=True)
    c = ctypes.CDLL(str(library))

    def call(name, *arrays):
        getattr(c, name)(*(ctypes.c_void_p(array.ctypes.data) for array in arrays), ctypes.c_int(arrays[0].size))

    bits = np.arange(65536, dtype=np.uint16)
    for dtype, suffix in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        want = torch.from_numpy(bits.view(np.int16).copy()).view(dtype).float().numpy()
        got = np.empty(65536, np.float32)
        call(f"widen_{suffix}", bits, got)
        np.testing.assert_array_equal(got, want)  # NaN where torch has NaN
        rng = np.random.default_rng(0)
        with np.errstate(all="ignore"):  # the midpoints next to infinities and NaNs (dropped below)
            halfway = (want[:-1:2] + want[1::2]) / 2
        values = np.concatenate([want[np.isfinite(want)], rng.standard_normal(100_000).astype(np.float32) * 10.0 ** rng.integers(-9, 9, 100_000),
                                 halfway,  # ties round to even
                                 np.array([np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, 65520.0, 65519.0], np.float32)])
        values = values[np.isfinite(values) | np.isinf(values)].astype(np.float32)
        rounded = np.empty(values.size, np.uint16)
        call(f"round_{suffix}", values, rounded)
        expected = torch.from_numpy(values).to(dtype).view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(rounded, expected)
    b = bits
    h = bits.copy()
    out = [np.empty(65536, np.uint16) for _ in range(4)] + [np.empty(65536, np.float32) for _ in range(2)]
    call("vectors", b, h, *out)
    finite_b = np.isfinite(torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16).float().numpy())
    finite_h = np.isfinite(torch.from_numpy(h.view(np.int16).copy()).view(torch.float16).float().numpy())
    np.testing.assert_array_equal(out[0][finite_b], b[finite_b])  # widen, then round: the same value
    np.testing.assert_array_equal(out[1][finite_b], b[finite_b])
    np.testing.assert_array_equal(out[2][finite_h], h[finite_h])
    np.testing.assert_array_equal(out[3][finite_h], h[finite_h])
    widened_b = torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(out[4], widened_b)  # pairs split and interleaved back in order
    np.testing.assert_array_equal(out[5], widened_b)
