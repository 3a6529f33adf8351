"""Fault injection on training, checkpoints and inference: poisoned data, signals, kills and races.

Real Spark, Delta, MLflow (SQLite) and real `lumos` processes; a precise kill point comes from the
LUMOS_FAULT_POINT test hook (lumos/core/faults.py), never from a mock.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, load_config, to_toml
from lumos.core.tables import TableRef, open_delta_table, table_location
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.predictions import RunInProgress, partition_lock
from lumos.data.synthetic import SyntheticSpec
from lumos.quickstart import RECIPES
from lumos.train.checkpoint import MODEL_FILE, load_model, load_training_state
from lumos.train.config import TrainConfig
from lumos.train.run import train

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("one_thread")]
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

TINY = {
    "data": {"table": "quickstart.sequences@0", "loader_workers": 0},  # @1 is the poisoned version
    "model": {"d_model": 8, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16,
              "dropout": 0.0, "max_len": 20},
    "run": {"batch_size": 32, "max_steps": 12, "eval_every": 1000, "log_every": 1,
            "checkpoint_every": 1, "seed": 0, "experiment": "test-faults"},
}


@pytest.fixture(scope="module")
def project(ingest_quickstart, tmp_path_factory) -> Path:
    """A workspace holding a small quickstart ingest (histories of at most 20 tokens)."""
    folder = tmp_path_factory.mktemp("faults")
    ingest_quickstart(folder, SyntheticSpec(users=200, events=8_000, seed=3), max_len=20)
    return folder


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
    (lineage,) = [commit["userMetadata"] for commit in open_delta_table(location).history() if commit["version"] == 0]
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


# -- SIGTERM during training, and resuming with the best tracker ------------------------------------


def lumos_process(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A real `lumos` process (signals and kills need one), on this checkout."""
    return subprocess.Popen([sys.executable, "-m", "lumos", "--workspace", str(project), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_sigterm_during_training_checkpoints_and_ends_the_run_killed(project, tmp_path):
    process = lumos_process(project, "train", "--config", str(write_recipe(tmp_path, max_steps=100_000,
                                                                            checkpoint_every=100_000)), "--json")
    for line in process.stderr:  # wait until it trains, then stop it as a scheduler would
        if "step 3/" in line:
            process.send_signal(signal.SIGTERM)
            break
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    summary = json.loads(stdout)
    assert summary["interrupted"] and 3 <= summary["step"] < 100_000
    workspace = open_workspace(project)
    run = tracking_client(workspace).get_run(summary["run_id"])
    assert run.info.status == "KILLED"
    assert run.data.tags["lumos.checkpoint"] == f"checkpoints/step-{summary['step']:08d}"
    model, config = load_model(Path(workspace.path("runs", summary["run_id"], "checkpoints", f"step-{summary['step']:08d}")))
    assert config.run.max_steps == 100_000


def test_resume_keeps_the_best_evaluation_and_the_patience_used(project, monkeypatch):
    workspace = open_workspace(project)
    # A learning rate too small to change the ranking: the first evaluation stays the best (as in
    # test_movielens), so the run stops after `patience` evaluations without a new best.
    config = from_dict(TrainConfig, {**TINY, "optim": {"lr": 1e-12},
                                     "run": {**TINY["run"], "max_steps": 60, "eval_every": 2, "eval_batches": 2,
                                             "checkpoint_every": 1000, "valid_metric": "mrr", "patience": 3}})
    whole = train(config, workspace).result
    assert whole.early_stopped and (whole.best_step, whole.step) == (2, 8)
    monkeypatch.setenv("LUMOS_FAULT_POINT", f"train.step.{whole.best_step + 2}:SIGTERM")  # a best, then one miss
    stopped = train(config, workspace)
    assert stopped.result.interrupted and stopped.result.step == whole.best_step + 2
    monkeypatch.delenv("LUMOS_FAULT_POINT")
    resumed = train(config, workspace, resume_run_id=stopped.run_id).result
    assert (resumed.step, resumed.best_step, resumed.best_value) == (whole.step, whole.best_step, whole.best_value)
    assert resumed.early_stopped


# -- SIGKILL during a checkpoint replace ----------------------------------------------------------


def test_sigkill_during_a_checkpoint_replace_leaves_a_loadable_best(project, tmp_path):
    recipe = write_recipe(tmp_path, max_steps=200, eval_every=1, eval_batches=1, checkpoint_every=1000,
                          valid_metric="mrr", experiment="test-faults-replace")
    process = lumos_process(project, "train", "--config", str(recipe), env={"LUMOS_FAULT_POINT": "checkpoint.replace"})
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == -signal.SIGKILL, stderr  # killed with the new best written, not yet in place
    best_steps = [int(line.split("step ")[1].split(":")[0]) for line in stderr.splitlines() if "new best valid" in line]
    assert best_steps, "a best is reported once its checkpoint is in place; the kill came at the next one"

    workspace = open_workspace(project)
    client = tracking_client(workspace)
    run = client.search_runs([client.get_experiment_by_name("test-faults-replace").experiment_id])[0]
    folder = Path(workspace.path("runs", run.info.run_id, "checkpoints", "best"))
    load_model(folder)
    assert load_training_state(folder).step == best_steps[-1]  # the previous best, whole
    # The tag names an upload of its own that the replace never touched.
    assert run.data.tags["lumos.checkpoint"] == f"checkpoints/best-step-{best_steps[-1]:08d}"
    load_model(Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=run.data.tags["lumos.checkpoint"],
                                                        dst_path=str(tmp_path / "download"),
                                                        tracking_uri=workspace.mlflow_tracking_uri)))


