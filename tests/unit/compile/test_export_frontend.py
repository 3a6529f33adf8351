"""Modules no one here wrote, compiled through the general frontend and the torch.compile backend,
checked against eager PyTorch at 1e-4 on inputs they were not compiled with."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lumos.compile.frontend.export import compile_module, export_module, math_path, verify_module
from lumos.compile.frontend.lumos_model import UnsupportedOp, lower_program
from lumos.compile.frontend.partition import EagerFallbackWarning
from lumos.compile.frontend.torch_backend import make_backend
from lumos.compile.ir.interpret import interpret

ROOT = Path(__file__).resolve().parents[3]
B, T, C = 3, 7, 8  # awkward sizes; two heads of 4


def load_sasrec_benchmark():
    spec = importlib.util.spec_from_file_location("sasrec_benchmark", ROOT / "benchmarks" / "sasrec.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sasrec_benchmark"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


class Encoder(nn.Module):
    """nn.TransformerEncoder as a user builds it (nested tensors on by default), with a padding mask."""

    def __init__(self, norm_first: bool):
        super().__init__()
        layer = nn.TransformerEncoderLayer(C, 2, 16, dropout=0.1, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding)


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(C, 2, batch_first=True)

    def forward(self, x, padding):
        return self.attention(x, x, x, key_padding_mask=padding)  # (output, head-averaged weights)


def padding_mask(seed: int) -> torch.Tensor:
    """(B, T) True = padded: a few trailing positions of some rows, never a whole row."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=generator)
    return torch.arange(T)[None, :] >= lengths[:, None]


def item_ids(seed: int) -> torch.Tensor:
    """(B, T) left-padded ids of a 30-item vocabulary (0 = padding)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 30, (B, T), generator=generator)
    ids[0, :3] = 0
    ids[1, :1] = 0
    return ids


def features(seed: int) -> torch.Tensor:
    return torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))


def make_case(name: str) -> tuple[nn.Module, callable]:
    """A module with freshly seeded weights, and its inputs for a seed."""
    torch.manual_seed(0)
    if name.startswith("encoder"):
        return Encoder(norm_first=name == "encoder_norm_first"), lambda seed: (features(seed), padding_mask(seed))
    if name == "multihead_attention":
        return SelfAttention(), lambda seed: (features(seed), padding_mask(seed))
    if name == "mlp":
        mlp = nn.Sequential(nn.Linear(C, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, C))
        return mlp, lambda seed: (features(seed),)
    sasrec = load_sasrec_benchmark()
    model = sasrec.SASRec(sasrec.SASRecConfig(d_model=C, n_heads=2, layers=2), item_vocab_size=30, max_len=T)
    return model, lambda seed: (item_ids(seed),)


CASES = ["encoder_norm_after", "encoder_norm_first", "multihead_attention", "mlp", "sasrec"]


@pytest.mark.parametrize("name", CASES)
def test_compile_module_matches_eager(name, kernel_cache):
    module, inputs = make_case(name)
    module.train()  # compile_module traces (and verifies) in eval mode and leaves the mode as it was
    compiled = compile_module(module, inputs(0), kernel_cache, strict=True)  # every op compiled
    assert module.training
    checks = [inputs(1), inputs(2)]
    if name in ("mlp", "sasrec"):
        assert compiled.batch == B  # symbolic: any rows, checked at B - 1 and B + 1 when compiled
        checks += [[value[:1] for value in inputs(2)], [torch.cat([value, value, value[:1]]) for value in inputs(1)]]
    else:
        # nn.MultiheadAttention computes in (T, B, C) order inside: a batch dim that is not dim 0
        # of every intermediate is not symbolic (ir.mark_batch), so these run at B rows only.
        assert compiled.batch is None
    error = verify_module(compiled, module, checks)
    assert error < 1e-4 and compiled.max_error < 1e-4
    # Eager's fused fast path writes zeros at padded positions (nested tensors); the math path
    # (what is compiled) computes them like any other: compare with the math path.
    with math_path(module), torch.no_grad():
        expected = module(*inputs(3))
    got = compiled(*inputs(3))
    assert type(got) is type(expected)
    for want, have in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got), strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        assert torch.allclose(have, want, atol=1e-4, rtol=1e-4)


def test_wrong_shape_is_refused(kernel_cache):
    module, inputs = make_case("mlp")
    compiled = compile_module(module, inputs(0), kernel_cache)
    with pytest.raises(ValueError, match="compile again for these shapes"):
        compiled(torch.randn(B, T, C + 1))


class Untidy(nn.Module):
    """Returns a dict with a None, an input as is, one tensor twice; ignores an argument."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, unused):
        y = self.linear(x)
        return {"y": y, "x": x, "none": None, "pair": (y, y)}


def test_return_structure_is_kept(kernel_cache):
    module = Untidy()
    compiled = compile_module(module, (torch.randn(2, 4), torch.randn(3)), kernel_cache)
    x = torch.randn(2, 4)
    got = compiled(x, torch.randn(3))
    assert got["none"] is None and torch.equal(got["x"], x)
    torch.testing.assert_close(got["pair"][1], module(x, None)["y"], atol=1e-4, rtol=1e-4)


class ConstantOutputs(nn.Module):
    """Outputs that are constants of the graph: an arange (folded into a literal while lowering)
    and a filled tensor (a scalar constant), beside the ids reshaped."""

    def forward(self, ids):
        return torch.arange(0, ids.numel(), ids.shape[1]), torch.full((2, 3), 2.5), ids.reshape(-1)


