"""examples/movielens/transfer.py: the fine-tuned entry starts from every pretrained tensor, the
scratch entry from none, both with the same new head; the table prints mean ± std."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from lumos.data.contract import FeatureSpec
from lumos.train.model import LumosModel, ModelConfig

MOVIELENS = Path(__file__).resolve().parents[2] / "examples" / "movielens"
spec = importlib.util.spec_from_file_location("movielens_transfer", MOVIELENS / "transfer.py")
transfer = importlib.util.module_from_spec(spec)
sys.modules["movielens_transfer"] = transfer
spec.loader.exec_module(transfer)


def pretrained() -> LumosModel:
    torch.manual_seed(7)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8,
                         heads=("retrieval",))
    return LumosModel(config, FeatureSpec(token_categorical={"item": 9}, token_numeric=(), max_len=8))


def test_fine_tuned_starts_from_every_pretrained_tensor_and_scratch_from_none():
    parent = pretrained()
    fine = transfer.start_model(parent, width=3, seed=0, fine_tune=True)
    scratch = transfer.start_model(parent, width=3, seed=0, fine_tune=False)
    for name, tensor in parent.state_dict().items():
        assert torch.equal(fine.encoder.state_dict()[name], tensor), name
    differing = [name for name, tensor in parent.state_dict().items()
                 if tensor.is_floating_point() and tensor.numel() > 1 and not torch.equal(scratch.encoder.state_dict()[name], tensor)]
    assert differing  # a fresh seeded start, not the pretrained weights
    assert torch.equal(fine.head.weight, scratch.head.weight) and fine.head.weight.shape == (3, 8)


def test_the_table_prints_every_entry_as_mean_and_std():
    entries = {entry: {"auc_roc": 0.5 + i / 10, "auc_roc_std": 0.01} for i, entry in enumerate(transfer.ENTRIES)}
    text = transfer.markdown({"movielens_gender": {"metrics": ["auc_roc"], "entries": entries}})
    assert text.splitlines()[-1] == "| gender | auc_roc | 0.500 ± 0.010 | 0.600 ± 0.010 | 0.700 ± 0.010 | 0.800 ± 0.010 |"
