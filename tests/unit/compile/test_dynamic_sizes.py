"""torch.compile(dynamic=True) with backend="lumos": a new sequence length reuses its bucket's
program (inputs padded with zeros, outputs sliced: frontend/buckets.py) where padding is exact,
and falls back to a program per length where it is not; eager's results either way."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lumos.compile.frontend import torch_backend
from lumos.compile.frontend.buckets import bucket
from lumos.compile.frontend.torch_backend import make_backend

C, VOCAB = 16, 30


class CausalLM(nn.Module):
    """Token ids (B, T) → logits (B, T, VOCAB): a position reads only earlier ones, so padding T
    changes nothing the caller keeps."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, C)
        self.qkv = nn.Linear(C, 3 * C)
        self.norm = nn.LayerNorm(C)
        self.head = nn.Linear(C, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)  # (B, T, C)
        q, k, v = self.qkv(x).split(C, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(self.norm(x))


class Bidirectional(nn.Module):
    """Every position attends to all: padding T would change every output; compiled per length."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)

    def forward(self, x):
        q, k, v = self.qkv(x).split(C, dim=-1)
        return F.scaled_dot_product_attention(q, k, v)


class MaskedEncoder(nn.Module):
    """Bidirectional, but given an attention mask (1: a token, 0: padding) as BERT is: padding the
    mask with zeros masks the padded keys out, so one program serves every length."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)

    def forward(self, x, mask):  # (B, T, C), (B, T)
        q, k, v = self.qkv(x).split(C, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :] > 0)


@pytest.fixture
def counted_compiles(monkeypatch):
    """How many programs the backend compiles (compile_module itself runs: this only counts)."""
    calls = []
    compile_module = torch_backend.compile_module

    def counting(*args, **kwargs):
        calls.append(tuple(args[1][0].shape))
        return compile_module(*args, **kwargs)

    monkeypatch.setattr(torch_backend, "compile_module", counting)
    torch._dynamo.reset()
    yield calls
    torch._dynamo.reset()


def test_bucket_rounds_up():
    assert [bucket(size, 1, None) for size in (1, 8, 9, 16, 17, 40)] == [16, 16, 16, 16, 32, 64]
    assert [bucket(size, 0, None) for size in (1, 2, 3, 5)] == [1, 2, 4, 8]  # dim 0: no floor
    assert bucket(9, 1, 48) == 48  # a declared maximum: one program for every length


def test_lengths_8_9_10_compile_once(counted_compiles, kernel_cache):
    torch.manual_seed(0)
    module = CausalLM().eval()
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True), dynamic=True)
    with torch.no_grad():
        for length in (8, 9, 10, 9):
            ids = torch.randint(0, VOCAB, (2, length))
            got = fast(ids)
            assert got.shape == (2, length, VOCAB)
            torch.testing.assert_close(got, module(ids), atol=1e-4, rtol=1e-4)
    assert counted_compiles == [(2, 16)]  # one program, at the bucket of 16


def test_a_declared_maximum_serves_every_length(counted_compiles, kernel_cache):
    torch.manual_seed(0)
    module = CausalLM().eval()
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True))
    with torch.no_grad():
        for length in (5, 20, 31):
            ids = torch.randint(0, VOCAB, (2, length))
            torch._dynamo.mark_dynamic(ids, 1, max=32)
            torch.testing.assert_close(fast(ids), module(ids), atol=1e-4, rtol=1e-4)
    assert counted_compiles == [(2, 32)]


def test_padding_that_changes_results_falls_back_to_a_program_per_length(counted_compiles, kernel_cache):
    torch.manual_seed(0)
    module = Bidirectional().eval()
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True), dynamic=True)
    with torch.no_grad():
        for length in (8, 9, 9):
            x = torch.randn(2, length, C)
            torch.testing.assert_close(fast(x), module(x), atol=1e-4, rtol=1e-4)
    # The bucket's program was built, its padded result refused; then one per length.
    assert counted_compiles == [(2, 16, C), (2, 8, C), (2, 9, C)]


def test_a_model_that_masks_its_padding_compiles_once(counted_compiles, kernel_cache):
    torch.manual_seed(0)
    module = MaskedEncoder().eval()
    fast = torch.compile(module, backend=make_backend(kernel_cache, strict=True), dynamic=True)
    with torch.no_grad():
        for length in (8, 9, 10):
            x, mask = torch.randn(2, length, C), torch.ones(2, length)
            mask[0, -2:] = 0  # the caller's own padding
            torch.testing.assert_close(fast(x, mask), module(x, mask), atol=1e-4, rtol=1e-4)
    assert counted_compiles == [(2, 16, C)]


def test_hugging_face_bert_compiles_once_for_every_length(counted_compiles, kernel_cache):
    """BERT pads with its attention mask; dynamo bounds the length by its position table (32 in
    the tiny config): one program, at that maximum, for every length."""
    pytest.importorskip("transformers")
    brought = sys.modules.get("brought_models") or _load_brought_models()
    model = brought.bert(brought.TINY)
    fast = torch.compile(model, backend=make_backend(kernel_cache, strict=True), dynamic=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for length in (8, 9, 10):
            ids = torch.randint(0, brought.TINY.vocab, (2, length), generator=generator)
            mask = torch.ones(2, length, dtype=torch.long)
            mask[1, -3:] = 0
            torch.testing.assert_close(fast(ids, mask), model(ids, mask), atol=1e-4, rtol=1e-4)
    assert counted_compiles == [(2, 32)]


def _load_brought_models():
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "brought_models.py"
    spec = importlib.util.spec_from_file_location("brought_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["brought_models"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
