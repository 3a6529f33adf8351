"""`lumos ingest` and `lumos data` through the CLI, on real Spark + Delta, as a user would run them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import config_hash, load_config
from lumos.core.tables import TableRef, content_hash, hash_algorithm, read_table
from lumos.core.workspace import open_workspace
from lumos.data.recipe import IngestRecipe
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES

QUICKSTART = RECIPES
runner = CliRunner()


def lumos(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """A project folder holding the quickstart recipe beside small synthetic data."""
    project = tmp_path_factory.mktemp("quickstart")
    shutil.copy(QUICKSTART / "ingest.toml", project / "ingest.toml")
    generate_quickstart(project / "data", SyntheticSpec(users=150, events=9_000, seed=3))
    return project


def test_quickstart_ingest_writes_versioned_tables_with_lineage(spark, quickstart):
    recipe_file = quickstart / "ingest.toml"
    result = lumos("--workspace", str(quickstart), "ingest", "--recipe", str(recipe_file), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["reused"] is False
    assert summary["tables"] == {"sequences": "quickstart.sequences@0", "vocab": "quickstart.vocab@0",
                                 "rejects": "quickstart.rejects@0"}
    stats = summary["stats"]
    assert stats["rows_read"] == 9_000 and stats["rows_rejected"] == 0 and stats["users"] == 150
    assert set(stats["rows_by_split"]) == {"train", "valid", "test"}

    history = json.loads(lumos("--workspace", str(quickstart), "data", "history", "quickstart.sequences", "--json").stdout)
    lineage = history["versions"][0]["lineage"]
    recipe = load_config(IngestRecipe, recipe_file)
    assert lineage["stage"] == "ingest"
    assert lineage["config_hash"] == config_hash(recipe)
    assert lineage["config"]["dataset"] == "quickstart" and lineage["config"]["tokens"]["max_len"] == 100
    assert [item["kind"] for item in lineage["inputs"]] == ["files", "files", "files"]
    assert all(item["version"].startswith("sha256:") for item in lineage["inputs"])
    assert lineage["stats"]["tables"] == {"vocab": "quickstart.vocab@0", "rejects": "quickstart.rejects@0"}
    # The stats are taken from the rows before they are written: they describe the table as read back.
    written = read_table(spark, open_workspace(quickstart), TableRef.parse("quickstart.sequences@0"))
    assert stats["content_hash"] == content_hash(written, hash_algorithm(stats["content_hash"]))
    assert stats["rows_by_split"] == {row["split"]: row["count"] for row in written.groupBy("split").count().collect()}
    assert stats["tokens"] == written.selectExpr("sum(length)").first()[0]

    # Same recipe, same inputs: nothing new is written.
    again = json.loads(lumos("--workspace", str(quickstart), "ingest", "--recipe", str(recipe_file), "--json").stdout)
    assert again["reused"] is True and again["tables"]["sequences"] == "quickstart.sequences@0"

    # A changed recipe makes a new version; the old one stays readable.
    changed = lumos("--workspace", str(quickstart), "ingest", "--recipe", str(recipe_file), "--set", "tokens.max_len=5", "--json")
    assert json.loads(changed.stdout)["tables"]["sequences"] == "quickstart.sequences@1"
    show = json.loads(lumos("--workspace", str(quickstart), "data", "show", "quickstart.sequences@0", "--json").stdout)
    assert show["version"] == 0 and show["lineage"]["config"]["tokens"]["max_len"] == 100
    assert {"user_id", "split", "as_of", "item", "next_item", "act_7d", "value_7d", "future_sale"} <= {
        column["name"] for column in show["schema"]
    }
    latest = spark.read.format("delta").load(show["location"])
    assert latest.selectExpr("max(length)").first()[0] == 5


def test_misspelled_recipe_key_is_named(tmp_path, quickstart):
    recipe = (quickstart / "ingest.toml").read_text().replace("max_len = 100", "max_lenght = 100")
    (tmp_path / "ingest.toml").write_text(recipe)
    result = lumos("--workspace", str(tmp_path), "ingest", "--recipe", str(tmp_path / "ingest.toml"))
    assert result.exit_code == 2
    assert "tokens.max_lenght: unknown key (did you mean 'max_len'?)" in result.stderr
    assert str(tmp_path / "ingest.toml") in result.stderr
    assert "Traceback" not in result.output


BAD_EVENTS = """user,time,kind,item,amount
u1,2026-06-01 10:00:00,view,a,
u1,2026-06-01 10:05:00,purchase,a,5.0
u1,2026-06-01 10:05:00,purchase,a,5.0
,2026-06-01 11:00:00,view,b,
u2,yesterday,view,b,
u2,2026-06-02 09:00:00,teleport,b,
u2,2026-06-02 09:30:00,purchase,b,-3
u2,2026-06-02 09:40:00,purchase,b,abc
u3,1999-01-01 00:00:00,view,c,
u3,2026-06-03 12:00:00,view,c,
"""

BAD_RECIPE = """
dataset = "shop"
[source]
path = "events.csv"
[columns]
user_id = "user"
timestamp = "time"
event_type = "kind"
item_id = "item"
value = "amount"
[cleaning]
event_types = ["view", "purchase"]
non_negative = ["value"]
min_timestamp = 2020-01-01T00:00:00
max_reject_fraction = 0.1
[splits]
mode = "leave_last_out"
min_history = 0
"""


def test_bad_rows_fail_the_ingest_and_write_nothing(tmp_path):
    (tmp_path / "events.csv").write_text(BAD_EVENTS)
    (tmp_path / "ingest.toml").write_text(BAD_RECIPE)
    result = lumos("--workspace", str(tmp_path), "ingest", "--recipe", str(tmp_path / "ingest.toml"))
    assert result.exit_code == 2, result.output
    assert "7 of 10 rows (70.0%) failed validation" in result.stderr
    assert "nothing was written" in result.stderr
    assert not (tmp_path / ".lumos" / "tables" / "shop").exists()


def test_bad_rows_under_the_budget_land_in_rejects_with_reasons(spark, tmp_path):
    (tmp_path / "events.csv").write_text(BAD_EVENTS)
    (tmp_path / "ingest.toml").write_text(BAD_RECIPE)
    result = lumos("--workspace", str(tmp_path), "ingest", "--recipe", str(tmp_path / "ingest.toml"),
                   "--set", "cleaning.max_reject_fraction=0.8", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["stats"]["rejected_by_rule"] == {
        "bad_number": 1, "bad_timestamp": 1, "duplicate": 1, "missing_user_id": 1,
        "negative_value": 1, "timestamp_out_of_range": 1, "unknown_event_type": 1,
    }
    rejects = spark.read.format("delta").load(str(tmp_path / ".lumos" / "tables" / "shop" / "rejects"))
    reasons = {row["rule"]: row["reason"] for row in rejects.collect()}
    assert reasons["unknown_event_type"] == "event type 'teleport' is not in cleaning.event_types"
    assert reasons["negative_value"] == "column 'amount' is negative (-3.0)"
    assert reasons["bad_number"] == "column 'amount' is not a number"
    row = json.loads(next(r["row"] for r in rejects.collect() if r["rule"] == "bad_timestamp"))
    assert row == {"user": "u2", "time": "yesterday", "kind": "view", "item": "b"}
    assert summary["stats"]["events"] == 3 and summary["stats"]["users"] == 2


def test_missing_source_column_and_file_are_clear(tmp_path):
    (tmp_path / "events.csv").write_text(BAD_EVENTS)
    (tmp_path / "ingest.toml").write_text(BAD_RECIPE.replace('item_id = "item"', 'item_id = "sku"'))
    result = lumos("--workspace", str(tmp_path), "ingest", "--recipe", str(tmp_path / "ingest.toml"))
    assert result.exit_code == 2
    assert "no column 'sku' (named in columns)" in result.stderr
    result = lumos("--workspace", str(tmp_path), "ingest", "--recipe", str(tmp_path / "ingest.toml"),
                   "--source", str(tmp_path / "absent.csv"))
    assert result.exit_code == 2 and "absent.csv does not exist" in result.stderr


def test_data_commands_reject_bad_table_names(tmp_path):
    result = lumos("--workspace", str(tmp_path), "data", "show", "../../etc")
    assert result.exit_code == 2 and "not a table name" in result.stderr
