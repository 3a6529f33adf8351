"""`lumos train` on a real quickstart ingest, a real SQLite MLflow store and real gloo ranks."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import mlflow
import pytest
import torch
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, load_config
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.synthetic import SyntheticSpec
from lumos.quickstart import RECIPES
from lumos.train.checkpoint import load_model
from lumos.train.config import TrainConfig
from lumos.train.memory import find_batch_size, synthetic_batch
from lumos.train.model import LumosModel
from lumos.train.run import train

QUICKSTART = RECIPES
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {
    "data": {"table": "quickstart.sequences", "loader_workers": 1},
    "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32,
              "dropout": 0.0, "max_len": 20},
    "optim": {"lr": 3e-3, "warmup_steps": 5},
    "run": {"batch_size": 32, "max_steps": 20, "eval_every": 10, "eval_batches": 4, "log_every": 1,
            "checkpoint_every": 10, "seed": 0, "experiment": "test-train"},
}


def tiny_config(**run) -> TrainConfig:
    return from_dict(TrainConfig, {**TINY, "run": {**TINY["run"], **run}})


@pytest.fixture(scope="module")
def project(ingest_quickstart, tmp_path_factory) -> Path:
    """A workspace holding a small quickstart ingest (histories of at most 20 tokens)."""
    folder = tmp_path_factory.mktemp("train")
    ingest_quickstart(folder, SyntheticSpec(users=300, events=15_000, seed=1), max_len=20)
    return folder


def metric_history(workspace, run_id: str, key: str) -> list[float]:
    client = tracking_client(workspace)
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_training_logs_a_complete_run_and_the_model_rebuilds_from_it(project):
    workspace = open_workspace(project)
    summary = train(tiny_config(max_steps=40), workspace)
    run = tracking_client(workspace).get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["lumos.data"] == "quickstart.sequences@0" and tags["lumos.data.version"] == "0"
    assert tags["lumos.config_hash"].startswith("sha256:") and tags["lumos.recipe_hash"].startswith("sha256:")
    assert tags["lumos.seed"] == "0" and tags["lumos.checkpoint"] == "checkpoints/step-00000040"
    assert run.data.params["model.d_model"] == "16" and run.data.params["batch_size.resolved"] == "32"

    valid = metric_history(workspace, summary.run_id, "valid/loss")
    assert len(valid) == 4 and valid[-1] < valid[0]
    for key in ("train/retrieval", "lr", "samples_per_second", "data_wait_fraction", "peak_memory_mb"):
        assert metric_history(workspace, summary.run_id, key)

    folder = Path(mlflow.artifacts.download_artifacts(run_id=summary.run_id, artifact_path="checkpoints/step-00000040",
                                                      tracking_uri=workspace.mlflow_tracking_uri))
    lineage = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=summary.run_id, artifact_path="lineage.json",
                                                                  tracking_uri=workspace.mlflow_tracking_uri)).read_text())
    assert lineage["stage"] == "train" and lineage["inputs"][0]["version"] == 0 and lineage["seed"] == 0
    model, config = load_model(folder)
    assert config.run.max_steps == 40 and isinstance(model, LumosModel)
    assert not any(path.suffix in {".pkl", ".pickle"} for path in folder.iterdir())


def test_same_config_data_and_seed_give_identical_losses(project):
    workspace = open_workspace(project)
    first = train(tiny_config(max_steps=8, eval_every=100), workspace).result
    second = train(tiny_config(max_steps=8, eval_every=100), workspace).result
    assert [h["loss"] for h in first.history] == [h["loss"] for h in second.history]


def test_interrupted_run_resumes_exactly(project):
    workspace = open_workspace(project)
    config = tiny_config(max_steps=16, checkpoint_every=100, eval_every=100)
    uninterrupted = train(config, workspace).result

    import lumos.train.run as run_module

    original = run_module._rank0_hooks

    def interrupting_hooks(plan, report):
        hooks = original(plan, report)
        log_metrics = hooks["log_metrics"]

        def log_and_interrupt(step, metrics):
            log_metrics(step, metrics)
            if step == 7:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would

        return {**hooks, "log_metrics": log_and_interrupt}

    run_module._rank0_hooks = interrupting_hooks
    try:
        interrupted = train(config, workspace)
    finally:
        run_module._rank0_hooks = original
    assert interrupted.result.interrupted and interrupted.result.step == 7
    assert tracking_client(workspace).get_run(interrupted.run_id).info.status == "KILLED"

    resumed = train(config, workspace, resume_run_id=interrupted.run_id)
    assert resumed.run_id == interrupted.run_id and resumed.result.step == 16
    assert resumed.result.history == uninterrupted.history[7:]
    losses = metric_history(workspace, interrupted.run_id, "train/retrieval")
    assert losses == metric_history(workspace, train(config, workspace).run_id, "train/retrieval")


@pytest.mark.parametrize("by_length", [False, True])
def test_two_ranks_match_one_rank_with_the_same_global_batch(project, by_length):
    workspace = open_workspace(project)
    config = tiny_config(max_steps=6, eval_every=100)
    config = replace(config, data=replace(config.data, bucket_by_length=by_length))
    one = train(config, workspace).result
    two = train(config, workspace, nproc=2).result
    assert len(two.history) == len(one.history) == 6
    for single, double in zip(one.history, two.history, strict=True):
        assert double["loss"] == pytest.approx(single["loss"], rel=2e-3)


def test_batch_size_finder_picks_the_largest_under_the_budget(project):
    workspace = open_workspace(project)
    from lumos.core.tables import TableRef
    from lumos.data.sequences_version import open_sequences

    spec = open_sequences(workspace, TableRef.parse("quickstart.sequences")).spec
    model = LumosModel(tiny_config().model, spec)
    unlimited = find_batch_size(model, torch.device("cpu"), max_batch_size=64, memory_budget_bytes=2**40)
    assert unlimited.batch_size == 64 and unlimited.limit == "max_batch_size 64"
    assert [size for size, _, _ in unlimited.tried] == [1, 2, 4, 8, 16, 32, 64]
    nothing_fits = find_batch_size(model, torch.device("cpu"), max_batch_size=64, memory_budget_bytes=1)
    assert nothing_fits.batch_size == 1 and nothing_fits.limit.startswith("memory budget")
    assert nothing_fits.tried == [(1, nothing_fits.tried[0][1], False)]
    # Peak resident memory is measured, so where a middle budget cuts depends on the machine;
    # what must hold is that the choice is the largest size that fitted, and the first miss is over.
    bounded = find_batch_size(model, torch.device("cpu"), max_batch_size=64, memory_budget_bytes=8 * 2**20)
    fitted = [size for size, _, ok in bounded.tried if ok]
    assert bounded.batch_size == max(fitted, default=1)
    assert all(peak <= 8 * 2**20 for _, peak, ok in bounded.tried if ok)
    if bounded.limit.startswith("memory budget"):
        assert not bounded.tried[-1][2] and bounded.tried[-1][1] > 8 * 2**20
    assert synthetic_batch(spec, 3, 17).mask.shape == (3, 17)


def test_dry_run_estimates_without_training(project):
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(QUICKSTART / "train.toml"),
                                "--set", "model.max_len=20", "--set", "run.batch_size=auto", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["dry_run"] is True and summary["run_id"] is None and summary["batch_size"] >= 1
    assert any("attention" in key and size > 0 for key, size in summary["memory_estimate_bytes"].items())


def test_bad_train_config_names_every_problem(project, tmp_path):
    bad = (QUICKSTART / "train.toml").read_text().replace("d_model = 64", "d_model = 30").replace(
        'heads = ["retrieval", "binary", "regression"]', 'heads = ["retrieval", "ranking"]').replace("lr = 2e-3", "lr = -1.0")
    (tmp_path / "train.toml").write_text(bad + "\n[extra]\n")
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(tmp_path / "train.toml")])
    assert result.exit_code == 2
    for expected in ("model.d_model", "model.heads", "optim.lr", "extra: unknown key"):
        assert expected in result.stderr, result.stderr


def test_quickstart_train_recipe_loads():
    config = load_config(TrainConfig, QUICKSTART / "train.toml")
    assert replace(config.run, batch_size=128) == config.run
