"""The whole Lumos model, lowered to primitives: interpreter and generated C against PyTorch eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumos.compile.frontend.lumos_model import batch_tensors, lower_model, output_names
from lumos.compile.ir.interpret import interpret
from lumos.compile.program import compile_graph, load_program
from lumos.data.contract import FeatureSpec
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

FEATURES = FeatureSpec(
    token_categorical={"item": 12, "event_type": 4, "hour": 24},
    token_numeric=("value", "age_days"),
    static_categorical={"user_country": 5},
    static_numeric=("user_tenure",),
    future_flags=("holiday", "sale"),
    horizons_days=(1, 3),
    max_len=32,
)
CONFIG = ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=2, d_ff=16, dropout=0.0, max_len=32)
# The quickstart data's shapes (lumos/quickstart/ingest.toml), at d=8.
QUICKSTART_FEATURES = FeatureSpec(
    token_categorical={"item": 502, "event_type": 5, "cat_device": 5, "hour": 24, "weekday": 7, "gap_bucket": 16},
    token_numeric=("value", "age_days"),
    static_categorical={"user_segment": 6, "user_country": 7},
    static_numeric=("user_tenure_days",),
    future_flags=("holiday", "sale"),
    horizons_days=(7, 30),
    max_len=100,
)


def trained_looking(model: LumosModel, seed: int = 0) -> LumosModel:
    """Weights far from init (zero biases and unit norms hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.eval()


def compare(model: LumosModel, got: dict[str, np.ndarray], batch) -> None:
    with torch.no_grad():
        expected = model(batch)
    for name in output_names(model):
        np.testing.assert_allclose(got[name], getattr(expected, name).numpy(), atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize(("features", "config", "rows", "length"), [
    (FEATURES, CONFIG, 3, 17),
    (QUICKSTART_FEATURES, ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=16, max_len=100), 4, 100),
    (FEATURES, ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=16, max_len=32,
                           encoder_attention="causal", position_targets=True, scale_item_embedding=True,
                           item_projection=False, item_bias=False), 3, 17),  # the MovieLens recipe's options
    (FEATURES, ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=0, d_ff=16, max_len=32,
                           heads=("retrieval",), encoder_attention="causal", position_targets=True,
                           attention="silu", relative_position_bias=True), 3, 17),  # HSTU's attention, no decoder
], ids=["awkward", "quickstart", "causal", "hstu"])
def test_interpreter_and_c_match_eager(features, config, rows, length, kernel_cache):
    torch.manual_seed(0)
    model = trained_looking(LumosModel(config, features))
    graph = lower_model(model, rows, length)
    batch = synthetic_batch(features, rows, length, seed=5)
    inputs = {name: value.float().numpy() for name, value in batch_tensors(batch, features).items()}
    inputs = {name: inputs[name] for name in graph.inputs}
    compare(model, interpret(graph, inputs), batch)
    program = load_program(compile_graph(graph, kernel_cache))
    program.threads = 3  # more threads than cores: kernels that skip a barrier must still be independent
    native = {name: value.reshape(graph.output_shapes[name]) for name, value in program(inputs).items()}
    compare(model, native, batch)


def test_heads_subset_and_no_numeric_features(kernel_cache):
    features = FeatureSpec(token_categorical={"item": 9}, token_numeric=(), horizons_days=(2,), max_len=6)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=8, max_len=6,
                         heads=("retrieval", "binary"))
    model = trained_looking(LumosModel(config, features))
    graph = lower_model(model, 2, 6)
    assert set(graph.outputs) == {"user_embedding", "item_query", "act_logits"}
    batch = synthetic_batch(features, 2, 6, seed=1)
    inputs = {name: value.float().numpy() for name, value in batch_tensors(batch, features).items()}
    compare(model, interpret(graph, {name: inputs[name] for name in graph.inputs}), batch)