def test_constant_outputs_are_written_every_call(kernel_cache):
    ids = torch.arange(12).reshape(3, 4)
    compiled = compile_module(ConstantOutputs(), (ids,), kernel_cache, strict=True)
    for call in range(3):  # the caller's output arrays are fresh each call: a constant no kernel writes is junk
        garbage = [torch.full((64,), 7.0 + call) for _ in range(32)]  # fills memory numpy may hand out next
        del garbage
        positions, filled, flat = compiled(ids)
        assert positions.tolist() == [0, 4, 8] and torch.equal(filled, torch.full((2, 3), 2.5))
        assert flat.tolist() == list(range(12))


def test_core_aten_graph_lowers():
    """A fully decomposed export (core aten: addmm, native_layer_norm, where, any …) lowers too."""
    module, inputs = make_case("encoder_norm_after")
    program = export_module(module, inputs(0)).run_decompositions()
    graph = lower_program(program, ["x", "padding"], ["y"])
    got = interpret(graph, {"x": inputs(1)[0].numpy(), "padding": inputs(1)[1].float().numpy()})["y"]
    with math_path(module), torch.no_grad():
        want = module(*inputs(1)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


class OpZoo(nn.Module):
    """One use of each lowering the models above do not reach."""

    def forward(self, x, ids, keep):
        square = x.flatten(1).unflatten(1, (T, C))  # (B, T, C)
        scores = square @ square.transpose(1, 2)  # (B, T, T)
        dropped = ~keep  # bitwise_not of a bool
        return (
            (ids >= 3).float() + (ids <= 5).float(),
            (x >= x.mean()).float() + (x <= 0).float(),
            torch.erf(x) + torch.cos(x) + nn.functional.silu(x) + torch.square(x) + x.abs().pow(0.5) + x.pow(3),
            torch.var(x, dim=-1, keepdim=True) + torch.log_softmax(x, dim=-1),
            scores.triu(1) + torch.zeros(T, T) + torch.full((T, T), 2.0) + torch.ones_like(scores),
            x.masked_fill(dropped[..., None], torch.tensor(-1.5)) + torch.zeros_like(x),
            nn.functional.scaled_dot_product_attention(x, x * 0.5, x, is_causal=True),
        )


def test_each_general_lowering_matches_eager(kernel_cache):
    generator = torch.Generator().manual_seed(4)
    args = (torch.randn(B, T, C, generator=generator), torch.randint(0, 9, (B, T), generator=generator),
            torch.rand(B, T, generator=generator) > 0.3)
    compiled = compile_module(OpZoo(), args, kernel_cache, strict=True)  # verified against eager on args
    assert compiled.max_error < 1e-4 and len(compiled.outputs) == 7


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cumprod(self.scale(x), dim=1)


def test_unsupported_op_is_named_with_its_line(kernel_cache):
    with pytest.raises(UnsupportedOp) as raised:
        compile_module(Cumulative(), (torch.randn(2, 4),), kernel_cache, strict=True)
    message = str(raised.value)
    assert "aten.cumprod" in message and "test_export_frontend.py" in message and "torch.cumprod" in message


# ---------------------------------------------------------------------------------------------
# torch.compile(backend="lumos")


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["encoder_norm_first", "sasrec"])
def test_torch_compile_backend_matches_eager(name, fresh_dynamo, monkeypatch, tmp_path):
    monkeypatch.setenv("LUMOS_KERNEL_CACHE", str(tmp_path))  # the registered backend's default cache
    module, inputs = make_case(name)
    module.eval()
    fast = torch.compile(module, backend="lumos")  # with the fast path on: dynamo traces the fused kernels
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)  # every op compiled
        for seed in (1, 2):
            torch.testing.assert_close(fast(*inputs(seed)), module(*inputs(seed)), atol=1e-4, rtol=1e-4)
    assert any(tmp_path.rglob("library.so"))  # it ran compiled code, not the eager fallback


def test_torch_compile_backend_strict_fails_loudly_on_an_unsupported_op(fresh_dynamo, kernel_cache):
    fast = torch.compile(Cumulative(), backend=make_backend(kernel_cache, strict=True))
    with pytest.raises(Exception, match=r"aten\.cumprod.*test_export_frontend\.py.*torch\.cumprod"), torch.no_grad():
        fast(torch.randn(2, 4))


def test_torch_compile_backend_follows_weights_and_refuses_gradients(fresh_dynamo, kernel_cache):
    module, inputs = make_case("mlp")
    fast = torch.compile(module.eval(), backend=make_backend(kernel_cache))
    (x,) = inputs(1)
    with torch.no_grad():
        before = fast(x)
        module[0].weight.mul_(2.0)  # in place: the compiled program binds the new weights
        torch.testing.assert_close(fast(x), module(x), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(before, module(x), atol=1e-3)
        module[3].bias = nn.Parameter(torch.ones(C))  # replaced: bound too
        torch.testing.assert_close(fast(x), module(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(Exception, match="inference only"):
        fast(x)


def test_torch_compile_backend_compiles_each_dynamic_size(fresh_dynamo, kernel_cache):
    module, _ = make_case("mlp")
    fast = torch.compile(module.eval(), backend=make_backend(kernel_cache), dynamic=True)
    with torch.no_grad():
        for rows in (2, 5):
            x = torch.randn(rows, C)
            torch.testing.assert_close(fast(x), module(x), atol=1e-4, rtol=1e-4)
