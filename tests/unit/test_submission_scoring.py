"""Submissions are scored by the kinds' own metric code: a model's predictions, written as a
submission, score exactly its model entry; row order never matters; every broken rule is named.
A tiny hand-made sequences table (Parquet + a Delta snapshot, no Spark), as in test_task_kinds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lumos.core.config import from_dict
from lumos.core.tables import TableRef
from lumos.data.contract import FeatureSpec
from lumos.data.delta_snapshot import DataFile, DeltaSnapshot
from lumos.data.loader import table_batches
from lumos.data.sequences_version import SequencesVersion
from lumos.data.user_share import public_hash
from lumos.eval.kinds import KINDS
from lumos.eval.score import score_model
from lumos.eval.sides import user_sides
from lumos.eval.submission import SubmissionError, checked_predictions, score_side, task_users
from lumos.eval.tasks import LoadedTask, TaskSpec
from lumos.train.model import LumosModel, ModelConfig, signed_expm1

FEATURES = FeatureSpec(token_categorical={"item": 13, "hour": 24}, token_numeric=("value",), horizons_days=(7,), max_len=8)
TEST_ROWS = 37
SUBMITTED = [name for name, kind in KINDS.items() if kind.prediction]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SequencesVersion:
    folder = tmp_path_factory.mktemp("sequences")
    rng = np.random.default_rng(5)
    rows = []
    for index in range(TEST_ROWS):
        length = int(rng.integers(1, 9))
        rows.append({
            "user_id": f"u{index:02d}", "split": "test", "as_of": index,
            "item": rng.integers(2, 13, length).tolist(), "hour": rng.integers(0, 24, length).tolist(),
            "value": rng.random(length).round(2).tolist(), "next_item": int(rng.integers(2, 13)),
            "act_7d": int(rng.random() < 0.4), "value_7d": float(rng.integers(0, 50)),
        })
    path = folder / "part-0.parquet"
    pq.write_table(pa.Table.from_pylist(rows[::-1]), path)  # not in user order: the scorer sorts
    snapshot = DeltaSnapshot(str(folder), 0, (DataFile(str(path), path.stat().st_size),))
    return SequencesVersion(TableRef.parse("tiny.sequences@0"), snapshot, {}, FEATURES)


@pytest.fixture(scope="module")
def model() -> LumosModel:
    torch.manual_seed(0)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8)
    return LumosModel(config, FEATURES).eval()


def task(kind: str, **fields) -> LoadedTask:
    primary = {"retrieval": "mrr", "binary": "log_loss", "regression": "mae"}[kind]
    spec = from_dict(TaskSpec, {"name": f"tiny_{kind}", "kind": kind, "primary_metric": primary, "data": "tiny.sequences",
                                "ks": [3, 5], "batch_size": 1, **fields})
    return LoadedTask(spec, Path(f"tiny_{kind}.toml"))


def model_submission(model: LumosModel, kind: str, rows: pa.Table) -> pa.Table:
    """What a team would submit from this model: its probability, value, or full item ranking."""
    values = []
    with torch.no_grad():
        # One row a batch, as the task scores it: padding to a longer neighbour moves float32 outputs.
        for batch in table_batches(rows, FEATURES, 1, "test"):
            output = model(batch)
            if kind == "binary":
                values += torch.sigmoid(output.act_logits[:, 0]).tolist()
            elif kind == "regression":
                values += signed_expm1(output.value_pred[:, 0]).tolist()
            else:
                ranked = torch.argsort(model.score_items(batch, output), dim=1, descending=True, stable=True)
                values += [[item for item in row if item >= 2] for row in ranked.tolist()]
    return pa.table({"user_id": rows["user_id"], KINDS[kind].prediction.column: values})


def submitted_scores(loaded: LoadedTask, data: SequencesVersion, table: pa.Table):
    prediction = KINDS[loaded.spec.kind].prediction
    rows = task_users(loaded.spec, data)
    column = checked_predictions(loaded.spec, data, prediction, rows, table, Path("predictions.parquet"))
    return prediction.score(loaded.spec, data, rows, column)


@pytest.mark.parametrize("kind", SUBMITTED)
def test_a_models_own_predictions_score_its_model_entry_in_any_row_order(data, model, kind):
    loaded = task(kind)
    rows = task_users(loaded.spec, data)
    table = model_submission(model, kind, rows)
    expected = score_model(model, loaded, data)
    submitted = submitted_scores(loaded, data, table)
    assert submitted.rows == expected.rows
    assert submitted.metrics == pytest.approx(expected.metrics, rel=1e-12, abs=1e-12)
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(table.num_rows)))
    assert submitted_scores(loaded, data, shuffled).metrics == submitted.metrics  # bit for bit


def test_history_items_are_dropped_before_ranking_and_a_missed_target_scores_zero(data):
    loaded = task("retrieval")
    rows = task_users(loaded.spec, data)
    targets, histories = rows["next_item"].to_pylist(), rows["item"].to_pylist()
    first = [item for item in dict.fromkeys(histories[0]) if item != targets[0]]
    lists = [[*first, targets[0], *[item for item in range(2, 13) if item != targets[0] and item not in first]]]
    lists += [[item for item in range(2, 13) if item != target] for target in targets[1:]]  # every other row misses
    scores = submitted_scores(loaded, data, pa.table({"user_id": rows["user_id"], "top_items": lists}))
    assert scores.metrics["mrr"] == pytest.approx(1 / rows.num_rows)  # row 0 ranks first once its history is dropped
    assert scores.metrics["hr@3"] == pytest.approx(1 / rows.num_rows)


@pytest.mark.parametrize(("kind", "change", "rule"), [
    ("binary", lambda t: t.slice(1), "missing user: 1 user"),
    ("binary", lambda t: pa.concat_tables([t, t.slice(3, 1)]), "duplicate user: 1 row\\(s\\): 38 \\(user u03\\)"),
    ("binary", lambda t: t.set_column(1, "probability", pa.array([float("nan")] + [0.5] * (t.num_rows - 1))),
     "probability must be a finite number"),
    ("binary", lambda t: t.set_column(1, "probability", pa.array([0.5] * (t.num_rows - 1) + [float("inf")])),
     "finite number .*: 1 row\\(s\\): 37 \\(user u36\\)"),
    ("binary", lambda t: t.set_column(1, "probability", pa.array(["0.5"] * t.num_rows)), "wrong type: probability is string"),
    ("binary", lambda t: t.set_column(1, "probability", pa.array([1.5] * t.num_rows)), "must lie in \\[0, 1\\]"),
    ("regression", lambda t: t.set_column(1, "value", pa.array([None] + [1.0] * (t.num_rows - 1), pa.float64())),
     "value must be a finite number"),
    ("retrieval", lambda t: t.set_column(1, "top_items", pa.array([[2, 3, 4, 5]] * t.num_rows)), "at least 5 items"),
    ("retrieval", lambda t: t.set_column(1, "top_items", pa.array([[2, 3, 4, 5, 99]] * t.num_rows)), "unknown item id"),
    ("retrieval", lambda t: t.set_column(1, "top_items", pa.array([[2, 3, 4, 5, 5]] * t.num_rows)), "more than once"),
    ("retrieval", lambda t: t.drop_columns(["top_items"]), "missing column top_items"),
])
def test_each_broken_rule_is_named_with_its_first_rows(data, kind, change, rule):
    loaded = task(kind)
    prediction = KINDS[kind].prediction
    rows = task_users(loaded.spec, data)
    good = [[2, 3, 4, 5, 6]] * rows.num_rows if kind == "retrieval" else [0.5] * rows.num_rows
    table = change(pa.table({"user_id": rows["user_id"], prediction.column: good}))
    with pytest.raises(SubmissionError, match=rule):
        checked_predictions(loaded.spec, data, prediction, rows, table, Path("p.parquet"))


def test_a_file_in_a_git_checkout_records_its_commit(tmp_path):
    import subprocess

    from lumos.eval.submission import checkout_commit

    outside = tmp_path / "outside" / "p.parquet"
    outside.parent.mkdir()
    outside.write_bytes(b"x")
    assert checkout_commit(outside) is None
    repo = tmp_path / "team"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "model"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "p.parquet").write_bytes(b"x")
    assert checkout_commit(repo / "p.parquet") == head


def test_the_public_and_private_sides_split_the_users_once_and_for_all(data):
    spec = task("binary").spec
    public, private = user_sides(spec)
    users = task_users(spec, data)["user_id"]
    on_public, on_private = public.holds(users), private.holds(users)
    assert (on_public ^ on_private).all()  # every user on exactly one side
    assert 0 < on_public.sum() < len(users)
    assert (public.holds(users) == on_public).all()  # the same side every time
    # A user's side depends on its own id only: the first ten users keep theirs among fewer users.
    assert (public.holds(users[:10]) == on_public[:10]).all()
    reseeded, _ = user_sides(task("binary", public_seed=1).spec)
    assert (reseeded.holds(users) != on_public).any()
    assert user_sides(task("binary", public_fraction=1.0).spec) == ()


@pytest.mark.parametrize("kind", SUBMITTED)
def test_a_model_and_its_submission_score_the_same_on_each_side(data, model, kind):
    """The model's side is read by the loader (rows skipped by user), the submission's by filtering
    its rows: both must score the same users the same way, and the sides' rows add up."""
    loaded = task(kind)
    rows = task_users(loaded.spec, data)
    prediction = KINDS[kind].prediction
    column = checked_predictions(loaded.spec, data, prediction, rows, model_submission(model, kind, rows),
                                 Path("predictions.parquet"))
    scored = 0
    for share in user_sides(loaded.spec):
        by_model = score_model(model, loaded, data.side(share))
        by_file = score_side(loaded.spec, data, prediction, rows, column, share)
        assert by_file.rows == by_model.rows
        assert by_file.metrics == pytest.approx(by_model.metrics, rel=1e-12, abs=1e-12)
        scored += by_model.rows
    assert scored == score_model(model, loaded, data).rows


def test_a_users_side_is_the_same_in_every_process_and_on_every_machine():
    """blake2b of the seed and id, never Python's hash() (salted per process): pinned values, and a
    fresh interpreter with another hash seed agrees."""
    assert [round(public_hash(0, user), 12) for user in ("u00", "u01", "42")] == [0.494515050174, 0.188191209424,
                                                                                    0.353478847799]
    code = "from lumos.data.user_share import public_hash; print([public_hash(0, u) for u in ('u00', 'u01', '42')])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == str([public_hash(0, user) for user in ("u00", "u01", "42")])
