"""The registry of eval task kinds: it is exactly what the task loader accepts, and every kind's
scoring and baseline run on a tiny hand-made sequences table (Parquet + a Delta snapshot, no Spark)
with the numbers checked against a direct computation."""

from __future__ import annotations

import math
import typing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

from lumos.core.config import from_dict
from lumos.core.errors import ConfigError, UsageError
from lumos.core.tables import TableRef
from lumos.data.contract import FeatureSpec
from lumos.data.delta_snapshot import DataFile, DeltaSnapshot
from lumos.data.loader import table_batches
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.kinds import KINDS
from lumos.eval.score import has_baseline, score_baseline, score_model
from lumos.eval.tasks import LoadedTask, TaskSpec, load_tasks
from lumos.train.model import LumosModel, ModelConfig, signed_expm1

FEATURES = FeatureSpec(token_categorical={"item": 9, "hour": 24}, token_numeric=("value",), horizons_days=(7,), max_len=8)
TRAIN_ROWS, TEST_ROWS = 17, 31  # awkward sizes; 31 test users leave the probe enough on both sides


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SequencesVersion:
    """One sequences version: TRAIN_ROWS + TEST_ROWS users, one row each, histories of 1..8 tokens."""
    folder = tmp_path_factory.mktemp("sequences")
    rng = np.random.default_rng(3)
    rows = []
    for index in range(TRAIN_ROWS + TEST_ROWS):
        length = int(rng.integers(1, 9))
        rows.append({
            "user_id": f"u{index}", "split": "train" if index < TRAIN_ROWS else "test", "as_of": index,
            "item": rng.integers(2, 9, length).tolist(), "hour": rng.integers(0, 24, length).tolist(),
            "value": rng.random(length).round(2).tolist(), "next_item": int(rng.integers(2, 9)),
            "act_7d": int(rng.random() < 0.3), "value_7d": float(rng.integers(0, 50)),
        })
    path = folder / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    snapshot = DeltaSnapshot(str(folder), 0, (DataFile(str(path), path.stat().st_size),))
    return SequencesVersion(TableRef.parse("tiny.sequences@0"), snapshot, {}, FEATURES)


@pytest.fixture(scope="module")
def model() -> LumosModel:
    torch.manual_seed(0)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8)
    return LumosModel(config, FEATURES).eval()


def task(kind: str, tmp_path: Path, **fields) -> LoadedTask:
    primary = {"retrieval": "mrr", "binary": "log_loss", "regression": "mae", "embedding_probe": "accuracy",
               "user_label": "accuracy"}[kind]
    spec = from_dict(TaskSpec, {"name": f"tiny_{kind}", "kind": kind, "primary_metric": primary, "data": "tiny.sequences",
                                "batch_size": 5, **fields})
    return LoadedTask(spec, tmp_path / f"tiny_{kind}.toml")


def test_the_registry_is_what_the_task_loader_accepts(tmp_path):
    accepted = typing.get_args(typing.get_type_hints(TaskSpec)["kind"])
    assert tuple(KINDS) == accepted
    assert all(name == kind.name for name, kind in KINDS.items())
    (tmp_path / "broken.toml").write_text('name = "broken"\nkind = "ranking"\nprimary_metric = "mrr"\n')
    with pytest.raises(ConfigError) as error:
        load_tasks([tmp_path])
    assert f"{tmp_path / 'broken.toml'}: kind" in str(error.value) and "'retrieval'" in str(error.value)


def test_only_kinds_that_take_labels_accept_them(tmp_path):
    labels = {"path": "labels.csv", "label": "segment"}
    with pytest.raises(ConfigError, match="only embedding_probe, user_label tasks take labels, not binary"):
        task("binary", tmp_path, labels=labels)
    with pytest.raises(ConfigError, match="an embedding_probe task needs a \\[labels\\] table"):
        task("embedding_probe", tmp_path)


def test_every_kind_scores_a_model_and_its_baseline(data, model, tmp_path):
    labels = pa.table({"user_id": [f"u{i}" for i in range(TRAIN_ROWS + TEST_ROWS)],
                       "segment": ["a" if i % 3 else "b" for i in range(TRAIN_ROWS + TEST_ROWS)]})
    pacsv.write_csv(labels, tmp_path / "labels.csv")
    for name in KINDS:
        if KINDS[name].takes_window:
            continue  # its rows are cut at one date and its targets come from events: tests/unit/test_next_items.py
        extra = {"labels": {"path": "labels.csv", "label": "segment"}} if KINDS[name].takes_labels else {}
        loaded = task(name, tmp_path, **extra)
        scores = score_model(model, loaded, data)
        assert set(scores.metrics) == set(loaded.spec.metric_names), name
        assert all(math.isfinite(value) for value in scores.metrics.values()), name
        assert 0 < scores.rows <= TEST_ROWS, name
        if has_baseline(loaded):
            baseline, baseline_scores = score_baseline(loaded, data)
            assert set(baseline_scores.metrics) == set(loaded.spec.metric_names) and baseline_scores.rows == TEST_ROWS
        else:
            with pytest.raises(UsageError, match="no baseline"):
                score_baseline(loaded, data)


