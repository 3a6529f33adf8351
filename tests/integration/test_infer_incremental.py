"""Incremental nightly inference (`lumos.data.user_state`) gives, night after night, exactly the
predictions of a full rebuild from the whole log: through skipped nights, a rerun of the same
date, late events in a new file, and a rerun of an earlier date."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.tables import TableRef, read_table, table_history
from lumos.core.workspace import open_workspace

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def promoted(trained_quickstart, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("infer-incremental")
    run = trained_quickstart(folder, seed=11, max_len=20, steps=10, experiment="test-infer-incremental")
    result = lumos(folder, "promote", run, "--model", "quickstart")
    assert result.exit_code == 0, result.output
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def night(project: Path, as_of: str, *flags: str) -> dict:
    result = lumos(project, "infer", "--model", "quickstart@production", "--as-of", as_of, "--json", *flags)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def full_rebuild(spark, project: Path, as_of: str) -> dict[str, dict]:
    """What today's full path gives for the date: features rebuilt from the whole log
    (`features.inference_rows`, which never reads the state), scored by the model itself."""
    from lumos.data.loader import table_batches
    from lumos.data.training_data import training_data
    from lumos.infer.features import inference_rows
    from lumos.infer.scoring import score_batch
    from lumos.train.trained_model import load_registered_model

    workspace = open_workspace(project)
    trained = load_registered_model(workspace, "quickstart@production")
    data = training_data(workspace, trained.training_data)
    features = inference_rows(spark, workspace, data, datetime.date.fromisoformat(as_of))
    table = features.rows.toArrow()
    features.release()
    users, start, expected = table["user_id"].to_pylist(), 0, {}
    for batch in table_batches(table, trained.model.features, 64, "rows"):
        scored = score_batch(trained.model.eval(), None, batch, top_k=10, exclude_history=True)
        for offset, user in enumerate(users[start:start + batch.size]):
            expected[user] = {name: values[offset] for name, values in scored.items() if name != "top_ids"}
        start += batch.size
    return expected


def assert_same_as_full_rebuild(spark, project: Path, as_of: str) -> None:
    frame = read_table(spark, open_workspace(project), TableRef.parse("quickstart.predictions"))
    served = {row["user_id"]: row for row in frame.where(frame["as_of"] == datetime.date.fromisoformat(as_of)).collect()}
    expected = full_rebuild(spark, project, as_of)
    assert sorted(served) == sorted(expected) and len(served) > 100  # the same rows
    for user, want in expected.items():
        row = served[user]
        assert row["user_embedding"] == pytest.approx(list(want["user_embedding"]), abs=1e-6), (as_of, user)
        assert row["top_scores"] == pytest.approx([s for s in want["top_scores"] if s != float("-inf")], abs=1e-6)
        for head in set(want) - {"user_embedding", "top_scores"}:  # p_act_7d, value_7d: the model's heads
            assert row[head] == pytest.approx(float(want[head]), abs=1e-6), (as_of, head, user)


def append_late_events(project: Path) -> list[str]:
    """A new events file, as a day's late delivery: events of existing users days before the
    state's date, one with no readable time (a reject); returns the users given late events."""
    events = project / "data" / "events"
    some = pq.read_table(sorted(events.glob("*.parquet"))[0]).slice(0, 3)
    users = some["user_id"].to_pylist()
    late = pa.Table.from_pylist([
        {**row, "ts": datetime.datetime(2026, 9, 5, 12, index), "event_type": "purchase"}
        for index, row in enumerate(some.to_pylist())
    ] + [{**some.to_pylist()[0], "ts": None}], schema=some.schema)
    pq.write_table(late, events / "part-late-00000.parquet")
    return users


@pytest.mark.slow  # eight nights of Spark on two cores
def test_every_night_equals_a_full_rebuild(spark, promoted):
    first = night(promoted, "2026-09-10")
    assert first["mode"] == "full" and "first run" in first["mode_reason"]
    assert first["users_updated"] >= first["rows"]  # every user with an event; rows need min_history
    assert_same_as_full_rebuild(spark, promoted, "2026-09-10")

    next_day = night(promoted, "2026-09-11")
    assert next_day["mode"] == "incremental"
    assert 0 < next_day["events_read"] < first["events_read"] and 0 < next_day["users_updated"] < first["rows"]
    assert_same_as_full_rebuild(spark, promoted, "2026-09-11")

    skipped = night(promoted, "2026-09-13")  # the 12th's night never ran
    assert skipped["mode"] == "incremental"
    assert_same_as_full_rebuild(spark, promoted, "2026-09-13")

    again = night(promoted, "2026-09-13")  # the same date rerun: nothing new to read
    assert again["mode"] == "incremental" and again["events_read"] == 0 and again["users_updated"] == 0
    assert_same_as_full_rebuild(spark, promoted, "2026-09-13")

    late_users = append_late_events(promoted)
    late = night(promoted, "2026-09-14")
    assert late["mode"] == "incremental" and late["late_users"] == len(set(late_users))
    assert late["rows_rejected"] == 1  # the late row with no time
    assert_same_as_full_rebuild(spark, promoted, "2026-09-14")

    earlier = night(promoted, "2026-09-12")
    assert earlier["mode"] == "full" and "before the state's date" in earlier["mode_reason"]
    assert_same_as_full_rebuild(spark, promoted, "2026-09-12")

    after = night(promoted, "2026-09-15")
    assert after["mode"] == "incremental" and after["late_users"] == 0
    assert_same_as_full_rebuild(spark, promoted, "2026-09-15")

    forced = night(promoted, "2026-09-15", "--full")
    assert forced["mode"] == "full" and forced["mode_reason"] == "--full"

    history = table_history(spark, open_workspace(promoted), TableRef.parse("quickstart.user_state"))
    assert len(history) == 8  # one commit a night
    lineage = history[0].lineage
    assert lineage.stats["as_of"] == "2026-09-15" and lineage.stats["key"]["vocab"] == "quickstart.vocab@0"
    assert any(item.version == lineage.stats["events"]["version"] for item in lineage.inputs)
    # The incremental night hashed only the files it had not recorded, the full one every file:
    # the same files give the same version.
    assert history[1].lineage.stats["mode"] == "incremental"
    assert history[1].lineage.stats["events"]["version"] == lineage.stats["events"]["version"]
    assert lineage.stats["events"]["version"].startswith("files:sha256:")
    recorded = lineage.stats["source_files"]
    assert recorded and all(item["sha256"] and item["identity"] for item in recorded.values())
    (late_file,) = [item for uri, item in recorded.items() if uri.endswith("part-late-00000.parquet")]
    assert late_file["first_event"] == late_file["last_event"] - 120_000_000  # 12:00 to 12:02 on the 5th
