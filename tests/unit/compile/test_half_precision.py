"""bfloat16 and float16 modules: compiled as their float32 copy (frontend/half.py), returned in
the module's dtype, within the dtype's tolerance of eager in that dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lumos.compile.frontend.export import compile_module
from lumos.compile.frontend.half import TOLERANCE
from lumos.compile.frontend.torch_backend import make_backend

C = 16


def mlp(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(C, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, C)).to(dtype).eval()


def encoder(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(dtype).eval()


def check(got: torch.Tensor, module: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> None:
    with torch.no_grad():
        want = module(x)
        exact = module.float()(x.float())  # what the program computes: float32 throughout
        module.to(dtype)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    # Closer to the float32 computation than eager in half precision is (it rounds after every op).
    torch.testing.assert_close(got.float(), exact, atol=2 ** -7 if dtype is torch.bfloat16 else 2 ** -10, rtol=0.01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compile_module_takes_a_half_precision_module(dtype, kernel_cache):
    module = mlp(dtype)
    compiled = compile_module(module, [torch.randn(4, 5, C, dtype=dtype)], kernel_cache, strict=True)
    assert compiled.max_error < 1e-4  # against the float32 copy
    assert next(module.parameters()).dtype == dtype  # the module is left as it was
    x = torch.randn(4, 5, C, dtype=dtype)
    check(compiled(x), module, x, dtype)


def test_torch_compile_takes_a_bfloat16_encoder(kernel_cache):
    torch._dynamo.reset()
    module = encoder(torch.bfloat16)
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True))
    x = torch.randn(2, 6, C, dtype=torch.bfloat16)
    with torch.no_grad():
        got = fast(x)
    check(got, module, x, torch.bfloat16)
    torch._dynamo.reset()
