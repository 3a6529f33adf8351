"""`lumos reproduce`: the tiny quickstart run rebuilt from its lineage alone matches exactly on CPU;
a recorded result that differs exits 3; a changed input exits 2 before anything is rebuilt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.tables import TableRef
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.sequences_version import ingest_lineage
from lumos.quickstart import RECIPES

runner = CliRunner()


@pytest.fixture(scope="module")
def project(trained_quickstart, tmp_path_factory) -> Path:
    """A tiny quickstart run, scored on a model-head task and a probe task."""
    folder = tmp_path_factory.mktemp("reproduce")
    (folder / "tasks").mkdir()
    for task in ("will_purchase_7d", "segment_probe"):
        shutil.copy(RECIPES / "tasks" / f"{task}.toml", folder / "tasks")
    run = trained_quickstart(folder, seed=4, max_len=12, steps=12, experiment="test-reproduce")
    evaluated = lumos(folder, "eval", "--all", "--run", run)
    assert evaluated.exit_code == 0, evaluated.output
    (folder / "run").write_text(run)
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def reproduce(project: Path) -> tuple[int, dict]:
    result = lumos(project, "reproduce", (project / "run").read_text(), "--json")
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {"output": result.output}


def test_the_run_reproduces_exactly_then_a_different_record_exits_3(project):
    code, summary = reproduce(project)
    assert code == 0, summary
    assert summary["matches"] and summary["mode"] == "exact"
    compared = {row["name"]: row for row in summary["comparisons"]}
    assert compared["data content hash"]["recorded"].startswith("arrow-sum:")  # the writers' own hash
    assert compared["data content hash"]["recorded"] == compared["data content hash"]["reproduced"]
    assert compared["checkpoint weights (max |Δ|)"]["reproduced"] == 0.0
    assert {"train/retrieval", "eval/will_purchase_7d/auc_roc", "eval/segment_probe/accuracy"} <= set(compared)
    assert all(row["recorded"] == row["reproduced"] for row in summary["comparisons"] if row["name"].startswith("eval/"))
    workspace = open_workspace(project)
    rebuilt = TableRef.parse(summary["data"]["rebuilt"])
    assert rebuilt.version == TableRef.parse(summary["data"]["recorded"]).version + 1  # a new version, not a reuse
    assert ingest_lineage(workspace, rebuilt)[0].stats["content_hash"] == compared["data content hash"]["recorded"]
    client = tracking_client(workspace)
    assert client.get_run(summary["reproduced_run_id"]).data.tags["lumos.reproduces"] == summary["run_id"]

    # A recorded value the rebuild cannot give: the comparison names it and the command exits 3.
    client.log_metric(summary["run_id"], "valid/loss", 123.0, step=10**6)
    code, summary = reproduce(project)
    assert code == 3
    assert [row["name"] for row in summary["comparisons"] if not row["match"]] == ["valid/loss"]


def test_a_changed_input_exits_2_naming_it(project):
    calendar = project / "data" / "calendar.csv"
    calendar.write_text(calendar.read_text() + "2027-01-01,1,0\n")
    result = lumos(project, "reproduce", (project / "run").read_text())
    assert result.exit_code == 2
    assert "calendar.csv" in result.stderr and "content changed" in result.stderr


def test_a_hash_recorded_in_the_other_algorithm_is_recomputed_over_the_recorded_table(project, spark):
    """An ingest recorded before the writers hashed their own rows holds Spark's xxhash64 sum:
    reproduce then hashes the recorded table as stored, in the rebuild's algorithm."""
    from lumos.core.tables import content_hash, read_table
    from lumos.experiments.reproduce import recorded_content_hash

    workspace = open_workspace(project)
    recorded = TableRef.parse(tracking_client(workspace).get_run((project / "run").read_text()).data.tags["lumos.data"])
    recorded_hash = ingest_lineage(workspace, recorded)[0].stats["content_hash"]
    assert recorded_hash.startswith("arrow-sum:")
    rows = read_table(spark, workspace, recorded)
    old_style = content_hash(rows)  # xxhash64-sum
    assert recorded_content_hash(spark, workspace, recorded, old_style, recorded_hash) == recorded_hash
    assert recorded_content_hash(spark, workspace, recorded, None, recorded_hash) == recorded_hash
    assert recorded_content_hash(spark, workspace, recorded, recorded_hash, old_style) == old_style
    assert recorded_content_hash(spark, workspace, recorded, "arrow-sum:0:1", recorded_hash) == "arrow-sum:0:1"  # same algorithm: as recorded
