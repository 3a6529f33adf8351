"""Modules with ops the compiler cannot lower: the rest is compiled around them and the ops run in
eager (one warning names each with its line), or strict=True refuses. And PyTorch's fused fast
path of nn.TransformerEncoder / nn.MultiheadAttention compiled with the global flag left on."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lumos.compile.frontend.export import compile_module
from lumos.compile.frontend.fast_path import native_multi_head_attention, transformer_encoder_layer_fwd
from lumos.compile.frontend.lumos_model import UnsupportedOp
from lumos.compile.frontend.partition import EagerFallbackWarning, PartitionedModule
from lumos.compile.frontend.torch_backend import make_backend

B, T, C = 3, 7, 8  # awkward sizes; two heads of 4


class CumulativeBetweenLinears(nn.Module):
    """Two compiled linear blocks around a cumulative sum (no lowering), and an argmax (none
    either) whose integer result the second block reads."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(5, C)
        self.second = nn.Linear(C, 3)

    def forward(self, x):
        hidden = torch.cumprod(self.first(x).relu(), dim=1)
        winner = hidden.argmax(-1, keepdim=True)
        return self.second(hidden) * winner


def inputs(seed: int) -> torch.Tensor:
    return torch.randn(B, 5, generator=torch.Generator().manual_seed(seed))


def fallback_warnings(caught) -> list[str]:
    return [str(warning.message) for warning in caught if issubclass(warning.category, EagerFallbackWarning)]


def assert_names_the_ops(message: str) -> None:
    for op, code in (("aten.cumprod", "torch.cumprod(self.first(x)"), ("aten.argmax", "hidden.argmax(-1")):
        line = next(line for line in message.splitlines() if op in line)
        assert "test_partition.py" in line and "line " in line and code in line


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fast_path_untouched():
    """The tests run with PyTorch's default (fast path on) and must leave it so."""
    assert torch.backends.mha.get_fastpath_enabled()
    yield
    assert torch.backends.mha.get_fastpath_enabled()


def test_compile_module_partitions_around_unsupported_ops(kernel_cache):
    torch.manual_seed(0)
    module = CumulativeBetweenLinears()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_module(module, (inputs(0),), kernel_cache)
    (message,) = fallback_warnings(caught)
    assert_names_the_ops(message)
    assert isinstance(compiled, PartitionedModule) and len(compiled.partitions) == 2
    assert compiled.max_error < 1e-4
    for seed in (1, 2):
        torch.testing.assert_close(compiled(inputs(seed)), module(inputs(seed)), atol=1e-4, rtol=1e-4)


def test_compile_module_strict_refuses(kernel_cache):
    with pytest.raises(UnsupportedOp, match=r"aten\.cumprod.*test_partition\.py"):
        compile_module(CumulativeBetweenLinears(), (inputs(0),), kernel_cache, strict=True)


class ViewsAfterCumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, C)

    def forward(self, x):
        return torch.cumprod(self.linear(x), dim=1).transpose(0, 1).reshape(-1)


def test_a_partition_of_views_only_stays_in_eager(kernel_cache):
    torch.manual_seed(0)
    module = ViewsAfterCumsum()
    with pytest.warns(EagerFallbackWarning, match="aten.cumprod"):
        compiled = compile_module(module, (inputs(0),), kernel_cache)
    assert len(compiled.partitions) == 1  # the linear layer; transpose and reshape run in eager
    torch.testing.assert_close(compiled(inputs(1)), module(inputs(1)), atol=1e-4, rtol=1e-4)


def test_torch_compile_backend_partitions_around_unsupported_ops(fresh_dynamo, kernel_cache):
    torch.manual_seed(0)
    module = CumulativeBetweenLinears().eval()
    fast = torch.compile(module, backend=make_backend(kernel_cache))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in (1, 2):
            torch.testing.assert_close(fast(inputs(seed)), module(inputs(seed)), atol=1e-4, rtol=1e-4)
    (message,) = fallback_warnings(caught)  # one graph, compiled once
    assert_names_the_ops(message)


def test_torch_compile_backend_strict_refuses(fresh_dynamo, kernel_cache):
    fast = torch.compile(CumulativeBetweenLinears().eval(), backend=make_backend(kernel_cache, strict=True))
    with pytest.raises(Exception, match=r"aten\.cumprod.*test_partition\.py"), torch.no_grad():
        fast(inputs(0))


