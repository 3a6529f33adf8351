"""`lumos promote`, `lumos models` and `lumos infer` on a real ingest, a real trained run, a SQLite
MLflow store and real Delta partitions."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import lumos as lumos_package
from lumos.cli.app import app
from lumos.core.lineage import LineageRecord
from lumos.core.tables import TableRef, read_table, table_history, table_location
from lumos.core.workspace import init_workspace, open_workspace
from lumos.data.predictions import RunInProgress, partition_lock, write_partition
from lumos.infer.trace import MODEL_SNAPSHOT, trace_prediction
from lumos.quickstart import RECIPES

AS_OF = "2026-09-14"
runner = CliRunner()


@pytest.fixture(scope="module")
def project(trained_quickstart, tmp_path_factory) -> Path:
    """Quickstart data, its next_item and will_purchase tasks, one ingest and one trained run."""
    folder = tmp_path_factory.mktemp("infer")
    (folder / "tasks").mkdir()
    for task in ("next_item", "will_purchase_7d"):
        shutil.copy(RECIPES / "tasks" / f"{task}.toml", folder / "tasks")
    run = trained_quickstart(folder, seed=5, max_len=20, steps=20, experiment="test-infer")
    (folder / "run").write_text(run)
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def model_names(project: Path) -> list[str]:
    return [model["name"] for model in json.loads(lumos(project, "models", "--json").stdout)["models"]]


def run_id(project: Path) -> str:
    return (project / "run").read_text()


@pytest.fixture(scope="module")
def evaluated(project) -> Path:
    result = lumos(project, "eval", "--all", "--run", run_id(project))
    assert result.exit_code == 0, result.output
    return project


# -- promote --------------------------------------------------------------------------------------


def test_promote_refuses_a_run_without_the_required_eval(project):
    result = lumos(project, "promote", run_id(project), "--model", "gated", "--require", "spend_7d:mae<=100")
    assert result.exit_code == 3
    assert "no eval result for task 'spend_7d'" in result.output
    assert "gated" not in model_names(project)


def test_promote_refuses_a_missed_bar_and_passes_a_met_one(evaluated):
    run = run_id(evaluated)
    missed = lumos(evaluated, "promote", run, "--model", "bars", "--require", "will_purchase_7d:auc_roc>=0.999")
    assert missed.exit_code == 3 and "measured" in missed.output
    passed = lumos(evaluated, "promote", run, "--model", "bars", "--require", "will_purchase_7d:auc_roc>=0.0",
                   "--require", "next_item:ndcg@10>=0", "--json")
    assert passed.exit_code == 0, passed.output
    summary = json.loads(passed.stdout)
    assert summary["version"] == 1 and summary["alias"] == "production" and len(summary["checks"]) == 2
    versions = json.loads(lumos(evaluated, "models", "bars", "--json").stdout)["versions"]
    tags = versions[0]["tags"]
    assert tags["lumos.run"] == run and tags["lumos.data"] == "quickstart.sequences@0"
    assert tags["lumos.config_hash"].startswith("sha256:") and "lumos.eval.next_item.ndcg_at_10" in tags


def test_promote_twice_reuses_the_version_and_rollback_moves_the_alias(evaluated):
    run = run_id(evaluated)
    first = json.loads(lumos(evaluated, "promote", run, "--model", "roll", "--json").stdout)
    again = json.loads(lumos(evaluated, "promote", run, "--model", "roll", "--alias", "staging", "--json").stdout)
    assert first["version"] == again["version"] == 1 and again["reused_version"]
    dry = lumos(evaluated, "promote", run, "--model", "other", "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["dry_run"]
    assert "other" not in model_names(evaluated)
    rollback = lumos(evaluated, "promote", "--model", "roll", "--alias", "production", "--version", "1", "--json")
    assert rollback.exit_code == 0, rollback.output
    missing = lumos(evaluated, "promote", "--model", "roll", "--version", "9")
    assert missing.exit_code == 2 and "roll/9" in missing.output


def test_promote_refuses_an_unfinished_or_foreign_run(project):
    from lumos.core.tracking import tracking_client

    client = tracking_client(open_workspace(project))
    experiment = client.create_experiment("not-lumos")
    foreign = client.create_run(experiment).info.run_id
    result = lumos(project, "promote", foreign, "--model", "foreign")
    assert result.exit_code == 3 and "not a Lumos training run" in result.output
    assert lumos(project, "promote", "no-such-run", "--model", "foreign").exit_code == 2


# -- infer ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promoted(evaluated) -> Path:
    result = lumos(evaluated, "promote", run_id(evaluated), "--model", "quickstart")
    assert result.exit_code == 0, result.output
    return evaluated


def predictions(spark, project: Path, as_of: str = AS_OF):
    frame = read_table(spark, open_workspace(project), TableRef.parse("quickstart.predictions"))
    return frame.where(frame["as_of"] == datetime.date.fromisoformat(as_of)).collect()


def test_infer_is_idempotent_per_date_and_leaves_other_dates(spark, promoted):
    first = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF, "--json")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["rows"] > 100 and summary["engine"] == "torch" and summary["model"] == "quickstart/1"
    other = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", "2026-08-01", "--json")
    assert other.exit_code == 0, other.output
    rows = predictions(spark, promoted)
    again = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF, "--json")
    assert again.exit_code == 0, again.output
    rerun = predictions(spark, promoted)
    assert len(rerun) == len(rows) == summary["rows"]
    assert len({row["user_id"] for row in rerun}) == len(rerun)  # one row per user, no duplicates
    assert sorted(row["user_id"] for row in rerun) == sorted(row["user_id"] for row in rows)
    assert len(predictions(spark, promoted, "2026-08-01")) == json.loads(other.stdout)["rows"]
    row = rerun[0]
    assert len(row["user_embedding"]) == 8 and len(row["top_items"]) == 10 and 0 <= row["p_act_7d"] <= 1
    assert all(item.startswith("i") for item in row["top_items"])  # item tokens, not vocabulary ids


def test_float_outputs_are_written_without_a_parquet_dictionary(spark, tmp_path):
    # Repeated floats, which Parquet would dictionary-encode: the write must not.
    init_workspace(tmp_path)
    workspace = open_workspace(tmp_path)
    frame = spark.range(1000).selectExpr(
        "cast(id as string) as user_id", "'quickstart/1' as model", "array(cast(0.5 as float), cast(1.5 as float)) as user_embedding",
        "cast(0.25 as float) as p_act_7d", f"date'{AS_OF}' as as_of")
    lineage = LineageRecord(stage="infer", config={}, config_hash="test", inputs=[])
    write_partition(spark, workspace, TableRef.parse("check.predictions"), frame.coalesce(1),
                    datetime.date.fromisoformat(AS_OF), lineage)
    folder = Path(table_location(workspace, TableRef.parse("check.predictions"))) / f"as_of={AS_OF}"
    (written,) = folder.glob("*.parquet")
    chunks = pq.ParquetFile(written).metadata.row_group(0)
    encodings = {chunks.column(i).path_in_schema: chunks.column(i).encodings for i in range(chunks.num_columns)}
    for column in ("user_embedding.list.element", "p_act_7d"):
        assert "PLAIN_DICTIONARY" not in encodings[column], (column, encodings[column])
    assert "PLAIN_DICTIONARY" in encodings["model"]  # other columns keep theirs
    assert spark.conf.get("parquet.enable.dictionary#p_act_7d", None) is None  # set for that write only


@pytest.fixture(scope="module")
def inferred(spark, promoted) -> str:
    """quickstart.predictions written for AS_OF; the id of a user with a prediction that day."""
    assert lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF).exit_code == 0
    return predictions(spark, promoted)[0]["user_id"]


# Traces `table` in a new Python, which says whether the trace imported MLflow.
TRACE_SCRIPT = """
import datetime, json, sys
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.infer.trace import trace_prediction

