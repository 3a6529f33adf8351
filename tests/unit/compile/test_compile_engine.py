"""The engine: a plan written to disk and loaded back serves any batch and history length."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from lumos.compile.engine import (
    PLAN_FILE,
    VerificationError,
    compile_model,
    program_from_plan,
    verify,
    write_plan,
)
from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import ENTRY, KernelCache
from lumos.compile.target import CUDA
from lumos.core.settings import CompileSettings
from lumos.data.contract import FeatureSpec
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

FEATURES = FeatureSpec(
    token_categorical={"item": 12, "hour": 24},
    token_numeric=("value",),
    static_categorical={"user_country": 5},
    future_flags=("sale",),
    horizons_days=(2,),
    max_len=10,
)
CONFIG = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=10)


@pytest.fixture(scope="module")
def model() -> LumosModel:
    torch.manual_seed(0)
    return LumosModel(CONFIG, FEATURES).eval()


@pytest.fixture(scope="module")
def compiled(model, kernel_cache):
    result = compile_model(model, 4, 10, kernel_cache)
    result.compiled.program.threads = 3
    verify(result, model)
    return result


@pytest.mark.parametrize(("rows", "length"), [(1, 10), (3, 4), (4, 10), (9, 7), (0, 5)])
def test_any_batch_and_shorter_histories_match_eager(compiled, model, rows, length):
    batch = synthetic_batch(FEATURES, rows, length, seed=rows + length) if rows else synthetic_batch(FEATURES, 1, length)
    if not rows:
        batch = type(batch)(**{f.name: _head(getattr(batch, f.name), 0) for f in dataclasses.fields(batch)})
    with torch.no_grad():
        expected = model(batch)
    got = compiled.compiled(batch)
    for name in ("user_embedding", "item_query", "act_logits", "value_pred"):
        np.testing.assert_allclose(getattr(got, name).numpy(), getattr(expected, name).numpy(), atol=1e-4, rtol=1e-4)


def _head(value, rows):
    return {key: tensor[:rows] for key, tensor in value.items()} if isinstance(value, dict) else value[:rows]


def test_the_batch_is_symbolic(compiled):
    assert compiled.plan["symbolic_batch"] and compiled.compilation.graph.batch == 4
    assert "i0 < n;" in compiled.compilation.source


def test_matmuls_run_row_wise_with_fused_producers(compiled):
    source = compiled.compilation.source
    assert "_row[" in source  # reductions moved outside the output row (render_c.interchange)
    assert "_steps[" in source  # GELU / softmax of the previous layer computed per step, vectorized
    assert "nowait" in source  # some kernels skip the barrier


def test_longer_history_than_the_plan_is_refused(compiled):
    with pytest.raises(ValueError, match="exceeds the plan"):
        compiled.compiled(synthetic_batch(FEATURES, 2, 11))


def test_plan_round_trip_binds_the_models_weights(compiled, model, tmp_path, kernel_cache):
    folder = write_plan(tmp_path / "plan", compiled)
    assert any(entry["name"].endswith("#T") for entry in compiled.plan["tensors"])  # transposed at bind time
    loaded = program_from_plan(folder, model, kernel_cache)
    batch = synthetic_batch(FEATURES, 5, 8, seed=11)
    np.testing.assert_array_equal(loaded(batch).user_embedding.numpy(), compiled.compiled(batch).user_embedding.numpy())

    longer = synthetic_batch(FEATURES, 2, 10, seed=3)  # the plan was built at 10: served in PyTorch beyond
    short_plan = compile_model(model, 2, 6, kernel_cache)
    write_plan(tmp_path / "short", short_plan)
    with pytest.warns(UserWarning, match="running this batch in PyTorch"):
        served = program_from_plan(tmp_path / "short", model, kernel_cache)(longer)
    with torch.no_grad():
        np.testing.assert_array_equal(served.user_embedding.numpy(), model(longer).user_embedding.numpy())

    retrained = LumosModel(CONFIG, FEATURES).eval()  # same architecture, other weights: the plan serves it
    with torch.no_grad():
        expected = retrained(batch)
    np.testing.assert_allclose(program_from_plan(folder, retrained, kernel_cache)(batch).act_logits.numpy(),
                               expected.act_logits.numpy(), atol=1e-4, rtol=1e-4)

    other = LumosModel(dataclasses.replace(CONFIG, d_ff=8), FEATURES)
    assert program_from_plan(folder, other, kernel_cache) is None  # another architecture: no plan
    (folder / PLAN_FILE).write_text((folder / PLAN_FILE).read_text().replace('"source_sha256": "', '"source_sha256": "0'))
    with pytest.raises(Exception, match="does not match"):
        program_from_plan(folder, model, kernel_cache)


def test_a_plan_is_built_with_local_compiler_settings_not_its_own(compiled, model, tmp_path):
    folder = write_plan(tmp_path / "plan", compiled)
    plan = json.loads((folder / PLAN_FILE).read_text())
    # A plan from elsewhere naming a compiler and flags that would fail (or do harm) here.
    plan["cc"], plan["cflags"] = "/nonexistent/evil-cc", ["-DNOT_FROM_THIS_HOST", "--no-such-flag"]
    (folder / PLAN_FILE).write_text(json.dumps(plan))
    local = CompileSettings(cc="gcc", cflags=("-O1",))
    cache = KernelCache(tmp_path / "kernels")
    loaded = program_from_plan(folder, model, cache, local)
    batch = synthetic_batch(FEATURES, 3, 8, seed=5)
    np.testing.assert_allclose(loaded(batch).user_embedding.numpy(), compiled.compiled(batch).user_embedding.numpy(),
                               atol=1e-5, rtol=1e-5)
    [entry] = cache.entries()
    built = json.loads((entry / ENTRY).read_text())
    assert (built["cc"], built["flags"]) == ("gcc", ["-O1"])


def test_verification_refuses_a_wrong_program(compiled, model):
    broken = LumosModel(CONFIG, FEATURES).eval()  # the plan bound to other weights than the model checked
    with torch.no_grad():
        for param in broken.parameters():
            param.add_(0.5)
    with pytest.raises(VerificationError, match="differs from PyTorch"):
        verify(compiled, broken)


def test_the_cuda_target_goes_through_the_same_engine_and_loads_only_on_a_gpu(model, tmp_path):
    """Without a GPU: traced, fused, rendered and built by NVRTC, its plan made and written as the
    C target's is; `compiled` only where a GPU can run it."""
    pytest.importorskip("cuda.bindings.nvrtc")
    result = compile_model(model, 4, 10, KernelCache(tmp_path / "kernels", "cuda"), Options(arch="sm_90"), target=CUDA)
    assert (result.compiled is not None) == torch.cuda.is_available()
    assert result.plan["target"] == "cuda" and result.plan["arch"] == "sm_90"
    assert len(result.plan["launches"]) == result.plan["stats"]["kernels"] == len(result.compilation.kernels)
    assert b".target sm_90" in result.compilation.build.library.read_bytes()
    folder = write_plan(tmp_path / "plan", result)
    assert sorted(path.name for path in folder.iterdir()) == ["kernels.cu", PLAN_FILE]
    assert (folder / "kernels.cu").read_text() == result.compilation.source
