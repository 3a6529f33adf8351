"""Models no one here wrote, compiled as a user would: `torch.compile(model.eval(), backend=...)`
under torch.no_grad(), checked against eager at 1e-4, with the exact set of ops left to eager
(a lowering that regresses moves an op into that set and fails here).

Hugging Face BERT and GPT-2 built from a config (random weights, nothing downloaded), a
ResNet-style network and a DLRM-style ranking model (benchmarks/brought_models.py, at its tiny
size), and the lowerings they needed (batch norm in eval mode, max/average/adaptive pooling, stack,
tril_indices, cat with Hugging Face's empty KV cache)."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from lumos.compile.frontend.export import compile_module
from lumos.compile.frontend.partition import EagerFallbackWarning
from lumos.compile.frontend.torch_backend import make_backend
from lumos.compile.ir.graph import REDUCE, Op

ROOT = Path(__file__).resolve().parents[3]


def _load_brought_models():
    spec = importlib.util.spec_from_file_location("brought_models", ROOT / "benchmarks" / "brought_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["brought_models"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


brought = _load_brought_models()
TINY = brought.TINY


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def eager_ops(caught) -> set[str]:
    """The aten ops the EagerFallbackWarnings name (one line each: `  aten.op in module (file:line)`)."""
    return {line.split()[0] for warning in caught if issubclass(warning.category, EagerFallbackWarning)
            for line in str(warning.message).splitlines() if line.startswith("  aten.")}


def run_compiled(model: nn.Module, kernel_cache, calls: list[dict]) -> tuple[list, set[str]]:
    """The model through torch.compile with the Lumos backend, in one graph (fullgraph: no break
    hands a piece back to Python), on each call's keyword inputs; and the ops run in eager."""
    fast = torch.compile(model, backend=make_backend(kernel_cache), fullgraph=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = [fast(**inputs) for inputs in calls]
    return outputs, eager_ops(caught)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_hugging_face_bert(fresh_dynamo, kernel_cache):
    pytest.importorskip("transformers")  # a safety net: CI installs it (pyproject's dev extra)
    model = brought.bert(TINY)
    calls = [dict(zip(("input_ids", "attention_mask"), brought.text_inputs(TINY, seed), strict=True)) for seed in (1, 2)]
    outputs, in_eager = run_compiled(model, kernel_cache, calls)
    assert in_eager == set()
    with torch.no_grad():
        for got, inputs in zip(outputs, calls, strict=True):
            want = model(**inputs)
            assert_close(got.last_hidden_state, want.last_hidden_state)
            assert_close(got.pooler_output, want.pooler_output)


def test_hugging_face_gpt2_with_its_kv_cache(fresh_dynamo, kernel_cache):
    """GPT2LMHeadModel as called for generation's first step: logits and the new KV cache (which
    starts as empty tensors that torch.cat skips)."""
    pytest.importorskip("transformers")
    model = brought.gpt2(TINY)
    calls = [dict(zip(("input_ids", "attention_mask"), brought.text_inputs(TINY, seed), strict=True)) for seed in (1, 2)]
    outputs, in_eager = run_compiled(model, kernel_cache, calls)
    assert in_eager == set()
    with torch.no_grad():
        for got, inputs in zip(outputs, calls, strict=True):
            want = model(**inputs)
            assert_close(got.logits, want.logits)
            for got_layer, want_layer in zip(got.past_key_values.layers, want.past_key_values.layers, strict=True):
                assert_close(got_layer.keys, want_layer.keys)
                assert_close(got_layer.values, want_layer.values)


def test_resnet(fresh_dynamo, kernel_cache):
    """Convolutions, batch norm (eval), ReLU, residual adds, max pooling (3, stride 2, padding 1),
    global average pooling and the classifier: every op compiled."""
    model = brought.resnet(TINY)
    calls = [{"x": brought.image_inputs(TINY, seed)[0]} for seed in (1, 2)]
    outputs, in_eager = run_compiled(model, kernel_cache, calls)
    assert in_eager == set()
    with torch.no_grad():
        for got, inputs in zip(outputs, calls, strict=True):
            assert_close(got, model(**inputs))


def test_dlrm(fresh_dynamo, kernel_cache):
    """EmbeddingBag tables with runtime offsets (bags of different sizes, other ones at the second
    call), the bottom MLP, the pairwise interaction (stack, bmm, tril_indices, indexing), the top MLP."""
    model = brought.dlrm(TINY)
    calls = [dict(zip(("dense", "ids", "offsets"), brought.ranking_inputs(TINY, seed), strict=True)) for seed in (1, 2)]
    assert not torch.equal(calls[0]["offsets"], calls[1]["offsets"])
    outputs, in_eager = run_compiled(model, kernel_cache, calls)
    assert in_eager == set()
    with torch.no_grad():
        for got, inputs in zip(outputs, calls, strict=True):
            assert_close(got, model(**inputs))


class Lowerings(nn.Module):
    """One use of each lowering these models brought, at awkward sizes and arguments."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(3)
        self.norm_without_affine = nn.BatchNorm1d(3, affine=False)
        self.norm.running_mean.normal_()
        self.norm.running_var.uniform_(0.5, 2.0)
        self.norm.weight.data.uniform_(0.5, 1.5)

    def forward(self, image, signal):  # (2, 3, 9, 6), (2, 3, 9)
        return (F.max_pool2d(image, 3, 2, 1), F.max_pool2d(image, (2, 3), (1, 2), (1, 0), dilation=(2, 1)),
                F.max_pool2d(image[0], 2),  # unbatched
                F.avg_pool2d(image, 3, 2, 1), F.avg_pool2d(image, 3, 2, 1, count_include_pad=False),
                F.avg_pool2d(image[..., :8, :], 2, ceil_mode=True),  # no partial window: the floor's sizes
                F.adaptive_avg_pool2d(image, 1), F.adaptive_avg_pool2d(image, (3, 2)), F.adaptive_avg_pool1d(signal, 3),
                F.max_pool1d(signal, 3, 1, 1), F.avg_pool1d(signal, 2),
                self.norm(image), self.norm_without_affine(signal),
                torch.stack([signal, -signal], dim=-1), signal[:, torch.tril_indices(3, 3, -1)[0]],
                torch.cat([torch.tensor([]), signal], dim=-1))  # a 1-D empty tensor is skipped


def test_lowerings_the_models_brought(kernel_cache):
    torch.manual_seed(0)
    module = Lowerings().eval()
    generator = torch.Generator().manual_seed(0)
    example = (torch.randn(2, 3, 9, 6, generator=generator), torch.randn(2, 3, 9, generator=generator))
    compiled = compile_module(module, example, kernel_cache, strict=True)
    inputs = (torch.randn(2, 3, 9, 6, generator=generator), torch.randn(2, 3, 9, generator=generator))
    with torch.no_grad():
        for got, want in zip(compiled(*inputs), module(*inputs), strict=True):
            assert_close(got, want)


def test_partial_pooling_windows_run_in_eager(kernel_cache):
    """ceil_mode with a partial last window and adaptive pooling with uneven windows have no
    lowering: they run in eager, named."""
    module = nn.Sequential(nn.Conv2d(3, 4, 1), nn.MaxPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d(3))
    with pytest.warns(EagerFallbackWarning) as caught:
        compiled = compile_module(module, (torch.randn(2, 3, 9, 9),), kernel_cache)
    assert eager_ops(caught) == {"aten.max_pool2d.default", "aten.adaptive_avg_pool2d.default"}
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        assert_close(compiled(x), module(x))


def test_no_kernel_recomputes_what_overlapping_windows_read(kernel_cache):
    """A convolution's input read through its sliding windows is stored once, never computed
    inline by the kernel that reads the windows: each overlapping window would recompute it (in
    a ResNet block, the previous convolution's dot products nine times over: 100x slower)."""
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.MaxPool2d(2))
    compiled = compile_module(module.eval(), (torch.randn(2, 3, 10, 10),), kernel_cache, strict=True)
    for kernel in compiled.compilation.kernels:
        inlined = set(kernel.unique_fused)
        for node in inlined:
            assert not any(src in inlined and view.repeats and not view.broadcasts
                           for src, view in zip(node.srcs, node.views, strict=True)), (kernel.name, node)
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        assert_close(compiled(x), module(x))


def test_a_convolutions_matmul_is_stored_before_the_next_ones_padding(kernel_cache):
    """A convolution's matmul (with its batch norm and ReLU) read by a padded convolution or
    pooling is a kernel of its own: computed inside the padded copy, its dot products would run
    per padded element under the padding's guard, outside the matmul loops (ResNet ~25x slower)."""
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                           nn.ReLU(), nn.MaxPool2d(3, 2, padding=1))
    compiled = compile_module(module.eval(), (torch.randn(2, 3, 10, 10),), kernel_cache, strict=True)
    padded_matmuls = [kernel.name for kernel in compiled.compilation.kernels
                      if any(node.op in REDUCE for node in kernel.unique_fused)
                      and any(view.mask is not None for node in kernel.unique_fused for view in node.views)]
    assert padded_matmuls == []
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        assert_close(compiled(x), module(x))


