"""`lumos quickstart` from an empty folder through every verb, on a tiny synthetic world."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lumos.cli.app import app

runner = CliRunner()


def users_with_events(folder) -> set[str]:
    """The users of the synthetic events the quickstart wrote (all valid, all before its as_of)."""
    import pyarrow.parquet as pq

    return set(pq.read_table(folder / "data" / "events", columns=["user_id"])["user_id"].to_pylist())


def test_quickstart_runs_every_verb_from_an_empty_folder(spark, tmp_path):
    folder = tmp_path / "qs"
    # Five steps cannot meet the default gate (AUC 0.6); a gate this model can meet keeps the gate in play.
    result = runner.invoke(app, ["quickstart", "--dir", str(folder), "--users", "120", "--events", "4000",
                                 "--steps", "5", "--require", "next_item:hr@50>=0", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (folder / "lumos.toml").is_file() and (folder / "tasks" / "next_item.toml").is_file()
    assert summary["tables"]["sequences"] == "quickstart.sequences@0"
    assert set(summary["eval"]) == {"next_item", "will_purchase_7d", "spend_7d", "segment_probe", "churn_probe"}
    assert summary["model"] == "quickstart/1" and summary["predictions"] == "quickstart.predictions@0"
    assert summary["as_of"] == "2026-09-29"  # the morning after the last activity
    assert summary["prediction_rows"] == len(users_with_events(folder)) > 100  # one row per user, none dropped
    assert set(summary["seconds"]) == {"setup", "ingest", "train", "eval", "promote", "infer"}

    # The folder is now a project: the verbs work from it, and an edited recipe survives a rerun.
    listing = runner.invoke(app, ["--workspace", str(folder), "models", "--json"])
    assert json.loads(listing.stdout)["models"][0]["aliases"] == {"production": 1}
    (folder / "train.toml").write_text((folder / "train.toml").read_text().replace("d_model = 64", "d_model = 32"))
    rerun = runner.invoke(app, ["quickstart", "--dir", str(folder), "--steps", "5", "--require", "next_item:hr@50>=0",
                                "--json"])
    assert rerun.exit_code == 0, rerun.output
    again = json.loads(rerun.stdout)
    assert again["tables"]["sequences"] == "quickstart.sequences@0"  # the same ingest is reused
    assert again["model"] == "quickstart/2" and again["predictions"] == "quickstart.predictions@1"
    assert "d_model = 32" in (folder / "train.toml").read_text()