# -- the infer date lock --------------------------------------------------------------------------

DAY = datetime.date(2026, 9, 14)
PREDICTIONS = TableRef.parse("quickstart.predictions")


def lock_file(workspace) -> Path:
    return Path(workspace.root) / "locks" / PREDICTIONS.name / f"{DAY.isoformat()}.lock"


def leave_lock(workspace, age: float = 0.0, **holder) -> Path:
    """A lock as a crashed or foreign holder leaves it, last written `age` seconds ago."""
    path = lock_file(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder) if holder else "")
    written = path.stat().st_mtime - age
    os.utime(path, (written, written))
    return path


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("left", ["empty", "own pid, not ours", "dead pid", "other host, lease over"])
def test_a_stale_lock_is_taken_over(tmp_path, left):
    workspace = open_workspace(tmp_path)
    holder = {
        "empty": {},
        "own pid, not ours": {"pid": os.getpid(), "host": socket.gethostname(), "token": "a restarted container"},
        "dead pid": {"pid": dead_pid(), "host": socket.gethostname(), "token": "x"},
        "other host, lease over": {"pid": 1, "host": "elsewhere", "token": "x", "lease_seconds": 60},
    }[left]
    leave_lock(workspace, age=61 if left == "other host, lease over" else 0, **holder)
    with partition_lock(workspace, PREDICTIONS, DAY) as path:
        assert json.loads(path.read_text())["token"] != holder.get("token")
    assert not path.exists()


def test_a_live_lock_is_kept_and_its_lease_renewed(tmp_path):
    workspace = open_workspace(tmp_path)
    leave_lock(workspace, pid=1, host="elsewhere", token="x", lease_seconds=60)
    with pytest.raises(RunInProgress, match="pid 1 on elsewhere"):
        with partition_lock(workspace, PREDICTIONS, DAY):
            pass
    lock_file(workspace).unlink()
    with partition_lock(workspace, PREDICTIONS, DAY, lease_seconds=0.6) as path:
        first = path.stat().st_mtime_ns
        deadline = time.monotonic() + 30  # renewed every 0.2 s: a loaded machine may delay a few
        while path.stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.stat().st_mtime_ns > first
        assert json.loads(path.read_text())["token"] not in ("", "x")
        with pytest.raises(RunInProgress):  # this process's own lock is live
            with partition_lock(workspace, PREDICTIONS, DAY):
                pass


@pytest.mark.parametrize(("clock", "age", "stale"), [
    ("an hour behind ours, renewed just now", 0, False),
    ("an hour ahead of ours, silent for 61 s", 61, True),
])
def test_a_foreign_lease_is_judged_on_the_file_systems_clock_not_the_holders(tmp_path, clock, age, stale):
    """A holder on another host whose clock disagrees with ours: what it writes of its own clock
    (started_at, and the expires_at locks once held) is never compared with ours; the lock file's
    last write time against the shared file system's now decides."""
    workspace = open_workspace(tmp_path)
    skew = -3600 if "behind" in clock else 3600
    holder_now = time.time() + skew
    leave_lock(workspace, age=age, pid=1, host="elsewhere", token="x", lease_seconds=60,
               started_at=datetime.datetime.fromtimestamp(holder_now, datetime.UTC).isoformat(),
               expires_at=holder_now + 60)
    if stale:
        with partition_lock(workspace, PREDICTIONS, DAY) as path:
            assert json.loads(path.read_text())["token"] != "x"
    else:
        with pytest.raises(RunInProgress, match="pid 1 on elsewhere"):
            with partition_lock(workspace, PREDICTIONS, DAY):
                pass
        assert json.loads(lock_file(workspace).read_text())["token"] == "x"


