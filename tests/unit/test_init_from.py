"""init_from's tensor matching and freeze on tiny models (no Spark, no MLflow: those are in
tests/integration/test_init_from.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from lumos.core.errors import UsageError
from lumos.data.contract import FeatureSpec
from lumos.train.config import TrainConfig
from lumos.train.init_from import freeze, frozen_parameters, load_matching, match_tensors
from lumos.train.loop import build_optimizer
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelConfig

FEATURES = FeatureSpec(
    token_categorical={"item": 12, "event_type": 4, "hour": 24}, token_numeric=("value",),
    static_categorical={"user_country": 5}, horizons_days=(1, 3), max_len=32,
)

RETRIEVAL_ONLY = ModelConfig(d_model=8, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=16, dropout=0.0,
                             max_len=32, heads=("retrieval",))
ALL_HEADS = dataclasses.replace(RETRIEVAL_ONLY, heads=("retrieval", "binary", "regression"))


def model(config: ModelConfig, seed: int) -> LumosModel:
    torch.manual_seed(seed)
    return LumosModel(config, FEATURES)


def test_matching_tensors_load_exactly_and_new_heads_keep_their_init(tmp_path):
    parent, child = model(RETRIEVAL_ONLY, seed=1), model(ALL_HEADS, seed=2)
    fresh = {name: tensor.clone() for name, tensor in child.state_dict().items()}
    save_file({name: tensor.contiguous() for name, tensor in parent.state_dict().items()}, str(tmp_path / "w.safetensors"))

    match = load_matching(child, tmp_path / "w.safetensors")

    assert set(match.new) == {"act_head.weight", "act_head.bias", "value_head.weight", "value_head.bias",
                              "log_variance.binary", "log_variance.regression"}
    assert match.unused == [] and len(match.loaded) == len(parent.state_dict())
    loaded, theirs = child.state_dict(), parent.state_dict()
    for name in match.loaded:
        assert torch.equal(loaded[name], theirs[name]), name
    for name in match.new:
        assert torch.equal(loaded[name], fresh[name]), name
    assert not torch.equal(fresh["encoder.0.attn.query.weight"], theirs["encoder.0.attn.query.weight"])


def test_a_shape_mismatch_names_every_tensor_and_both_shapes():
    parent, child = model(RETRIEVAL_ONLY, seed=1), model(dataclasses.replace(RETRIEVAL_ONLY, d_ff=24), seed=1)
    with pytest.raises(UsageError) as error:
        match_tensors(parent.state_dict(), child.state_dict())
    message = str(error.value)
    assert "encoder.0.mlp.fc.weight: the parent's is (16, 8), the child's (24, 8)" in message
    assert "encoder.1.mlp.fc.weight" in message and "decoder.0.mlp.proj.weight" in message


def test_parent_tensors_the_child_lacks_are_unused():
    match = match_tensors(model(ALL_HEADS, seed=1).state_dict(), model(RETRIEVAL_ONLY, seed=1).state_dict())
    assert "act_head.weight" in match.unused and match.new == []


def test_freeze_keeps_named_parameters_out_of_the_optimizer_and_unchanged():
    child = model(ALL_HEADS, seed=0)
    frozen = freeze(child, ("encoder", "token_embeddings"))
    assert "encoder.0.attn.query.weight" in frozen and "token_embeddings.item.weight" in frozen
    assert "encoder_ln.weight" not in frozen  # matched at a dot, not as a string prefix
    before = {name: tensor.clone() for name, tensor in child.state_dict().items()}
    optimizer = build_optimizer(child, TrainConfig(optim=dataclasses.replace(TrainConfig().optim, lr=1e-2)))
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert all(id(p) not in optimized for name, p in child.named_parameters() if name in frozen)
    for seed in range(3):
        total, _ = child.loss(synthetic_batch(FEATURES, 4, 9, seed=seed))
        total.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = child.state_dict()
    for name in frozen:
        assert torch.equal(after[name], before[name]), name
    assert not torch.equal(after["encoder_ln.weight"], before["encoder_ln.weight"])
    assert not torch.equal(after["act_head.weight"], before["act_head.weight"])


def test_an_unknown_freeze_prefix_is_named():
    with pytest.raises(UsageError, match=r"'encoders' names no parameter"):
        frozen_parameters(model(ALL_HEADS, seed=0), ("encoder", "encoders"))
    with pytest.raises(UsageError, match="every parameter"):
        frozen_parameters(model(RETRIEVAL_ONLY, seed=0), [name.split(".")[0] for name, _ in
                                                          model(RETRIEVAL_ONLY, seed=0).named_parameters()])
