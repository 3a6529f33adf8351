"""Leaderboard submissions end to end: a real quickstart ingest and training run, a real MLflow
store, the `lumos eval` CLI. A submission made of the model's own predictions scores its model
entry; a bad file exits 2 and logs nothing; a submission never moves a promotion gate."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict
from lumos.core.errors import GateError
from lumos.core.tables import TableRef
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.loader import table_batches
from lumos.data.sequences_version import open_sequences
from lumos.eval.leaderboard import experiment_name
from lumos.eval.promote import parse_requirement, promote
from lumos.eval.sides import user_sides
from lumos.eval.submission import task_users
from lumos.eval.tasks import TaskSpec
from lumos.quickstart import RECIPES
from lumos.train.trained_model import load_training_run

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
TASKS = ("next_item", "will_purchase_7d")


@pytest.fixture(scope="module")
def project(trained_quickstart, tmp_path_factory) -> Path:
    """A trained quickstart run, entered on next_item and will_purchase_7d. The tasks score one row
    a batch, as the submissions below are made: padding to a longer neighbour moves float32 outputs."""
    folder = tmp_path_factory.mktemp("submissions")
    run_id = trained_quickstart(folder, seed=4, max_len=12, steps=20, experiment="test-submissions")
    (folder / "run.txt").write_text(run_id)
    shutil.copytree(RECIPES / "tasks", folder / "tasks")
    for name in TASKS:
        with (folder / "tasks" / f"{name}.toml").open("a") as spec:
            spec.write("batch_size = 1\n")
    result = lumos(folder, "eval", "--task", TASKS[0], "--task", TASKS[1], "--run", run_id)
    assert result.exit_code == 0, result.output
    return folder


def lumos(folder: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(folder), *args])


def spec_of(folder: Path, name: str) -> TaskSpec:
    import tomllib

    return from_dict(TaskSpec, tomllib.loads((folder / "tasks" / f"{name}.toml").read_text()))


def leaderboard_json(folder: Path, task: str) -> dict:
    result = lumos(folder, "eval", "leaderboard", "--task", task, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def all_runs(folder: Path, task: str) -> list:
    """Every run of the task's experiment, deleted ones too: a refused file must add none."""
    from mlflow.entities import ViewType

    client = tracking_client(open_workspace(folder))
    experiment = client.get_experiment_by_name(experiment_name(task))
    return client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)


def own_predictions(folder: Path, task: str) -> pa.Table:
    """The trained model's predictions for every user of the task, as a team would submit them."""
    workspace = open_workspace(folder)
    spec = spec_of(folder, task)
    data = open_sequences(workspace, TableRef.parse(spec.data))
    rows = task_users(spec, data)
    model = load_training_run(workspace, (folder / "run.txt").read_text()).model.eval()
    values = []
    with torch.no_grad():
        for batch in table_batches(rows, data.spec, 1, "test"):
            output = model(batch)
            if spec.kind == "binary":
                values += torch.sigmoid(output.act_logits[:, data.spec.horizons_days.index(spec.horizon_days)]).tolist()
            else:
                ranked = torch.argsort(model.score_items(batch, output), dim=1, descending=True, stable=True)
                values += [[item for item in row if item >= 2] for row in ranked.tolist()]
    column = "probability" if spec.kind == "binary" else "top_items"
    return pa.table({"user_id": rows["user_id"], column: values})