CONTENDER = """
import datetime, sys, time
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.predictions import RunInProgress, partition_lock
workspace = open_workspace(sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    with partition_lock(workspace, TableRef.parse("quickstart.predictions"), datetime.date(2026, 9, 14)):
        print("held", flush=True)
        time.sleep(3)
except RunInProgress:
    print("refused")
"""


def test_processes_that_all_judge_a_lock_stale_cannot_all_hold_it(tmp_path):
    workspace = open_workspace(tmp_path)
    leave_lock(workspace, pid=dead_pid(), host=socket.gethostname(), token="x")
    start = time.time() + 8  # after every contender has imported lumos
    contenders = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(tmp_path), str(start)], stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(REPO)}) for _ in range(6)]
    outcomes = sorted(process.communicate(timeout=120)[0].strip() for process in contenders)
    assert outcomes == ["held"] + ["refused"] * 5


# -- inference: skew, kills, races, temp files -----------------------------------------------------

TEST_CUTOFF = "2026-09-14"  # the quickstart's test split as_of


@pytest.fixture(scope="module")
def promoted(trained_quickstart, tmp_path_factory) -> Path:
    """Quickstart data, one ingest, one trained run promoted to quickstart@production."""
    folder = tmp_path_factory.mktemp("faults-infer")
    run = trained_quickstart(folder, seed=7, max_len=20, steps=10, experiment="test-faults-infer")
    result = lumos(folder, "promote", run, "--model", "quickstart")
    assert result.exit_code == 0, result.output
    (folder / "run").write_text(run)
    return folder


def predictions_for(spark, project: Path, as_of: str) -> list:
    from lumos.core.tables import read_table, table_exists

    workspace = open_workspace(project)
    if not table_exists(spark, table_location(workspace, PREDICTIONS)):
        return []
    frame = read_table(spark, workspace, PREDICTIONS)
    return frame.where(frame["as_of"] == datetime.date.fromisoformat(as_of)).collect()