class PositionsAndTopK(nn.Module):
    """A constant (arange) read on both sides of an unsupported op, and an unsupported op with
    two results (topk: values and indices)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(5, C)

    def forward(self, x):
        positions = torch.arange(C).float()
        hidden = torch.cumprod(self.linear(x) + positions, dim=1)
        values, indices = hidden.topk(2, dim=-1)
        return hidden * positions + values.sum(-1, keepdim=True), indices


def test_constants_and_tuples_around_unsupported_ops(kernel_cache):
    torch.manual_seed(0)
    module = PositionsAndTopK()
    with pytest.warns(EagerFallbackWarning, match="aten.topk"):
        compiled = compile_module(module, (inputs(0),), kernel_cache)
    assert len(compiled.partitions) == 2
    for seed in (1, 2):  # several calls: a constant is compiled in, never left to a buffer
        for got, want in zip(compiled(inputs(seed)), module(inputs(seed)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# The fused fast path, with torch.backends.mha's flag on


def features(seed: int) -> torch.Tensor:
    return torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))


def padding_mask() -> torch.Tensor:
    """(B, T) True = padded: a few trailing positions of two rows."""
    return torch.arange(T)[None, :] >= torch.tensor([T, 4, 2])[:, None]


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_compile_compiles_the_encoder_fast_path(norm_first, fresh_dynamo, fast_path_untouched, kernel_cache):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, 2, 16, batch_first=True, norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first).eval()
    fast = torch.compile(encoder, backend=make_backend(kernel_cache))
    keep = ~padding_mask()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)  # every op compiled
        torch.testing.assert_close(fast(features(1)), encoder(features(1)), atol=1e-4, rtol=1e-4)
        got, want = fast(features(2), src_key_padding_mask=padding_mask()), encoder(features(2), src_key_padding_mask=padding_mask())
    # Eager's nested tensors write zeros at padded positions, where dynamo's dense graph (and
    # any compiler of it) computes values no one reads: compare the positions that are kept.
    torch.testing.assert_close(got[keep], want[keep], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("need_weights", [True, False])
def test_torch_compile_compiles_multihead_attention(need_weights, fresh_dynamo, fast_path_untouched, kernel_cache):
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(C, 2, batch_first=True).eval()

    def attend(x, padding):
        return attention(x, x, x, key_padding_mask=padding, need_weights=need_weights)

    fast = torch.compile(attend, backend=make_backend(kernel_cache))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        got, want = fast(features(1), padding_mask()), attend(features(1), padding_mask())
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


class FusedAttention(nn.Module):
    """Calls the fused kernel itself, as nn.MultiheadAttention's fast path does in eager."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(C, 2, batch_first=True)

    def forward(self, x, padding):
        a = self.attention
        return torch._native_multi_head_attention(x, x, x, C, 2, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight,
                                                  a.out_proj.bias, padding, True, True, 1)


def test_the_fused_attention_kernel_is_decomposed_and_compiled(fast_path_untouched, kernel_cache):
    torch.manual_seed(0)
    module = FusedAttention()
    compiled = compile_module(module, (features(0), padding_mask()), kernel_cache, strict=True)
    with torch.no_grad():
        for got, want in zip(compiled(features(1), padding_mask()), module(features(1), padding_mask()), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_decompositions_match_the_fused_kernels():
    """Against PyTorch's kernels directly, for each mask kind they take (no compile: fast)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, 2, 16, batch_first=True, activation="gelu").eval()
    a = layer.self_attn
    x, padding = features(0), padding_mask()
    additive = torch.zeros(B, T).masked_fill(padding, float("-inf"))
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    weights = (a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias)
    with torch.no_grad():
        for mask, mask_type in ((None, None), (padding, 1), (additive, 1), (causal, 0)):
            args = (x, x, x, C, 2, *weights, mask, True, False, mask_type)
            for want, got in zip(torch._native_multi_head_attention(*args), native_multi_head_attention(*args), strict=True):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for norm_first in (False, True):
            args = (x, C, 2, *weights, True, norm_first, layer.norm1.eps, layer.norm1.weight, layer.norm1.bias,
                    layer.norm2.weight, layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
                    layer.linear2.weight, layer.linear2.bias, padding, 1)
            torch.testing.assert_close(transformer_encoder_layer_fwd(*args), torch._transformer_encoder_layer_fwd(*args),
                                       atol=1e-5, rtol=1e-5)