def test_export_holds_users_histories_items_and_schema_but_no_label(project, tmp_path):
    result = lumos(project, "eval", "tasks", "export", "next_item", "--out", str(tmp_path / "export"))
    assert result.exit_code == 0, result.output
    users = pq.read_table(tmp_path / "export" / "users.parquet")
    assert "user_id" in users.column_names and "item" in users.column_names
    assert not {"next_item", "split", "act_7d", "value_7d"} & set(users.column_names)
    assert users["user_id"].to_pylist() == sorted(set(users["user_id"].to_pylist()))
    items = pq.read_table(tmp_path / "export" / "items.parquet")
    assert min(items["item_id"].to_pylist()) == 2
    schema = json.loads((tmp_path / "export" / "schema.json").read_text())
    shown = lumos(project, "eval", "tasks", "schema", "next_item", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == schema
    assert [column["name"] for column in schema["columns"]] == ["user_id", "top_items"]


@pytest.mark.parametrize("task", TASKS)
def test_the_models_own_predictions_score_its_entry_in_any_row_order(project, tmp_path, task):
    table = own_predictions(project, task)
    pq.write_table(table, tmp_path / "own.parquet")
    result = lumos(project, "eval", "--task", task, "--predictions", str(tmp_path / "own.parquet"), "--name", "acme/own",
                   "--description", "the model's own predictions", "--json")
    assert result.exit_code == 0, result.output
    submitted = json.loads(result.stdout)["metrics"]
    entries = {entry["label"]: entry for entry in leaderboard_json(project, task)["entries"]}
    model_entry = next(entry for entry in entries.values() if entry["kind"] == "model")
    assert submitted == pytest.approx(model_entry["metrics"], rel=1e-9, abs=1e-12)

    shuffled = table.take(pa.array(np.random.default_rng(0).permutation(table.num_rows)))
    if task == "next_item":  # CSV holds a list as JSON text
        shuffled = pa.table({"user_id": shuffled["user_id"], "top_items": [json.dumps(items) for items in shuffled["top_items"].to_pylist()]})
    pacsv.write_csv(shuffled, tmp_path / "shuffled.csv")
    again = lumos(project, "eval", "--task", task, "--predictions", str(tmp_path / "shuffled.csv"), "--name",
                  "acme/shuffled", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["metrics"] == submitted

    run = next(run for run in all_runs(project, task) if run.info.run_name == "submission/acme/own")
    assert run.data.tags["lumos.eval.entry"] == "submission"
    assert run.data.tags["lumos.eval.description"] == "the model's own predictions"
    assert len(run.data.tags["lumos.eval.sha256"]) == 64


@pytest.mark.parametrize(("change", "rule"), [
    (lambda table: table.slice(1), "missing user"),
    (lambda table: pa.concat_tables([table, table.slice(0, 1)]), "duplicate user"),
    (lambda table: table.set_column(1, "probability", pa.array([float("nan")] * table.num_rows)), "finite number"),
    (lambda table: table.set_column(1, "probability", pa.array(["high"] * table.num_rows)), "wrong type"),
])
def test_a_bad_file_exits_2_naming_the_rule_and_logs_nothing(project, tmp_path, change, rule):
    pq.write_table(change(own_predictions(project, "will_purchase_7d")), tmp_path / "bad.parquet")
    before = len(all_runs(project, "will_purchase_7d"))
    result = lumos(project, "eval", "--task", "will_purchase_7d", "--predictions", str(tmp_path / "bad.parquet"),
                   "--name", "acme/bad")
    assert result.exit_code == 2, result.output
    assert rule in result.output and "nothing was logged" in result.output
    assert len(all_runs(project, "will_purchase_7d")) == before


def test_a_submission_never_moves_a_promotion_gate_and_the_leaderboard_shows_kinds(project, tmp_path):
    workspace = open_workspace(project)
    run_id = (project / "run.txt").read_text()
    spec = spec_of(project, "next_item")
    data = open_sequences(workspace, TableRef.parse(spec.data))
    rows = task_users(spec, data)
    vocabulary = range(2, data.spec.item_vocab_size)
    # An oracle: each user's next item first, then every other item (a row with no next item is not scored).
    perfect = [[target, *[item for item in vocabulary if item != target]] if target and target >= 2 else list(vocabulary)
               for target in rows["next_item"].to_pylist()]
    pq.write_table(pa.table({"user_id": rows["user_id"], "top_items": perfect}), tmp_path / "perfect.parquet")

    # Gates read the whole split's score, which the model's entry logged into its training run.
    model_score = tracking_client(workspace).get_run(run_id).data.metrics["eval/next_item/ndcg_at_10"]
    requirement = parse_requirement(f"next_item:ndcg@10>={model_score + 0.01}")
    with pytest.raises(GateError):
        promote(workspace, "submissions-test", "champion", run_id=run_id, requirements=[requirement], dry_run=True)
    before = tracking_client(workspace).get_run(run_id).data.metrics

    result = lumos(project, "eval", "--task", "next_item", "--predictions", str(tmp_path / "perfect.parquet"),
                   "--name", "acme/oracle")
    assert result.exit_code == 0, result.output
    board = leaderboard_json(project, "next_item")["entries"]
    assert board[0]["label"] == "acme/oracle" and board[0]["kind"] == "submission"
    assert board[0]["metrics"]["ndcg@10"] == pytest.approx(1.0)
    assert {entry["kind"] for entry in board} == {"model", "baseline", "submission"}
    assert tracking_client(workspace).get_run(run_id).data.metrics == before
    with pytest.raises(GateError):
        promote(workspace, "submissions-test", "champion", run_id=run_id, requirements=[requirement], dry_run=True)

    table = lumos(project, "eval", "leaderboard", "--task", "next_item", "--csv")
    assert table.exit_code == 0, table.output
    kinds = {row["entry"]: row["kind"] for row in csv.DictReader(io.StringIO(table.stdout))}
    assert kinds["acme/oracle"] == "submission" and kinds["baseline: popularity"] == "baseline"


def test_the_leaderboard_ranks_on_the_public_side_and_only_private_shows_the_rest(project, tmp_path):
    """Two files, each perfect on one side of the users and worst-possible on the other: the one
    perfect on the public side ranks first, and only --private shows the other's perfect score."""
    workspace = open_workspace(project)
    spec = spec_of(project, "next_item")
    rows = task_users(spec, open_sequences(workspace, TableRef.parse(spec.data)))
    public, _ = user_sides(spec)
    on_public = public.holds(rows["user_id"])
    vocabulary = list(range(2, max(item for item in rows["next_item"].to_pylist() if item) + 1))

    def ranking(target, perfect: bool) -> list[int]:
        others = [item for item in vocabulary if item != target]
        return [target, *others] if perfect and target and target >= 2 else [*others, *([target] if target and target >= 2 else [])]

    for name, good_side in (("acme/public-oracle", True), ("acme/private-oracle", False)):
        top = [ranking(target, bool(held) == good_side) for target, held in zip(rows["next_item"].to_pylist(), on_public, strict=True)]
        pq.write_table(pa.table({"user_id": rows["user_id"], "top_items": top}), tmp_path / "side.parquet")
        result = lumos(project, "eval", "--task", "next_item", "--predictions", str(tmp_path / "side.parquet"),
                       "--name", name, "--json")
        assert result.exit_code == 0, result.output
        shown = json.loads(result.stdout)
        assert shown["scored_on"] == "public"
        assert shown["metrics"]["hr@10"] == (1.0 if good_side else 0.0)  # the team sees its public scores only

    board = leaderboard_json(project, "next_item")["entries"]
    labels = [entry["label"] for entry in board]
    assert labels.index("acme/public-oracle") < labels.index("acme/private-oracle")
    assert all(entry["scored_on"] == "public" and "private_metrics" not in entry for entry in board)
    private = lumos(project, "eval", "leaderboard", "--task", "next_item", "--private", "--json")
    assert private.exit_code == 0, private.output
    entries = {entry["label"]: entry for entry in json.loads(private.stdout)["entries"]}
    assert entries["acme/private-oracle"]["private_metrics"]["hr@10"] == 1.0
    assert entries["acme/public-oracle"]["private_metrics"]["hr@10"] == 0.0
    table = lumos(project, "eval", "leaderboard", "--task", "next_item", "--private", "--csv")
    assert "private hr@10" in next(csv.reader(io.StringIO(table.stdout)))


def test_the_example_outside_model_enters_from_an_export_alone(project, tmp_path):
    """examples/submissions/item_knn.py reads only what `lumos eval tasks export` wrote."""
    exported = lumos(project, "eval", "tasks", "export", "next_item", "--out", str(tmp_path / "export"))
    assert exported.exit_code == 0, exported.output
    script = Path(__file__).parents[2] / "examples" / "submissions" / "item_knn.py"
    fitted = subprocess.run([sys.executable, str(script), str(tmp_path / "export"), "--out", str(tmp_path / "knn.parquet")],
                            capture_output=True, text=True, timeout=300)
    assert fitted.returncode == 0, fitted.stderr
    result = lumos(project, "eval", "--task", "next_item", "--predictions", str(tmp_path / "knn.parquet"),
                   "--name", "acme/item-knn", "--json")
    assert result.exit_code == 0, result.output
    entry = next(entry for entry in leaderboard_json(project, "next_item")["entries"] if entry["label"] == "acme/item-knn")
    assert entry["kind"] == "submission" and entry["metrics"] == json.loads(result.stdout)["metrics"]
    assert entry["metrics"]["hr@50"] > 0


def test_the_daily_limit_counts_only_that_name_and_task(project, tmp_path):
    with (project / "tasks" / "spend_7d.toml").open("a") as spec:
        spec.write("daily_submissions = 2\n")
    rows = task_users(spec_of(project, "spend_7d"), open_sequences(open_workspace(project), TableRef.parse("quickstart.sequences")))
    pq.write_table(pa.table({"user_id": rows["user_id"], "value": [1.0] * rows.num_rows}), tmp_path / "flat.parquet")

    def submit(task: str, name: str):
        return lumos(project, "eval", "--task", task, "--predictions", str(tmp_path / "flat.parquet"), "--name", name)

    assert submit("spend_7d", "acme/flat").exit_code == 0
    assert submit("spend_7d", "acme/flat").exit_code == 0  # replaces the entry, and still counts
    refused = submit("spend_7d", "acme/flat")
    assert refused.exit_code == 3, refused.output
    assert "submitted 2 time(s)" in refused.output and "next submission is allowed at" in refused.output
    assert submit("spend_7d", "acme/other").exit_code == 0
    board = leaderboard_json(project, "spend_7d")["entries"]
    assert sorted(entry["label"] for entry in board if entry["kind"] == "submission") == ["acme/flat", "acme/other"]