def test_infer_gives_each_user_what_the_trained_model_gives_their_ingested_row(spark, promoted):
    """Training/serving skew: the features infer rebuilds for a date are the ingested ones."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from lumos.data.loader import table_batches
    from lumos.data.sequences_version import open_sequences
    from lumos.infer.scoring import score_batch
    from lumos.train.run import download_checkpoint

    result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", TEST_CUTOFF, "--json")
    assert result.exit_code == 0, result.output
    served = {row["user_id"]: row for row in predictions_for(spark, promoted, TEST_CUTOFF)}

    workspace = open_workspace(promoted)
    model, _ = load_model(download_checkpoint(workspace, (promoted / "run").read_text(), "--run"))
    model.eval()
    data = open_sequences(workspace, TableRef.parse("quickstart.sequences"))
    table = pq.read_table([data_file.path for data_file in data.snapshot.files])
    table = table.filter(pc.equal(table["split"], "test"))
    users = table["user_id"].to_pylist()
    assert len(served) == len(users) == len(set(users)) > 100  # exact row count: one row per user
    start = 0
    for batch in table_batches(table, model.features, 64, "test rows"):
        trained = score_batch(model, None, batch, top_k=10, exclude_history=True)
        for offset, user in enumerate(users[start:start + batch.size]):
            row = served[user]
            assert row["user_embedding"] == pytest.approx(list(trained["user_embedding"][offset]), abs=1e-5), user
            assert row["top_scores"] == pytest.approx(list(trained["top_scores"][offset]), abs=1e-5), user
        start += batch.size


@pytest.mark.slow  # a Spark JVM per process: minutes
def test_sigkill_mid_infer_then_a_rerun_writes_exactly_that_dates_rows(spark, promoted, tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    day = "2026-08-31"
    killed = lumos_process(promoted, "infer", "--model", "quickstart@production", "--as-of", day,
                           env={"LUMOS_FAULT_POINT": "infer.write", "TMPDIR": str(temp)})
    _, stderr = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, stderr
    assert not list(temp.glob("lumos-checkpoint-*"))  # the checkpoint copy was removed once read
    assert predictions_for(spark, promoted, day) == []  # killed before its commit: nothing of it shows

    # The kill came after the user state's commit and before the predictions': that state version
    # is named by no predictions commit, so the next night does not carry it forward (for the next
    # run, the date's state and predictions both advanced or neither did).
    from lumos.core.tables import table_history

    killed_state = table_history(spark, open_workspace(promoted), TableRef.parse("quickstart.user_state"), limit=1)[0]
    assert killed_state.lineage.stats["as_of"] == day

    rerun = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", day, "--json")
    assert rerun.exit_code == 0, rerun.output  # the dead run's lock is taken over
    summary = json.loads(rerun.stdout)
    assert summary["mode"] == "full" and "named by no predictions commit" in summary["mode_reason"]
    assert summary["state"] == f"quickstart.user_state@{killed_state.version + 1}"
    rows = predictions_for(spark, promoted, day)
    assert len(rows) == summary["rows"] == len({row["user_id"] for row in rows}) > 100


@pytest.mark.slow  # a Spark JVM per process: minutes
def test_four_concurrent_infers_for_one_date_write_once(spark, promoted):
    day = "2026-09-07"
    runs = [lumos_process(promoted, "infer", "--model", "quickstart@production", "--as-of", day, "--json")
            for _ in range(4)]
    outcomes = [(process.wait(timeout=600), process.stdout.read(), process.stderr.read()) for process in runs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 1, 1, 1], [stderr for _, _, stderr in outcomes]
    for code, _, stderr in outcomes:
        if code == 1:
            assert f"another lumos infer is writing quickstart.predictions for {day}" in stderr
            assert "this run wrote nothing" in stderr
    written = next(json.loads(stdout) for code, stdout, _ in outcomes if code == 0)
    rows = predictions_for(spark, promoted, day)
    assert len(rows) == written["rows"] == len({row["user_id"] for row in rows})


# -- a truncated or garbled checkpoint ------------------------------------------------------------


def damage(weights: Path, how: str) -> None:
    data = weights.read_bytes()
    if how == "truncated":  # a copy cut short, as a full disk or a killed upload leaves it
        weights.write_bytes(data[: len(data) // 2])
    else:  # the 8-byte header length and the JSON header overwritten
        weights.write_bytes(b"\xff" * 64 + data[64:])


@pytest.mark.parametrize("how", ["truncated", "garbled header"])
def test_a_corrupt_checkpoint_fails_infer_eval_and_promote_naming_the_file(spark, promoted, how):
    from lumos.core.runs import stored_checkpoint

    workspace = open_workspace(promoted)
    run_id = (promoted / "run").read_text()
    stored = stored_checkpoint(tracking_client(workspace).get_run(run_id))
    weights = Path(stored.removeprefix("file://").removeprefix("file:")) / MODEL_FILE
    kept = weights.read_bytes()
    day = "2026-08-24"
    task_file = promoted / "tasks" / "next_item.toml"
    task_file.parent.mkdir(exist_ok=True)
    task_file.write_text((RECIPES / "tasks" / "next_item.toml").read_text())
    damage(weights, how)
    try:
        for args in (["infer", "--model", "quickstart@production", "--as-of", day],
                     ["eval", "--task", "next_item", "--run", run_id],
                     ["promote", run_id, "--model", "quickstart", "--alias", "staging"]):
            result = lumos(promoted, *args)
            assert result.exit_code == 1, (args, result.output)
            assert f"{stored}/{MODEL_FILE} cannot be read: it is truncated or corrupt" in result.output, args
            assert "Traceback" not in result.output
    finally:
        weights.write_bytes(kept)
    assert predictions_for(spark, promoted, day) == []
    client = tracking_client(workspace)
    assert "staging" not in client.get_registered_model("quickstart").aliases


# -- the embedding probe pairs embeddings and users by key ------------------------------------------


def test_probe_metrics_equal_a_recomputation_from_shuffled_raw_rows(promoted):
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from lumos.data.loader import table_batches
    from lumos.data.sequences_version import open_sequences
    from lumos.eval.probe import run_probe
    from lumos.eval.score import score_model
    from lumos.eval.tasks import LoadedTask, TaskSpec
    from lumos.train.run import download_checkpoint

    task_file = promoted / "tasks" / "churn_probe.toml"
    task_file.parent.mkdir(exist_ok=True)
    task_file.write_text((RECIPES / "tasks" / "churn_probe.toml").read_text())
    task = LoadedTask(load_config(TaskSpec, task_file), task_file)
    workspace = open_workspace(promoted)
    model, _ = load_model(download_checkpoint(workspace, (promoted / "run").read_text(), "--run"))
    data = open_sequences(workspace, TableRef.parse("quickstart.sequences"))
    scored = score_model(model, task, data).metrics

    # Independently: the raw rows in a random order, one embedding per user from the row naming it.
    table = pq.read_table([data_file.path for data_file in data.snapshot.files])
    table = table.filter(pc.equal(table["split"], "test"))
    table = table.take(np.random.default_rng(0).permutation(table.num_rows))
    embedding_of = {}
    users = table["user_id"].to_pylist()
    with torch.no_grad():
        for start, batch in zip(range(0, table.num_rows, 50), table_batches(table, model.features, 50, "test"), strict=True):
            for user, embedding in zip(users[start:start + 50], model.eval().embed_users(batch).numpy(), strict=True):
                embedding_of[user] = embedding  # the test split holds one row per user
    labels = pq.read_table(promoted / "data" / "labels.parquet").to_pydict()
    label_of = dict(zip(labels["user_id"], labels["churned"], strict=True))
    chosen = sorted(user for user in embedding_of if label_of.get(user) is not None)
    expected = run_probe(np.stack([embedding_of[user] for user in chosen]), [label_of[user] for user in chosen], chosen,
                         "logistic").metrics
    assert scored == pytest.approx({name: float(value) for name, value in expected.items()}, rel=1e-6)


# -- the SQLite tracking store locked by another writer ----------------------------------------------


@contextlib.contextmanager
def store_locked(workspace, seconds: float | None = None) -> Iterator[None]:
    """Another writer holds the store's SQLite write lock (as a parallel sweep's commit does), for
    `seconds` or the whole block."""
    import sqlite3

    tracking_client(workspace)  # the store exists
    holder = sqlite3.connect(Path(workspace.root) / "mlflow.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(seconds, holder.rollback) if seconds else None
    if release:
        release.start()
    try:
        yield
    finally:
        if release:
            release.join()
        holder.rollback() if holder.in_transaction else None
        holder.close()


def test_a_store_locked_for_a_few_seconds_is_waited_for(tmp_path):
    workspace = open_workspace(tmp_path)
    with store_locked(workspace, seconds=3):
        result = lumos(tmp_path, "models", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"models": []}


@pytest.mark.slow  # waits out MLflow's 20 s busy timeout
def test_a_store_locked_past_the_busy_timeout_fails_with_a_clear_error(tmp_path):
    workspace = open_workspace(tmp_path)
    started = time.monotonic()
    with store_locked(workspace):
        result = lumos(tmp_path, "models")
    assert result.exit_code == 1, result.output
    assert f"the MLflow store sqlite:///{workspace.root}/mlflow.db stayed locked by another writer" in result.output
    assert "Rerun it once that writer is done" in result.output and "Traceback" not in result.output
    assert time.monotonic() - started < 200  # bounded (MLflow waits up to 20 s a statement): it did not hang


# -- a DDP rank killed mid-run ----------------------------------------------------------------------


@pytest.mark.slow  # two ranks, and the wait for the survivor to stop: ~90 s
def test_a_rank_killed_mid_run_ends_the_whole_job_with_exit_1_naming_the_rank(project, tmp_path):
    """Rank 1 is SIGKILLed after its third step while rank 0 goes on into the next collective: the
    job must end (not hang in gloo), exit 1 naming the rank, and leave the MLflow run FAILED."""
    started = time.monotonic()
    process = lumos_process(project, "train", "--config", str(write_recipe(tmp_path, max_steps=1000, checkpoint_every=2,
                                                                            experiment="test-faults-ddp")),
                            "--nproc", "2", env={"LUMOS_FAULT_POINT": "train.step.3.rank1"})
    _, stderr = process.communicate(timeout=600)  # a hang fails here
    assert process.returncode == 1, stderr[-3000:]
    assert "error: rank 1 (pid " in stderr and "died of signal SIGKILL" in stderr, stderr[-3000:]
    assert "lumos train --resume RUN_ID" in stderr and "Traceback" not in stderr
    assert time.monotonic() - started < 300

    client = tracking_client(open_workspace(project))
    (run,) = client.search_runs([client.get_experiment_by_name("test-faults-ddp").experiment_id])
    assert run.info.status == "FAILED" and run.data.params["world_size"] == "2"
    assert run.data.tags["lumos.checkpoint"] == "checkpoints/step-00000002"  # the last one before the kill


# -- a kill during promote ----------------------------------------------------------------------------


@pytest.mark.slow  # two short trainings and a `lumos promote` process: ~60 s
def test_a_promote_killed_before_its_alias_moves_leaves_the_old_alias_and_a_rerun_moves_it(project, tmp_path):
    workspace = open_workspace(project)
    runs = []
    for seed in (1, 2):
        (tmp_path / str(seed)).mkdir()
        recipe = write_recipe(tmp_path / str(seed), max_steps=2, checkpoint_every=1000, seed=seed,
                              experiment="test-faults-promote")
        runs.append(train(load_config(TrainConfig, recipe), workspace).run_id)
    old, new = runs
    assert lumos(project, "promote", old, "--model", "killed").exit_code == 0

    killed = lumos_process(project, "promote", new, "--model", "killed", env={"LUMOS_FAULT_POINT": "promote.alias"})
    _, stderr = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, stderr[-2000:]
    client = tracking_client(workspace)
    versions = {version.run_id: int(version.version) for version in client.search_model_versions("name='killed'")}
    assert versions == {old: 1, new: 2}  # registered, not yet behind the alias
    assert client.get_model_version_by_alias("killed", "production").run_id == old

    rerun = lumos(project, "promote", new, "--model", "killed", "--json")
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.stdout)["reused_version"] is True
    assert int(client.get_model_version_by_alias("killed", "production").version) == 2
    assert len(client.search_model_versions("name='killed'")) == 2


# -- a kill in the middle of a data-file write, and during `lumos compile`'s upload -----------------


@pytest.mark.slow  # a Spark JVM per process: minutes
def test_sigkill_mid_predictions_file_write_shows_no_rows_and_a_rerun_writes_each_user_once(spark, promoted):
    day = "2026-08-17"
    killed = lumos_process(promoted, "infer", "--model", "quickstart@production", "--as-of", day,
                           env={"LUMOS_FAULT_POINT": "infer.mid_write"})
    _, stderr = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, stderr[-2000:]
    partition = Path(table_location(open_workspace(promoted), PREDICTIONS)) / f"as_of={day}"
    assert list(partition.glob("*.parquet")), "killed once the write had put a data file down"
    assert predictions_for(spark, promoted, day) == []  # not committed: Delta shows none of it

    rerun = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", day, "--json")
    assert rerun.exit_code == 0, rerun.output
    rows = predictions_for(spark, promoted, day)
    assert len(rows) == json.loads(rerun.stdout)["rows"] == len({row["user_id"] for row in rows}) > 100


@pytest.mark.slow  # three `lumos compile` of a tiny model, one a process of its own: ~60 s
def test_a_compile_killed_mid_upload_leaves_the_stored_plans_whole_and_a_rerun_adds_its_plan(promoted):
    from lumos.compile.engine import load_compiled
    from lumos.train.run import download_checkpoint

    workspace = open_workspace(promoted)
    run_id = (promoted / "run").read_text()
    client = tracking_client(workspace)
    compile_args = ("compile", "--run", run_id, "--batch", "8", "--no-search")
    assert lumos(promoted, *compile_args, "--seq", "6").exit_code == 0
    killed = lumos_process(promoted, *compile_args, "--seq", "12", env={"LUMOS_FAULT_POINT": "compile.upload"})
    _, stderr = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, stderr[-2000:]
    uploaded = {item.path for item in client.list_artifacts(run_id, "compile/cpu/seq-12")}
    assert uploaded == {"compile/cpu/seq-12/library.c"}  # the source, its plan not yet
    assert client.get_run(run_id).data.tags["lumos.compile.cpu"] == "seq=6"
    model, _ = load_model(download_checkpoint(workspace, run_id, "--run"))
    assert load_compiled(workspace, run_id, model.eval()).seq_lens == (6,)  # the whole plan only

    rerun = lumos(promoted, *compile_args, "--seq", "12", "--json")
    assert rerun.exit_code == 0, rerun.output
    assert client.get_run(run_id).data.tags["lumos.compile.cpu"] == "seq=6,12"
    assert load_compiled(workspace, run_id, model).seq_lens == (6, 12)
