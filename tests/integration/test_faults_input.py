"""Input that must never poison or vanish: every bad row lands in rejects with its own rule.

Each test reads real files through the real Spark reader and the recipe's validation, as an
ingest does; the fault-injection cases (marked `faults`) also kill real `lumos ingest` processes.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lumos.core.config import from_dict
from lumos.core.errors import UsageError
from lumos.core.faults import FAULT_POINT
from lumos.core.workspace import open_workspace
from lumos.data.ingest import count_rejects, count_rejects_and_tokens, run_ingest
from lumos.data.recipe import IngestRecipe, SourceSpec
from lumos.data.sequences import build_vocab
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


def read_file(spark, folder: Path, name: str, text: str):
    """`text` written to folder/name and read as an ingest reads it."""
    (folder / name).write_text(text)
    raw, _ = read_source(spark, open_workspace(folder), name, "auto", folder, "source.path")
    return raw


def rejects_by_rule(rejected) -> dict[str, list[str]]:
    """{rule: [raw row]} of a `rejected_rows` frame."""
    by_rule: dict[str, list[str]] = {}
    for row in rejected.collect():
        by_rule.setdefault(row["rule"], []).append(row["row"])
    return by_rule


def check_file(spark, folder: Path, name: str, text: str, recipe: IngestRecipe):
    """(accepted rows as dicts, {rule: [raw row]}) for `text` written to folder/name and read as an ingest reads it."""
    raw = read_file(spark, folder, name, text)
    checked = check_events(raw, recipe)
    accepted = [row.asDict() for row in valid_events(checked).collect()]
    return accepted, rejects_by_rule(rejected_rows(checked, raw, count_rejects(checked).by_rule))


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
    assert count_rejects(checked).rejected == 0
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


def test_stripping_skips_the_regex_only_where_it_would_change_nothing(spark):
    """strip_whitespace runs its regex only on values whose first or last byte looks like space,
    control or non-ASCII: on random strings of edge characters it equals the regex applied to all."""
    import random

    from pyspark.sql import functions as F

    from lumos.data.validation import _EDGE_WHITESPACE, strip_whitespace

    edges = ["", " ", "\t", "\n", "\x1f", "\x7f", "!", "~", "a", "\u00a0", "\u0085", "\u2003", "\u200b",
             "\u3000", "\ufeff", "\u00e9", "\u4e2d", "\U0001f600"]
    rng = random.Random(0)
    values = [None, *edges] + ["".join(rng.choices(edges, k=rng.randint(1, 4))) for _ in range(2000)]
    frame = spark.createDataFrame([(value,) for value in values], "text string")
    rows = frame.select(strip_whitespace(F.col("text")).alias("fast"),
                        F.regexp_replace("text", _EDGE_WHITESPACE, "").alias("always")).collect()
    assert [row["fast"] for row in rows] == [row["always"] for row in rows]
    assert sum(row["fast"] != value for row, value in zip(rows, values, strict=True) if value) > 500


def test_only_exact_copies_of_a_valid_row_are_duplicates(spark, tmp_path):
    """Every copy after the first is rejected, however many there are, and nothing that differs in
    a mapped column is; a row that breaks another rule is not a copy, and -0.0 is the number 0.0."""
    row = "u1,2026-06-01 10:00:00,view,a,,1.0"  # value empty: null, like the bad number's below
    lines = [
        row, row, row,
        "u1,2026-06-01 10:00:00,view,a,abc,1.0",  # equal once cast, but a bad number: not a copy
        "u1,2026-06-01 10:00:00,view,a,,2.0",  # another price
        "u1,2026-06-01 10:00:00,purchase,a,,1.0",  # another event type at the same instant
        "u2,2026-06-01 10:00:00,view,a,,1.0",  # another user
        "u3,2026-06-01 10:00:00,view,b,0.0,1.0",
        "u3,2026-06-01 10:00:00,view,b,-0.0,1.0",  # the same number
        "u3,2026-06-01 10:00:00,view,b,0.0,3.0",
    ]
    accepted, rejected = check_file(spark, tmp_path, "events.csv", HEADER + "\n".join(lines) + "\n", shop_recipe())
    assert sorted((row["user_id"], row["event_type"], row["item_id"], row["num_price"]) for row in accepted) == [
        ("u1", "purchase", "a", 1.0), ("u1", "view", "a", 1.0), ("u1", "view", "a", 2.0), ("u2", "view", "a", 1.0),
        ("u3", "view", "b", 1.0), ("u3", "view", "b", 3.0),
    ]
    assert {rule: len(rows) for rule, rows in rejected.items()} == {"duplicate": 3, "bad_number": 1}
    assert sorted(json.loads(row)["user"] for row in rejected["duplicate"]) == ["u1", "u1", "u3"]


# 100 bytes hold the two copies' hashes (16 bytes each) but not Spark's estimate of them, which
# it scales from the 202 cached events: only the counted copies make the join a broadcast.
@pytest.mark.parametrize("broadcast_budget", ["100", "-1"], ids=["copies-broadcast", "copies-shuffled"])
def test_a_duplicate_is_quoted_as_its_own_raw_row(spark, tmp_path, broadcast_budget):
    """Copies are found after the shuffle by user, which carries only a hash of each raw row; the
    rejects table still quotes the copy's whole raw row, columns the recipe does not map included,
    whether the copies' hashes are broadcast to the raw rows (when they fit Spark's budget) or not."""
    lines = ["u1,2026-06-01 10:00:00,view,a,,1.0,first", "u1,2026-06-01 10:00:00,view,a,,1.0,second",
             "u1,2026-06-01 10:00:00,view,a,,1.0,second", "u2,2026-06-01 10:00:00,view,a,,1.0,first"]
    lines += [f"f{index},2026-06-01 10:00:00,view,a,,1.0,filler" for index in range(200)]
    raw = read_file(spark, tmp_path, "events.csv", HEADER.replace("\n", ",note\n") + "\n".join(lines) + "\n")
    checked = check_events(raw, shop_recipe()).persist()  # as ingest and infer keep it
    before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", broadcast_budget)
    try:
        frame = rejected_rows(checked, raw, count_rejects(checked).by_rule)
        plan = frame._jdf.queryExecution().executedPlan().toString()
        rejected = rejects_by_rule(frame)
        accepted = [row.asDict() for row in valid_events(checked).collect()]
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before)
        checked.unpersist()
    assert ("LeftSemi, BuildRight" in plan) == (broadcast_budget != "-1")
    assert sorted(row["user_id"] for row in accepted if not row["user_id"].startswith("f")) == ["u1", "u2"]
    assert len(accepted) == 202
    quoted = [json.loads(row) for row in rejected["duplicate"]]
    assert set(rejected) == {"duplicate"} and len(quoted) == 2
    # The kept copy is the one whose raw row hashes lowest: two of the three raw rows are quoted.
    assert sorted(row["note"] for row in quoted) in (["first", "second"], ["second", "second"])
    assert all(row["user"] == "u1" and row["kind"] == "view" for row in quoted)


def table_properties(spark, location: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, location).detail().first()["properties"]


def test_every_table_lumos_writes_keeps_its_commit_log(spark, tmp_path):
    from lumos.core.lineage import LineageRecord
    from lumos.core.tables import LOG_RETENTION, TableRef, table_history, table_location, write_table
    from lumos.data.predictions import write_partition

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


# Fault injection. Each bad row carries a marker in its item column, so the test can tell which
# rule each one was rejected for; the expected rule is the marker's prefix.
BAD_ROWS = [
    "u9,2026-06-01 10:00:00,view,non_finite_nan,NaN,1.0",
    "u9,2026-06-01 10:00:00,view,non_finite_inf,1.0,Infinity",
    "u9,2026-06-01 10:00:00,view,non_finite_overflow,1e999,1.0",
    'u9,2026-06-01 10:00:00,view,"malformed_line_quote,1.0,1.0',
    "u9,2026-06-01 10:00:00,view,malformed_line_short",
    "u9,2026-06-01 10:00:00,view,malformed_line_long,1.0,1.0,surplus",
    "\t,2026-06-01 10:00:00,view,missing_user_id_tab,1.0,1.0",
    "\u00a0,2026-06-01 10:00:00,view,missing_user_id_nbsp,1.0,1.0",
    ",2026-06-01 10:00:00,view,missing_user_id_empty,1.0,1.0",
    "u9,yesterday,view,bad_timestamp_word,1.0,1.0",
    "u9,2026-13-45 99:00:00,view,bad_timestamp_date,1.0,1.0",
    "u9,2026-06-01 10:00:00,teleport,unknown_event_type_x,1.0,1.0",
    "u9,2026-06-01 10:00:00,view,bad_number_word,abc,1.0",
    "u9,2026-06-01 10:00:00,view,negative_value_x,-3,1.0",
    "u9,1999-01-01 00:00:00,view,timestamp_out_of_range_x,1.0,1.0",
]


def messy_events() -> tuple[str, list[str], list[str]]:
    """(file text, good rows, bad rows): good rows of four users, one with Unicode-padded ids, and
    every bad class, including an exact copy of a good row."""
    good = [f"u{user},2026-06-{day + 1:02d} 10:00:00,{'purchase' if day % 2 else 'view'},i{user}{day},{day}.5,1.0"
            for user in range(1, 4) for day in range(4)]
    good += ["\u00a0u4\t,2026-06-05 10:00:00,view,i40,1.0,1.0", "u4,2026-06-06 10:00:00,view,i41,1.0,1.0"]
    duplicate = good[0]
    bad = [*BAD_ROWS, duplicate]
    return HEADER + "\n".join([*good[:5], *bad, *good[5:]]) + "\n", good, bad


def rule_of(marker_row: str) -> str:
    """The rule a bad row's marker names (the duplicate carries a good row's item)."""
    for rule in ("non_finite", "malformed_line", "missing_user_id", "bad_timestamp", "unknown_event_type",
                 "bad_number", "negative_value", "timestamp_out_of_range"):
        if rule in marker_row:
            return rule
    return "duplicate"


@pytest.mark.faults
def test_every_bad_class_is_rejected_with_its_rule_and_every_good_row_kept(spark, tmp_path):
    from lumos.core.tables import TableRef, read_table

    text, good, bad = messy_events()
    (tmp_path / "events.csv").write_text(text)
    recipe = dataclasses.replace(shop_recipe(), cleaning=dataclasses.replace(
        shop_recipe().cleaning, non_negative=("value",), min_timestamp=datetime.datetime(2020, 1, 1)))
    workspace = open_workspace(tmp_path)
    result = run_ingest(spark, workspace, recipe, tmp_path)

    stats = result.stats
    assert stats["rows_read"] == len(good) + len(bad) == stats["events"] + stats["rows_rejected"]
    assert stats["events"] == len(good) and stats["users"] == 4
    expected = {}
    for row in bad:
        expected[rule_of(row)] = expected.get(rule_of(row), 0) + 1
    assert stats["rejected_by_rule"] == expected
    rejects = read_table(spark, workspace, TableRef.parse(result.tables["rejects"])).collect()
    by_marker = {}
    for reject in rejects:
        marker = reject["row"] if reject["rule"] == "malformed_line" else json.loads(reject["row"]).get("item", "")
        by_marker[marker] = reject["rule"]
    assert len(rejects) == len(bad)
    for row in bad:
        marker = row if rule_of(row) == "malformed_line" else row.split(",")[3]
        assert by_marker[marker] == rule_of(row), row
    vocab = read_table(spark, workspace, TableRef.parse(result.tables["vocab"]))
    items = {row["token"] for row in vocab.where("feature = 'item'").collect()}
    assert {row.split(",")[3] for row in good} <= items
    users = read_table(spark, workspace, TableRef.parse(result.tables["sequences"])).select("user_id").distinct()
    assert sorted(row["user_id"] for row in users.collect()) == ["u1", "u2", "u3", "u4"]


KILL_RECIPE = """
dataset = "shop"
[source]
path = "events.csv"
[columns]
user_id = "user"
timestamp = "time"
event_type = "kind"
item_id = "item"
value = "amount"
numeric = ["price"]
[cleaning]
event_types = ["view", "purchase"]
max_reject_fraction = 0.5
[splits]
mode = "leave_last_out"
min_history = 0
"""


def lumos_ingest(project: Path, fault_point: str | None) -> subprocess.CompletedProcess:
    """`lumos ingest` in its own process (and JVM), killed at `fault_point` by the test hook."""
    environment = {key: value for key, value in os.environ.items() if key != FAULT_POINT}
    if fault_point:
        environment[FAULT_POINT] = fault_point
    command = [sys.executable, "-m", "lumos", "--workspace", str(project), "ingest",
               "--recipe", str(project / "ingest.toml"), "--json"]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)


def committed_versions(project: Path) -> dict[str, list[int]]:
    """The versions committed to each ingest table, newest first, from the commit files in its
    _delta_log. (Read from the files: this process's Delta caches what it saw of each table, and
    the tables are written by other processes.)"""
    versions = {}
    for role in ("rejects", "vocab", "sequences"):
        log = project / ".lumos" / "tables" / "shop" / role / "_delta_log"
        versions[role] = sorted((int(commit.stem) for commit in log.glob("*.json")), reverse=True)
    return versions


def assert_every_sequences_version_has_its_vocab(spark, project: Path) -> None:
    from lumos.core.lineage import LineageRecord

    tables = project / ".lumos" / "tables"
    for version in committed_versions(project)["sequences"]:
        commit = (tables / "shop" / "sequences" / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
        info = next(json.loads(line)["commitInfo"] for line in commit if "commitInfo" in line)
        vocab = LineageRecord.from_json(info["userMetadata"]).stats["tables"]["vocab"]  # shop.vocab@N
        vocab_version = int(vocab.split("@")[1])
        rows = spark.read.format("delta").option("versionAsOf", vocab_version).load(str(tables / "shop" / "vocab"))
        assert rows.count() > 0, (version, vocab)


@pytest.mark.faults
@pytest.mark.slow
def test_an_ingest_killed_at_any_point_leaves_no_sequences_without_vocab_and_reruns(spark, tmp_path):
    (tmp_path / "ingest.toml").write_text(KILL_RECIPE)
    (tmp_path / "lumos.toml").write_text('[spark]\nmaster = "local[1]"\nshuffle_partitions = 2\ndriver_memory = "1g"\n')
    text, _, _ = messy_events()
    (tmp_path / "events.csv").write_text(text)
    vocab_folder = tmp_path / ".lumos" / "tables" / "shop" / "vocab"

    killed = lumos_ingest(tmp_path, "after_rejects")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert committed_versions(tmp_path) == {"rejects": [0], "vocab": [], "sequences": []}

    killed = lumos_ingest(tmp_path, "mid_vocab")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # Killed with the vocab's data files down and no commit: Delta shows no version of it.
    assert [path for path in vocab_folder.rglob("*.parquet") if "_delta_log" not in path.parts]
    assert committed_versions(tmp_path) == {"rejects": [1, 0], "vocab": [], "sequences": []}

    killed = lumos_ingest(tmp_path, "before_sequences")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert committed_versions(tmp_path) == {"rejects": [2, 1, 0], "vocab": [0], "sequences": []}

    rerun = lumos_ingest(tmp_path, None)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads(rerun.stdout)
    assert summary["reused"] is False and summary["tables"] == {
        "sequences": "shop.sequences@0", "vocab": "shop.vocab@1", "rejects": "shop.rejects@3"}
    assert_every_sequences_version_has_its_vocab(spark, tmp_path)


def test_rules_and_tokens_counted_in_one_pass_as_counted_apart(spark, tmp_path):
    """Ingest counts its rejects per rule and the vocabulary's tokens in one pass: the same figures
    as count_rejects and build_vocab over the valid events, rejected rows' tokens left out."""
    lines = ["u1,2026-06-01 10:00:00,view,a,1.0,2.0", "u1,2026-06-01 10:00:00,view,a,1.0,2.0",  # a duplicate
             "u2,2026-06-01 11:00:00,view,b,NaN,2.0", "u3,2026-06-01 12:00:00,cancel,c,1.0,2.0",
             ",2026-06-01 13:00:00,view,d,1.0,2.0", "u4,2026-06-01 14:00:00,purchase,a,2.0,1.0"]
    raw = read_file(spark, tmp_path, "events.csv", HEADER + "\n".join(lines) + "\n")
    checked = check_events(raw, shop_recipe())

    counts, tokens = count_rejects_and_tokens(checked, None, shop_recipe())

    assert counts == count_rejects(checked)
    assert counts.rejected == 4
    apart = {(row["feature"], row["token"]): row["count"] for row in build_vocab(valid_events(checked), None, shop_recipe()).collect()}
    together = dict(zip(zip(tokens.column("feature").to_pylist(), tokens.column("token").to_pylist(), strict=True),
                        tokens.column("count").to_pylist(), strict=True))
    assert together == apart
    assert ("item", "c") not in together and ("item", "d") not in together