def test_baselines_match_a_hand_computation(data, tmp_path):
    table = pq.read_table(data.snapshot.files[0].path).to_pylist()
    train = [row for row in table if row["split"] == "train"]
    test = [row for row in table if row["split"] == "test"]

    mean = np.mean([row["value_7d"] for row in train])
    name, scores = score_baseline(task("regression", tmp_path), data)
    errors = np.array([row["value_7d"] for row in test]) - mean
    assert name == "train_mean"
    assert scores.metrics["mae"] == pytest.approx(np.abs(errors).mean())
    assert scores.metrics["rmse"] == pytest.approx(np.sqrt((errors ** 2).mean()))

    rate = np.mean([row["act_7d"] for row in train])
    assert 0 < rate < 0.5  # everyone is predicted negative at the 0.5 threshold
    name, scores = score_baseline(task("binary", tmp_path), data)
    acts = np.array([row["act_7d"] for row in test])
    assert name == "prior_rate"
    assert scores.metrics["log_loss"] == pytest.approx(-np.mean(acts * np.log(rate) + (1 - acts) * np.log(1 - rate)))
    assert scores.metrics["accuracy"] == pytest.approx(1 - acts.mean())

    # Popularity is the id order (id 2 first); history items leave the competition, the target stays.
    def rank(row) -> int:
        return 1 + sum(1 for item in range(2, row["next_item"]) if item not in row["item"])

    name, scores = score_baseline(task("retrieval", tmp_path), data)
    assert name == "popularity"
    assert scores.metrics["mrr"] == pytest.approx(np.mean([1 / rank(row) for row in test]))


def test_horizon_kinds_read_their_head_at_the_tasks_horizon(data, model, tmp_path):
    rows = pq.read_table(data.snapshot.files[0].path)
    rows = rows.filter(pc.equal(rows["split"], "test"))
    (batch,) = table_batches(rows, FEATURES, TEST_ROWS, "the test rows")
    with torch.no_grad():
        output = model(batch)
    values = signed_expm1(output.value_pred[:, 0]).numpy()
    probabilities = torch.sigmoid(output.act_logits[:, 0]).numpy().astype(np.float64)
    acts = batch.act[:, 0].numpy()

    regression = score_model(model, task("regression", tmp_path), data).metrics
    assert regression["mae"] == pytest.approx(np.abs(batch.value[:, 0].numpy() - values).mean(), rel=1e-5)
    binary = score_model(model, task("binary", tmp_path), data).metrics
    clipped = np.clip(probabilities, 1e-7, 1 - 1e-7)
    expected = -np.mean(acts * np.log(clipped) + (1 - acts) * np.log(1 - clipped))
    assert binary["log_loss"] == pytest.approx(expected, rel=1e-5)


def test_a_horizon_the_data_lacks_is_a_usage_error(data, model, tmp_path):
    with pytest.raises(UsageError, match="no 30-day horizon"):
        score_baseline(task("binary", tmp_path, horizon_days=30), data)
    with pytest.raises(UsageError, match="no 30-day horizon"):
        score_model(model, task("regression", tmp_path, horizon_days=30), data)


def test_user_label_bag_of_items_finds_a_label_the_histories_carry(data, model, tmp_path):
    """user_label's baseline reads the split rows' history items: a label that is "item 5 is in the
    history" is found (AUC near 1), and every entry reports each metric's spread over the folds."""
    test = [row for row in pq.read_table(data.snapshot.files[0].path).to_pylist() if row["split"] == "test"]
    labels = pa.table({"user_id": [row["user_id"] for row in test],
                       "has_5": ["yes" if 5 in row["item"] else "no" for row in test]})
    pq.write_table(labels, tmp_path / "labels.parquet")
    loaded = task("user_label", tmp_path, metrics=["auc_roc", "accuracy", "macro_f1"],
                  labels={"path": "labels.parquet", "label": "has_5", "folds": 3})
    name, scores = score_baseline(loaded, data)
    assert name == "bag_of_items" and scores.rows == TEST_ROWS
    assert scores.metrics["auc_roc"] > 0.9
    assert set(scores.spread) == set(scores.metrics) and all(value >= 0 for value in scores.spread.values())
    model_scores = score_model(model, loaded, data)
    assert set(model_scores.spread) == set(model_scores.metrics) == {"auc_roc", "accuracy", "macro_f1"}