class ShortcutBlock(nn.Module):
    """A ResNet block's end: a convolution plus a strided 1×1 shortcut convolution, ReLU, and
    the global average pooling that reads it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.shortcut = nn.Conv2d(3, 4, 1, stride=2)

    def forward(self, x):
        return F.adaptive_avg_pool2d(F.relu(self.conv(x) + self.shortcut(x)), 1)


def test_a_kernel_computes_one_matmul_outside_any_other_reduction(kernel_cache):
    """The two convolutions a residual add joins are two kernels, and the pooling reads the
    stored sum: one kernel with both matmuls, or a matmul inside the pooling's sum, runs as
    strided dot products, never row-wise (a ResNet's last block was 60% of a call)."""
    module = ShortcutBlock().eval()
    compiled = compile_module(module, (torch.randn(2, 3, 9, 9),), kernel_cache, strict=True)
    for kernel in compiled.compilation.kernels:
        reductions = [node for node in kernel.unique_fused if node.op in REDUCE]
        matmuls = [node for node in reductions if any(src.op is Op.MUL for src in node.srcs)]
        assert len(matmuls) <= 1 and (not matmuls or reductions == matmuls), kernel.name
    x = torch.randn(3, 3, 9, 9)
    with torch.no_grad():
        assert_close(compiled(x), module(x))


def test_the_search_checks_max_pooling_of_a_symbolic_batch(kernel_cache):
    """Max pooling's -inf border is a literal of the batch's rows: the search's reference, at
    fewer rows than traced, reads its first rows (it used to fail to broadcast them)."""
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1)).eval()
    compiled = compile_module(module, (torch.randn(4, 3, 8, 8),), kernel_cache, strict=True, search_budget=1)
    assert compiled.batch == 4 and compiled.compilation.search is not None
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        assert_close(compiled(x), module(x))
