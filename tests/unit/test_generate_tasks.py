"""`lumos eval tasks generate`: one loadable probe task per label column, nothing written on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.errors import ConfigError, UsageError
from lumos.eval.generate import generate_probe_tasks
from lumos.eval.tasks import load_tasks

runner = CliRunner()


@pytest.fixture
def labels(tmp_path: Path) -> Path:
    users = [f"u{i:03d}" for i in range(40)]
    path = tmp_path / "data" / "labels.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({
        "user_id": users,
        "segment": [f"c{i % 3}" for i in range(40)],
        "churned": [i % 4 == 0 for i in range(40)],
        "spend": [i * 1.5 for i in range(40)],
        "plan": [i % 5 for i in range(40)],  # few integer values: classes
        "visits": list(range(40)),  # many integer values: a quantity
        "constant": [1] * 40,
        "2fa": [i % 2 for i in range(40)],  # not a valid task name without a prefix
    }), path)
    return path


def test_every_column_becomes_a_loadable_task_with_the_probe_of_its_type(labels, tmp_path):
    out = tmp_path / "tasks"
    columns = ["segment", "churned", "spend", "plan", "visits"]
    written = generate_probe_tasks(labels, out, columns, data="quickstart.sequences@2", split="test")
    assert [task.name for task in written] == columns
    assert {task.column: task.probe for task in written} == {
        "segment": "logistic", "churned": "logistic", "spend": "linear", "plan": "logistic", "visits": "linear"}

    tasks = load_tasks([out])  # the same loader `lumos eval` uses
    assert sorted(tasks) == sorted(columns)
    spend = tasks["spend"].spec
    assert (spend.kind, spend.data, spend.split, spend.primary_metric) == ("embedding_probe", "quickstart.sequences@2", "test", "rmse")
    assert (spend.labels.label, spend.labels.probe) == ("spend", "linear")
    # The labels path is relative to the task file, so it resolves from there.
    assert (tasks["segment"].path.parent / tasks["segment"].spec.labels.path).resolve() == labels.resolve()
    assert tasks["segment"].spec.primary_metric == "accuracy"


def test_bad_columns_are_all_named_and_nothing_is_written(labels, tmp_path):
    out = tmp_path / "tasks"
    with pytest.raises(ConfigError) as raised:
        generate_probe_tasks(labels, out, ["segment", "missing", "constant", "2fa"], data="quickstart.sequences")
    message = str(raised.value)
    assert "missing: no such column" in message
    assert "constant: holds fewer than two distinct values" in message
    assert "2fa: a task name must start with a letter" in message
    assert not out.exists()

    written = generate_probe_tasks(labels, out, ["2fa"], data="quickstart.sequences", prefix="label_")
    assert [task.name for task in written] == ["label_2fa"]


def test_existing_files_need_force(labels, tmp_path):
    out = tmp_path / "tasks"
    generate_probe_tasks(labels, out, ["segment"], data="quickstart.sequences")
    with pytest.raises(UsageError, match="--force"):
        generate_probe_tasks(labels, out, ["segment", "churned"], data="quickstart.sequences")
    assert sorted(path.name for path in out.iterdir()) == ["segment.toml"]
    generate_probe_tasks(labels, out, ["segment", "churned"], data="quickstart.sequences", overwrite=True)
    assert sorted(path.name for path in out.iterdir()) == ["churned.toml", "segment.toml"]


def test_cli_defaults_to_every_column_but_the_user_id(labels, tmp_path):
    out = tmp_path / "tasks"
    pq.write_table(pq.read_table(labels).drop(["constant", "2fa"]), labels)
    result = runner.invoke(app, ["--workspace", str(tmp_path), "eval", "tasks", "generate", "--labels", str(labels),
                                 "--data", "quickstart.sequences", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    names = [task["name"] for task in json.loads(result.stdout)["tasks"]]
    assert names == ["segment", "churned", "spend", "plan", "visits"]

    result = runner.invoke(app, ["eval", "tasks", "generate", "--labels", str(tmp_path / "nope.parquet"),
                                 "--data", "quickstart.sequences", "--out", str(out)])
    assert result.exit_code == 2 and "nope.parquet" in result.output