project, table, user, as_of = sys.argv[1:]
trace = trace_prediction(open_workspace(project), TableRef.parse(table), user, datetime.date.fromisoformat(as_of))
print(json.dumps({"trace": trace, "mlflow_imported": "mlflow" in sys.modules}))
"""


def trace_in_a_new_process(project: Path, table: str, user: str) -> tuple[dict, bool]:
    import subprocess
    import sys

    source = str(Path(lumos_package.__file__).parent.parent)  # this checkout's lumos, not an installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", TRACE_SCRIPT, str(project), table, user, AS_OF],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return answer["trace"], answer["mlflow_imported"]


def test_one_prediction_traces_back_to_run_config_and_data(inferred, promoted):
    user = inferred
    trace = trace_prediction(open_workspace(promoted), TableRef.parse("quickstart.predictions"), user,
                             datetime.date.fromisoformat(AS_OF))
    assert trace["model"]["version"] == "quickstart/1" and trace["run"]["id"] == run_id(promoted)
    assert trace["model"]["aliases"] == ["production"]
    assert trace["run"]["config"]["model"]["d_model"] == 8
    assert trace["run"]["config_hash"] == trace["model"]["tags"]["lumos.config_hash"]
    assert trace["data"]["table"] == "quickstart.sequences@0"
    assert trace["data"]["recipe"]["dataset"] == "quickstart" and trace["data"]["inputs"][0]["kind"] == "files"
    assert trace["prediction"]["commit"]["engine"] == "torch"
    assert MODEL_SNAPSHOT not in trace["prediction"]["commit"]["stats"]  # shown as model and run, not twice
    cli = lumos(promoted, "data", "trace", "quickstart.predictions", "--user", user, "--as-of", AS_OF, "--json")
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout) == json.loads(json.dumps(trace))
    # Infer recorded the model version and its run in its commit: the trace reads them there,
    # without MLflow, and they are what MLflow says now.
    assert trace_in_a_new_process(promoted, "quickstart.predictions", user) == (json.loads(json.dumps(trace)), False)
    live = trace_prediction(open_workspace(promoted), TableRef.parse("quickstart.predictions"), user,
                            datetime.date.fromisoformat(AS_OF), live=True)
    assert live == trace


def test_a_prediction_whose_commit_lacks_the_model_snapshot_is_traced_through_mlflow(spark, inferred, promoted):
    """Predictions written before infer recorded `model_snapshot` in its lineage: the trace reads
    the model version and run from MLflow instead, and shows the same."""
    workspace, day = open_workspace(promoted), datetime.date.fromisoformat(AS_OF)
    source, copy = TableRef.parse("quickstart.predictions"), TableRef.parse("quickstart.predictions_before_snapshot")
    lineage = table_history(spark, workspace, source)[0].lineage
    assert MODEL_SNAPSHOT in lineage.stats
    older = dataclasses.replace(lineage, stats={key: value for key, value in lineage.stats.items() if key != MODEL_SNAPSHOT})
    frame = read_table(spark, workspace, source)
    write_partition(spark, workspace, copy, frame.where(frame["as_of"] == day), day, older)
    traced, mlflow_imported = trace_in_a_new_process(promoted, str(copy), inferred)
    assert mlflow_imported
    recorded = trace_prediction(workspace, source, inferred, day)
    assert traced["model"] == recorded["model"] and traced["run"] == recorded["run"]
    assert traced["data"] == json.loads(json.dumps(recorded["data"]))


def test_predictions_are_the_model_on_the_date_s_sequences_rows(spark, promoted):
    """Infer builds each partition's rows and scores them in one Python pass; the same model on
    the rows `build_sequences` writes for the date (static features joined, calendar context per
    row) gives the same outputs for every user."""
    from lumos.data.loader import table_batches
    from lumos.data.training_data import training_data
    from lumos.infer.features import inference_rows
    from lumos.infer.scoring import score_batch
    from lumos.train.trained_model import load_registered_model

    assert lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF).exit_code == 0
    scored = {row["user_id"]: row for row in predictions(spark, promoted)}
    workspace = open_workspace(promoted)
    trained = load_registered_model(workspace, "quickstart@production")
    model = trained.model.eval()
    features = inference_rows(spark, workspace, training_data(workspace, trained.training_data),
                              datetime.date.fromisoformat(AS_OF))
    assert model.features.future_flags  # the calendar context is part of what is compared
    table = features.rows.toArrow()
    features.release()
    users = table.column("user_id").to_pylist()
    assert sorted(users) == sorted(scored)
    start = 0
    for batch in table_batches(table, model.features, 64, "test"):
        columns = score_batch(model, None, batch, 10, True)
        for offset, embedding in enumerate(columns["user_embedding"]):
            row = scored[users[start + offset]]
            assert row["user_embedding"] == pytest.approx(list(embedding), abs=1e-5)
            assert row["p_act_7d"] == pytest.approx(float(columns["p_act_7d"][offset]), abs=1e-5)
        start += batch.size


def test_unseen_users_and_items_are_scored_with_oov_ids(spark, promoted, tmp_path):
    events = pq.read_table(promoted / "data" / "events").to_pandas()
    stranger = events[events["user_id"] == events["user_id"].iloc[0]].copy()
    stranger["user_id"] = "never-seen-user"
    stranger["item_id"] = "never-seen-item"
    source = tmp_path / "events.parquet"
    import pandas as pd

    pd.concat([events, stranger]).to_parquet(source)
    result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF, "--source", str(source),
                   "--output", "quickstart.predictions_new", "--json")
    assert result.exit_code == 0, result.output
    frame = read_table(spark, open_workspace(promoted), TableRef.parse("quickstart.predictions_new"))
    stranger_rows = frame.where(frame["user_id"] == "never-seen-user").collect()
    assert len(stranger_rows) == 1 and "never-seen-item" not in stranger_rows[0]["top_items"]


def test_missing_recorded_source_fails_with_exit_2_and_writes_nothing(promoted):
    events = promoted / "data" / "events"
    moved = promoted / "data" / "events-moved"
    events.rename(moved)
    try:
        result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF,
                       "--output", "quickstart.never_written")
    finally:
        moved.rename(events)
    assert result.exit_code == 2
    assert "does not exist" in result.output and "--source" in result.output
    assert not (promoted / ".lumos" / "tables" / "quickstart" / "never_written").exists()


def test_overlapping_runs_for_one_date_cannot_both_write(promoted):
    workspace = open_workspace(promoted)
    ref = TableRef.parse("quickstart.predictions")
    day = datetime.date.fromisoformat("2026-09-07")
    with partition_lock(workspace, ref, day) as lock:
        result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", day.isoformat())
        assert result.exit_code == 1
        assert "another lumos infer is writing quickstart.predictions for 2026-09-07" in result.output
        with pytest.raises(RunInProgress):
            with partition_lock(workspace, ref, day):
                pass
    assert not lock.exists()
    # A lock left by a process that died on this host is taken over.
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "started_at": "earlier"}))
    with partition_lock(workspace, ref, day):
        pass


def test_bad_model_and_date_are_usage_errors(promoted):
    assert lumos(promoted, "infer", "--model", "nope@production", "--as-of", AS_OF).exit_code == 2
    assert lumos(promoted, "infer", "--model", "quickstart", "--as-of", AS_OF).exit_code == 2
    assert lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", "yesterday").exit_code == 2
    assert lumos(promoted, "infer", "--model", "quickstart@production", "--engine", "tpu").exit_code == 2


def test_compiled_engine_falls_back_without_a_plan_and_matches_torch_with_one(spark, promoted):
    day = "2026-09-10"
    args = ("infer", "--model", "quickstart@production", "--as-of", day, "--engine", "compiled", "--json")
    fallback = lumos(promoted, *args)
    assert fallback.exit_code == 0, fallback.output
    summary = json.loads(fallback.stdout)
    assert summary["engine"] == "torch" and "no compiled plan" in summary["warnings"][0]
    torch_rows = {row["user_id"]: row for row in predictions(spark, promoted, day)}

    compiled = lumos(promoted, "compile", "--model", "quickstart@production", "--batch", "64", "--search-budget", "5")
    assert compiled.exit_code == 0, compiled.output
    result = lumos(promoted, *args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["engine"] == "compiled"
    compiled_rows = predictions(spark, promoted, day)
    assert len(compiled_rows) == len(torch_rows)
    for row in compiled_rows:
        expected = torch_rows[row["user_id"]]
        assert row["user_embedding"] == pytest.approx(expected["user_embedding"], abs=1e-4)
        assert row["p_act_7d"] == pytest.approx(expected["p_act_7d"], abs=1e-4)
        assert row["top_scores"] == pytest.approx(expected["top_scores"], abs=1e-4)


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.mark.slow  # `lumos infer` twice in subprocesses, each with its own JVM: about 70 s
def test_cron_script_writes_the_partition_and_passes_exit_codes_on(spark, promoted):
    import subprocess

    script = Path(__file__).resolve().parents[2] / "examples" / "cron" / "daily_infer.sh"
    env = {**os.environ, "LUMOS_PROJECT": str(promoted), "LUMOS_AS_OF": "2026-09-01", "LUMOS_MODEL": "quickstart@production"}
    ok = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert "daily_infer: ok" in ok.stdout and len(predictions(spark, promoted, "2026-09-01")) > 100
    unknown = subprocess.run(["bash", str(script)], env={**env, "LUMOS_MODEL": "missing@production"},
                             capture_output=True, text=True, timeout=600)
    assert unknown.returncode == 2 and "exited 2" in unknown.stderr


# -- inference input: nothing dropped silently ------------------------------------------------------


def _events_with(promoted: Path, path: Path, *, shift_days: int = 0, bogus: int = 0) -> int:
    """Write the quickstart events, shifted by `shift_days`, plus `bogus` rows of an unknown event
    type, to `path` (parquet); return the number of rows written."""
    import pandas as pd

    events = pq.read_table(promoted / "data" / "events").to_pandas()
    events["ts"] = events["ts"] + pd.Timedelta(days=shift_days)
    bad = events.head(bogus).copy()
    bad["event_type"] = "bogus"
    frame = pd.concat([events, bad])
    frame.to_parquet(path, coerce_timestamps="us", allow_truncated_timestamps=True)  # Spark reads no nanoseconds
    return len(frame)


def _users_scored_from_the_ingested_source(spark, promoted: Path) -> set[str]:
    """The users `lumos infer` scores for AS_OF from the recipe's own source (the events file the
    tests copy): what an infer over a copy of those events must score, exactly."""
    from lumos.core.tables import table_exists, table_location

    written = table_exists(spark, table_location(open_workspace(promoted), TableRef.parse("quickstart.predictions")))
    if not written or not predictions(spark, promoted):
        assert lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF).exit_code == 0
    return {row["user_id"] for row in predictions(spark, promoted)}


def _latest(spark, project: Path, table: str):
    return table_history(spark, open_workspace(project), TableRef.parse(table), limit=1)[0]


def test_infer_reads_events_after_the_training_window_and_counts_its_rejects(spark, promoted, tmp_path):
    """The quickstart recipe's window ends 2027-01-01; a year later the same events, shifted, are
    all scored (not dropped as out of range), and the three bad rows land in infer_rejects."""
    source = tmp_path / "later.parquet"
    rows_read = _events_with(promoted, source, shift_days=364, bogus=3)
    as_of = "2027-09-13"  # AS_OF + 364 days
    result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", as_of, "--source", str(source),
                   "--output", "quickstart.predictions_later")
    assert result.exit_code == 0, result.output
    workspace = open_workspace(promoted)
    written = [row["user_id"] for row in read_table(spark, workspace, TableRef.parse("quickstart.predictions_later"))
               .select("user_id").collect()]
    # Every user with history, none dropped as out of the training window: the users of the same
    # events a year earlier, once each.
    assert len(written) == len(set(written)) and set(written) == _users_scored_from_the_ingested_source(spark, promoted)
    rejects = read_table(spark, workspace, TableRef.parse("quickstart.infer_rejects"))
    rejects = rejects.where(rejects["as_of"] == datetime.date.fromisoformat(as_of)).collect()
    assert [row["rule"] for row in rejects] == ["unknown_event_type"] * 3
    assert all('"bogus"' in row["row"] for row in rejects)
    stats = _latest(spark, promoted, "quickstart.predictions_later").lineage.stats
    assert stats["rows_read"] == rows_read and stats["rows_rejected"] == 3
    assert stats["rejected_by_rule"] == {"unknown_event_type": 3}
    assert stats["rejects"].startswith("quickstart.infer_rejects@")


def test_infer_source_is_relative_to_the_working_directory(spark, promoted, tmp_path, monkeypatch):
    _events_with(promoted, tmp_path / "events.parquet")
    monkeypatch.chdir(tmp_path)
    result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF,
                   "--source", "events.parquet", "--output", "quickstart.predictions_relative")
    assert result.exit_code == 0, result.output
    frame = read_table(spark, open_workspace(promoted), TableRef.parse("quickstart.predictions_relative"))
    users = [row["user_id"] for row in frame.select("user_id").collect()]
    assert len(users) == len(set(users)) and set(users) == _users_scored_from_the_ingested_source(spark, promoted)


def test_infer_over_the_reject_budget_or_with_no_user_is_exit_2_and_writes_nothing(spark, promoted, tmp_path):
    source = tmp_path / "bad.parquet"
    rows = _events_with(promoted, source, bogus=8_000)  # about half the rows, above max_reject_fraction 0.05
    over = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF, "--source", str(source),
                 "--output", "quickstart.never_written_rejects")
    assert over.exit_code == 2 and "cleaning.max_reject_fraction" in over.output and f"of {rows} rows" in over.output
    assert not (promoted / ".lumos" / "tables" / "quickstart" / "never_written_rejects").exists()

    assert lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", AS_OF).exit_code == 0
    before = predictions(spark, promoted)
    version = _latest(spark, promoted, "quickstart.predictions").version
    early = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", "2020-01-01")
    assert early.exit_code == 2 and "no user has a valid event before 2020-01-01" in early.output
    assert _latest(spark, promoted, "quickstart.predictions").version == version  # no new commit
    assert len(predictions(spark, promoted)) == len(before)
