"""Fault injection on training, checkpoints and inference: poisoned data, signals, kills and races.

Real Spark, Delta, MLflow (SQLite) and real `lumos` processes; a precise kill point comes from the
LUMOS_FAULT_POINT test hook (lumos/core/faults.py), never from a mock.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, load_config, to_toml
from lumos.core.tables import TableRef, table_location
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.delta_log import commit_info
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES
from lumos.train.checkpoint import MODEL_FILE, load_model
from lumos.train.config import TrainConfig

pytestmark = pytest.mark.faults
runner = CliRunner()

TINY = {
    "data": {"table": "quickstart.sequences", "loader_workers": 0},
    "model": {"d_model": 8, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16,
              "dropout": 0.0, "max_len": 20},
    "run": {"batch_size": 32, "max_steps": 12, "eval_every": 1000, "log_every": 1,
            "checkpoint_every": 1, "seed": 0, "experiment": "test-faults"},
}


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory) -> Path:
    """A workspace holding a small quickstart ingest (histories of at most 20 tokens)."""
    folder = tmp_path_factory.mktemp("faults")
    generate_quickstart(folder / "data", SyntheticSpec(users=200, events=8_000, seed=3))
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={folder / 'data' / 'events'}", f"users.path={folder / 'data' / 'users.parquet'}",
        f"calendar.path={folder / 'data' / 'calendar.csv'}", "tokens.max_len=20",
    ])
    run_ingest(spark, open_workspace(folder), recipe, RECIPES)
    return folder


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_recipe(folder: Path, **run) -> Path:
    path = folder / "train.toml"
    path.write_text(to_toml(from_dict(TrainConfig, {**TINY, "run": {**TINY["run"], **run}})), encoding="utf-8")
    return path


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


# -- a NaN-poisoned batch -------------------------------------------------------------------------


def poison_sequences(spark, project: Path) -> str:
    """A new version of quickstart.sequences, written directly, with user_tenure_days NaN on the rows of
    about one user in fifty (what validation would reject at ingest); its commit keeps version 0's
    lineage, so training reads it as any other version."""
    from pyspark.sql import functions as F

    location = table_location(open_workspace(project), TableRef.parse("quickstart.sequences"))
    lineage = commit_info(location, 0)["userMetadata"]
    frame = spark.read.format("delta").option("versionAsOf", 0).load(location)
    poisoned = F.crc32(F.col("user_id")) % 50 == 0
    nan = F.lit(float("nan")).cast(frame.schema["user_tenure_days"].dataType)
    frame = frame.withColumn("user_tenure_days", F.when(poisoned, nan).otherwise(F.col("user_tenure_days")))
    frame.write.format("delta").mode("overwrite").option("userMetadata", lineage).save(location)
    return "quickstart.sequences@1"


def test_a_nan_poisoned_batch_fails_the_run_and_keeps_the_last_good_checkpoint(spark, project, tmp_path):
    data = poison_sequences(spark, project)
    result = lumos(project, "train", "--config", str(write_recipe(tmp_path)), "--data", data, "--json")
    assert result.exit_code == 1, result.output
    step = int(result.output.split("training stopped at step ")[1].split(":")[0])
    assert step > 1, "the seed should reach a poisoned row after at least one clean step"
    assert "not finite" in result.output

    workspace = open_workspace(project)
    client = tracking_client(workspace)
    run = next(run for run in client.search_runs([client.get_experiment_by_name("test-faults").experiment_id])
               if run.data.tags.get("lumos.data") == data)
    assert run.info.status == "FAILED"
    assert run.data.tags["lumos.checkpoint"] == f"checkpoints/step-{step - 1:08d}"
    losses = [metric.value for metric in client.get_metric_history(run.info.run_id, "train/retrieval")]
    assert len(losses) == step - 1 and all(math.isfinite(loss) for loss in losses)
    kept = Path(workspace.path("runs", run.info.run_id, "checkpoints", f"step-{step - 1:08d}"))
    load_model(kept)
    assert all(torch.isfinite(tensor).all() for tensor in load_file(str(kept / MODEL_FILE)).values())
    assert not (kept.parent / f"step-{step:08d}").exists()


@pytest.mark.parametrize(("key", "value"), [("optim.lr", "nan"), ("optim.lr", "0"), ("optim.weight_decay", "-inf"),
                                            ("optim.grad_clip", "inf"), ("data.loader_workers", "-1")])
def test_non_finite_or_negative_config_numbers_are_refused_with_their_key(project, tmp_path, key, value):
    result = lumos(project, "train", "--config", str(write_recipe(tmp_path)), "--set", f"{key}={value}")
    assert result.exit_code == 2, result.output
    assert key in result.output