# -- two ingests of one dataset at once -------------------------------------------------------------


def ingest_project(folder: Path) -> Path:
    (folder / "ingest.toml").write_text(KILL_RECIPE)
    (folder / "lumos.toml").write_text('[spark]\nmaster = "local[1]"\nshuffle_partitions = 2\ndriver_memory = "1g"\n')
    (folder / "events.csv").write_text(messy_events()[0])
    return folder


@pytest.mark.faults
def test_an_ingest_refuses_at_once_while_another_holds_the_dataset(spark, tmp_path):
    """(A dead holder's lock is taken over as infer's is: lumos.core.lock, test_faults_run.)"""
    from lumos.core.config import load_config
    from lumos.core.lock import RunInProgress

    project = ingest_project(tmp_path)
    workspace = open_workspace(project)
    recipe = load_config(IngestRecipe, project / "ingest.toml")
    lock = project / ".lumos" / "locks" / "shop" / "ingest.lock"
    lock.parent.mkdir(parents=True)

    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "token": "x", "lease_seconds": 60}))
    with pytest.raises(RunInProgress, match=r"another lumos ingest is writing dataset shop \(pid 1 on elsewhere") as refused:
        run_ingest(spark, workspace, recipe, project)
    assert "this run wrote nothing" in str(refused.value) and refused.value.exit_code == 1
    assert committed_versions(project) == {"rejects": [], "vocab": [], "sequences": []}


