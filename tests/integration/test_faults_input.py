"""Input that must never poison or vanish: every bad row lands in rejects with its own rule.

Each test reads real files through the real Spark reader and the recipe's validation, as an
ingest does; the fault-injection cases (marked `faults`) also kill real `lumos ingest` processes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lumos.core.config import from_dict
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe, SourceSpec
from lumos.data.sources import read_source
from lumos.data.validation import check_events, rejected_rows, valid_events


def shop_recipe(**cleaning) -> IngestRecipe:
    return from_dict(IngestRecipe, {
        "dataset": "shop",
        "source": {"path": "events.csv"},
        "columns": {"user_id": "user", "timestamp": "time", "event_type": "kind", "item_id": "item",
                    "value": "amount", "numeric": ["price"]},
        "cleaning": {"event_types": ["view", "purchase"], "max_reject_fraction": 1.0, **cleaning},
        "splits": {"mode": "leave_last_out", "min_history": 0},
    })


def check_file(spark, folder: Path, name: str, text: str, recipe: IngestRecipe):
    """(accepted rows as dicts, {rule: [raw row]}) for `text` written to folder/name and read as an ingest reads it."""
    (folder / name).write_text(text)
    raw, _ = read_source(spark, open_workspace(folder), name, "auto", folder, "source.path")
    checked = check_events(raw, recipe)
    accepted = [row.asDict() for row in valid_events(checked).collect()]
    rejected: dict[str, list[str]] = {}
    for row in rejected_rows(checked).collect():
        rejected.setdefault(row["rule"], []).append(row["row"])
    return accepted, rejected


HEADER = "user,time,kind,item,amount,price\n"


def test_non_finite_numbers_are_rejected_in_every_numeric_column(spark, tmp_path):
    lines = [
        "u1,2026-06-01 10:00:00,view,a,1.5,2.0",
        "u2,2026-06-01 10:00:00,view,a,NaN,2.0",
        "u3,2026-06-01 10:00:00,view,a,Infinity,2.0",
        "u4,2026-06-01 10:00:00,view,a,-Infinity,2.0",
        "u5,2026-06-01 10:00:00,view,a,1e999,2.0",
        "u6,2026-06-01 10:00:00,view,a,1.0,nan",
        "u7,2026-06-01 10:00:00,view,a,1.0,-inf",
    ]
    # No non_negative rule: a non-finite number is refused on its own, not as a negative one.
    accepted, rejected = check_file(spark, tmp_path, "events.csv", HEADER + "\n".join(lines) + "\n", shop_recipe())
    assert [row["user_id"] for row in accepted] == ["u1"]
    assert set(rejected) == {"non_finite"}
    assert sorted(json.loads(row)["user"] for row in rejected["non_finite"]) == ["u2", "u3", "u4", "u5", "u6", "u7"]


def test_malformed_csv_and_json_lines_are_rejected_with_their_raw_text(spark, tmp_path):
    good = "u1,2026-06-01 10:00:00,view,a,1.5,2.0"
    unterminated = 'u2,2026-06-01 10:00:00,view,"a,1.5,2.0'
    short = "u3,2026-06-01 10:00:00,view,a"
    long = "u4,2026-06-01 10:00:00,view,a,1.5,2.0,surplus"
    text = HEADER + "\n".join([good, unterminated, short, long]) + "\n"
    accepted, rejected = check_file(spark, tmp_path, "events.csv", text, shop_recipe())
    assert [(row["user_id"], row["item_id"]) for row in accepted] == [("u1", "a")]
    assert set(rejected) == {"malformed_line"}
    assert sorted(rejected["malformed_line"]) == sorted([unterminated, short, long])

    good_json = json.dumps({"user": "u1", "time": "2026-06-01 10:00:00", "kind": "view", "item": "a", "amount": 1.5, "price": 2.0})
    broken = '{"user": "u2", "time": "2026-06-01 10:00:00", "kind": "view", "item": "a'
    not_an_object = '["u3", "2026-06-01 10:00:00", "view"]'
    accepted, rejected = check_file(spark, tmp_path, "events.jsonl", "\n".join([good_json, broken, not_an_object]) + "\n",
                                    shop_recipe())
    assert [row["user_id"] for row in accepted] == ["u1"]
    assert sorted(rejected["malformed_line"]) == sorted([broken, not_an_object]) and set(rejected) == {"malformed_line"}


def test_parquet_with_nanosecond_timestamps_from_pandas_is_read(spark, tmp_path):
    import pandas as pd

    frame = pd.DataFrame({
        "user": ["u1", "u2"], "kind": ["view", "purchase"], "item": ["a", "b"], "amount": [1.0, 2.0], "price": [3.0, 4.0],
        # pandas writes datetime64[ns] as Parquet INT64 TIMESTAMP(NANOS), which Spark refuses by default.
        "time": pd.to_datetime(["2026-06-01 10:00:00.123456789", "2026-06-02 11:30:00"], format="ISO8601"),
        "seen_at": pd.to_datetime(["2026-06-01 10:00:01", "2026-06-02 11:30:01"]).tz_localize("UTC"),
    })
    frame.to_parquet(tmp_path / "events.parquet")
    raw, _ = read_source(spark, open_workspace(tmp_path), "events.parquet", "auto", tmp_path, "source.path")
    checked = check_events(raw, shop_recipe())
    assert rejected_rows(checked).count() == 0
    times = [row["ts"].isoformat(sep=" ") for row in valid_events(checked).orderBy("user_id").collect()]
    assert times == ["2026-06-01 10:00:00.123456", "2026-06-02 11:30:00"]
    assert raw.schema["seen_at"].dataType.typeName() == "timestamp"


WHITESPACE_IDS = ["\t", "\u00a0", "\u2003", " \u3000 ", "\u00a0\t"]


def test_whitespace_only_ids_are_missing_and_ids_are_stripped_of_unicode_whitespace(spark, tmp_path):
    def event(user, item="a"):
        return json.dumps({"user": user, "time": "2026-06-01 10:00:00", "kind": "view", "item": item, "amount": 1.0,
                           "price": 1.0})

    lines = [event("u1"), event("\tu1\u00a0", item="\u2002b\t")] + [event(blank) for blank in WHITESPACE_IDS]
    accepted, rejected = check_file(spark, tmp_path, "events.jsonl", "\n".join(lines) + "\n", shop_recipe())
    assert sorted((row["user_id"], row["item_id"]) for row in accepted) == [("u1", "a"), ("u1", "b")]
    assert set(rejected) == {"missing_user_id"}
    assert sorted(json.loads(row)["user"] for row in rejected["missing_user_id"]) == sorted(WHITESPACE_IDS)


def table_properties(spark, location: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, location).detail().first()["properties"]


def test_every_table_lumos_writes_keeps_its_commit_log(spark, tmp_path):
    import datetime

    from lumos.core.lineage import LineageRecord
    from lumos.core.tables import LOG_RETENTION, TableRef, table_history, table_location, write_table
    from lumos.infer.predictions import write_partition

    workspace = open_workspace(tmp_path)

    def lineage():
        return LineageRecord(stage="test", config={}, config_hash="h", inputs=[])

    fresh = TableRef("shop", "sequences")
    write_table(spark, workspace, fresh, spark.range(3), lineage())
    write_table(spark, workspace, fresh, spark.range(4), lineage())
    assert LOG_RETENTION.items() <= table_properties(spark, table_location(workspace, fresh)).items()
    assert [entry.version for entry in table_history(spark, workspace, fresh)] == [1, 0]

    # A table made before Lumos set the properties gets them at its next write.
    older = TableRef("shop", "vocab")
    spark.range(2).write.format("delta").save(table_location(workspace, older))
    written = write_table(spark, workspace, older, spark.range(5), lineage())
    assert LOG_RETENTION.items() <= table_properties(spark, table_location(workspace, older)).items()
    assert spark.read.format("delta").load(table_location(workspace, written)).count() == 5

    predictions = TableRef("shop", "predictions")
    rows = spark.range(2).selectExpr("id", "DATE'2026-06-01' AS as_of")
    write_partition(spark, workspace, predictions, rows, datetime.date(2026, 6, 1), lineage())
    assert LOG_RETENTION.items() <= table_properties(spark, table_location(workspace, predictions)).items()


def good_events(users: int, per_user: int) -> str:
    lines = [f"u{user},2026-06-{day + 1:02d} 10:00:00,view,i{(user + day) % 5},1.0,2.0"
             for user in range(users) for day in range(per_user)]
    return HEADER + "\n".join(lines) + "\n"


def test_sources_given_as_uris_get_a_version_from_their_listing(spark, tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()
    (folder / "part-0.csv").write_text(good_events(2, 3))
    (folder / "_SUCCESS").write_text("")
    uri = folder.as_uri()  # file:///…
    workspace = open_workspace(tmp_path)

    def version() -> str:
        return read_source(spark, workspace, uri, "csv", tmp_path, "source.path")[1].version

    first = version()
    assert first and first.startswith("listing:sha256:") and version() == first
    (folder / "part-1.csv").write_text(good_events(1, 2))  # new data arrives
    second = version()
    assert second != first
    (folder / ".part-1.csv.crc").write_text("x")  # not data: no new version
    assert version() == second
    with pytest.raises(UsageError, match="cannot be listed"):
        read_source(spark, workspace, (tmp_path / "absent").as_uri(), "csv", tmp_path, "source.path")


def test_the_same_recipe_over_changed_input_writes_a_new_version(spark, tmp_path):
    events = tmp_path / "events.csv"
    events.write_text(good_events(3, 4))
    workspace = open_workspace(tmp_path)
    for dataset, location in (("by_path", str(events)), ("by_uri", events.as_uri())):
        recipe = dataclasses.replace(shop_recipe(), dataset=dataset, source=SourceSpec(path=location, format="csv"))
        first = run_ingest(spark, workspace, recipe, tmp_path)
        again = run_ingest(spark, workspace, recipe, tmp_path)
        assert again.reused and again.tables == first.tables
        events.write_text(good_events(4, 4))  # the same file, now with a fourth user
        changed = run_ingest(spark, workspace, recipe, tmp_path)
        assert not changed.reused and changed.stats["users"] == 4
        assert changed.tables["sequences"].endswith("sequences@1"), (location, changed.tables)
        events.write_text(good_events(3, 4))
