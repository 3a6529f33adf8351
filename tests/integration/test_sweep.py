"""`lumos sweep` on a real ingest and SQLite MLflow: a 2×2×2 sweep of tiny runs, nested under one
parent, resumed without retraining, the best point scored over its seeds, and the leaderboard
grouped by config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.quickstart import RECIPES

runner = CliRunner()
TRAIN_TOML = """
[data]
loader_workers = 1

[model]
d_model = 8
n_heads = 2
encoder_layers = 1
decoder_layers = 1
d_ff = 16
max_len = 12

[run]
batch_size = 32
max_steps = 3
eval_every = 3
eval_batches = 2
log_every = 3
checkpoint_every = 3
experiment = "test-sweep"
"""
SWEEP = ["sweep", "--config", "train.toml", "--grid", "optim.lr=1e-3,5e-3", "--grid", "model.dropout=0.0,0.2",
         "--seeds", "0", "1", "--json"]


@pytest.fixture(scope="module")
def project(trained_quickstart, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "tasks").mkdir()
    shutil.copy(RECIPES / "tasks" / "will_purchase_7d.toml", folder / "tasks")
    trained_quickstart(folder, seed=6, max_len=12, steps=1, experiment="test-sweep-ingest")
    (folder / "train.toml").write_text(TRAIN_TOML)
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def test_sweep_nests_resumes_and_groups_by_config(project, monkeypatch):
    monkeypatch.chdir(project)  # --config train.toml is relative, as a user would type it
    result = lumos(project, *SWEEP)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["trained"], summary["skipped"], summary["failed"]) == (8, 0, [])
    assert summary["metric"] == "valid/loss" and summary["direction"] == "min"
    points = summary["points"]
    assert len(points) == 4 and all(len(point["values"]) == 2 for point in points)
    means = [point["mean"] for point in points]
    assert means == sorted(means)  # best (lowest valid loss) first
    first = points[0]
    assert first["std"] == pytest.approx(abs(first["values"]["0"] - first["values"]["1"]) / 2**0.5)

    client = tracking_client(open_workspace(project))
    children = {run_id for point in points for run_id in point["runs"].values()}
    assert len(children) == 8
    for run_id in children:
        assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == summary["parent_run_id"]
    for point in points:  # each child trained its point's config, and the point's values are its last valid loss
        for run_id in point["runs"].values():
            params = client.get_run(run_id).data.params
            assert {key: float(params[key]) for key in ("optim.lr", "model.dropout")} == \
                {key: float(value) for key, value in (item.split("=") for item in point["point"])}
        assert point["values"] == {seed: pytest.approx(last_logged(client, run_id, "valid/loss"))
                                   for seed, run_id in point["runs"].items()}
        assert point["mean"] == pytest.approx(np.mean(list(point["values"].values())))
        assert point["std"] == pytest.approx(np.std(list(point["values"].values()), ddof=1))

    # Resume: the same command finds its parent and keeps every finished child.
    again = lumos(project, *SWEEP, "--eval")
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.stdout)
    assert resumed["parent_run_id"] == summary["parent_run_id"]
    assert (resumed["trained"], resumed["skipped"]) == (0, 8)
    assert [point["mean"] for point in resumed["points"]] == means
    # --eval scored the best point's seeds: one leaderboard entry each, whose AUC its training run
    # carries (the leaderboard shows the public side's; the sweep summarizes the whole split's).
    best_runs = set(resumed["points"][0]["runs"].values())
    entries = json.loads(lumos(project, "eval", "leaderboard", "--task", "will_purchase_7d", "--json").stdout)["entries"]
    per_seed = {entry["run_id"]: entry["metrics"]["auc_roc"] for entry in entries if entry["run_id"]}
    assert set(per_seed) == best_runs
    whole = {}
    for run_id, value in per_seed.items():
        logged = client.get_run(run_id).data.metrics
        assert logged["eval/will_purchase_7d/public/auc_roc"] == pytest.approx(value)
        whole[run_id] = logged["eval/will_purchase_7d/auc_roc"]
    auc = resumed["evaluation"]["will_purchase_7d"]["auc_roc"]
    assert auc["mean"] == pytest.approx(np.mean(list(whole.values())))
    assert auc["std"] == pytest.approx(np.std(list(whole.values()), ddof=1))

    board = json.loads(lumos(project, "eval", "leaderboard", "--task", "will_purchase_7d", "--group-by", "config",
                             "--json").stdout)
    assert len(board["groups"]) == 2  # the best point's config and the baseline
    best = [group for group in board["groups"] if set(group["runs"]) == best_runs]
    assert len(best) == 1 and best[0]["n"] == 2
    assert best[0]["metrics"]["auc_roc"]["mean"] == pytest.approx(np.mean(list(per_seed.values())))
    assert best[0]["metrics"]["auc_roc"]["std"] == pytest.approx(np.std(list(per_seed.values()), ddof=1))
    assert {group["label"] for group in board["groups"]} >= {"baseline: prior_rate"}


def last_logged(client, run_id: str, key: str) -> float:
    """The value of `key` at the run's last logged step."""
    return max(client.get_metric_history(run_id, key), key=lambda metric: (metric.step, metric.timestamp)).value


def test_parallel_children_train_in_their_own_processes(project, monkeypatch):
    monkeypatch.chdir(project)
    result = lumos(project, "sweep", "--config", "train.toml", "--grid", "optim.lr=3e-3", "--seeds", "7,8",
                   "--parallel", "2", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["trained"], summary["failed"]) == (2, [])
    client = tracking_client(open_workspace(project))
    runs = summary["points"][0]["runs"]
    assert {client.get_run(run_id).data.tags["lumos.seed"] for run_id in runs.values()} == {"7", "8"}
    assert all(client.get_run(run_id).info.status == "FINISHED" for run_id in runs.values())