@pytest.mark.faults
@pytest.mark.slow  # two `lumos ingest` processes, a Spark JVM each
def test_two_ingests_of_one_dataset_at_once_write_one_version_of_each_table(spark, tmp_path):
    project = ingest_project(tmp_path)
    command = [sys.executable, "-m", "lumos", "--workspace", str(project), "ingest",
               "--recipe", str(project / "ingest.toml"), "--json"]
    environment = {key: value for key, value in os.environ.items() if key != FAULT_POINT}
    runs = [subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outcomes = [(process.returncode, *output) for process, output in
                ((process, process.communicate(timeout=600)) for process in runs)]
    assert sorted(code for code, _, _ in outcomes) in ([0, 1], [0, 0]), [err[-2000:] for _, _, err in outcomes]
    for code, stdout, stderr in outcomes:
        if code == 1:  # it started while the other held the lock
            assert "another lumos ingest is writing dataset shop" in stderr
        else:  # the winner, or a run that began after the winner's last commit and found its tables
            assert json.loads(stdout)["tables"]["sequences"] == "shop.sequences@0"
    assert committed_versions(project) == {"rejects": [0], "vocab": [0], "sequences": [0]}
    assert_every_sequences_version_has_its_vocab(spark, project)
    assert not (project / ".lumos" / "locks" / "shop" / "ingest.lock").exists()


# -- a damaged Delta log ------------------------------------------------------------------------------


def three_commits_and_a_checkpoint(location: Path) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    for value in range(3):
        write_deltalake(str(location), pa.table({"value": [value]}), mode="append")
    DeltaTable(str(location)).create_checkpoint()  # at version 2


@pytest.mark.faults
@pytest.mark.parametrize(("damaged", "how", "what"), [
    ("00000000000000000001.json", "cut", "not JSON lines"),
    ("00000000000000000001.json", "empty", "empty"),
    ("00000000000000000002.checkpoint.parquet", "cut", "not a whole Parquet file"),
])
def test_a_damaged_delta_log_file_is_named_and_nothing_is_read(tmp_path, damaged, how, what):
    """The training loader's reader (delta-rs) over a log with one file cut short or emptied, as a
    full disk or a bad copy leaves it: a clear error naming the file, never a table missing the rows
    of one commit (delta-rs replays an empty commit as a commit of nothing)."""
    from lumos.core.tables import DamagedDeltaLog
    from lumos.data.delta_snapshot import open_snapshot

    location = tmp_path / "events"
    three_commits_and_a_checkpoint(location)
    log_file = location / "_delta_log" / damaged
    text = log_file.read_bytes()
    if damaged.endswith(".json"):  # replayed only without the checkpoint; version 1 never has one
        (location / "_delta_log" / "00000000000000000002.checkpoint.parquet").unlink()
        (location / "_delta_log" / "_last_checkpoint").unlink()
    log_file.write_bytes(text[: len(text) // 2] if how == "cut" else b"")

    with pytest.raises(DamagedDeltaLog, match=f"{log_file} is {what}") as error:
        open_snapshot(location)
    assert error.value.exit_code == 1
    if damaged.endswith(".parquet"):  # the advice works: without the checkpoint the commits replay
        log_file.unlink()
        (location / "_delta_log" / "_last_checkpoint").unlink()
        assert len(open_snapshot(location).files) == 3
