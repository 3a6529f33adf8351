"""The recipe's items table (`[items]`): attributes joined to the events as history-token features.

Three users, ten views of items a, b, c and z; the items table lists a, b, c and d (no event), not
z. Hand-worked vocabularies, counted over the events: item_genres "Action|Comedy" 5 (a 3, b 2:
b's messy "Comedy | Action|" is the same set), "Drama" 3; item_year "1995" 6, "1990" 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.items import multi_valued_token
from lumos.data.sequences_version import open_sequences

runner = CliRunner()

EVENTS = """user,time,kind,item
u1,2026-06-01 10:00:00,view,a
u1,2026-06-01 11:00:00,view,b
u1,2026-06-01 12:00:00,view,z
u1,2026-06-01 13:00:00,view,c
u2,2026-06-01 10:00:00,view,c
u2,2026-06-01 11:00:00,view,a
u2,2026-06-01 12:00:00,view,z
u3,2026-06-01 10:00:00,view,b
u3,2026-06-01 11:00:00,view,a
u3,2026-06-01 12:00:00,view,c
"""

ITEMS = """item,genres,year,rank
a,Comedy|Action,1995,1.5
b,Comedy | Action|,1990,
c,Drama,1995,3
d,,2000,4
"""

RECIPE = """
dataset = "shop"
[source]
path = "events.csv"
[columns]
user_id = "user"
timestamp = "time"
event_type = "kind"
item_id = "item"
[cleaning]
event_types = ["view"]
[items]
path = "items.csv"
item_id = "item"
categorical = ["year"]
multi_valued = ["genres"]
numeric = ["rank"]
[tokens]
max_len = 10
age_days = false
[splits]
mode = "leave_last_out"
min_history = 0
[targets]
next_item = true
horizons_days = []
"""

OOV = 1
ACTION_COMEDY, DRAMA = 2, 3
Y1995, Y1990 = 2, 3


def lumos(*args: str):
    return runner.invoke(app, list(args))


def project(folder: Path, items: str = ITEMS, recipe: str = RECIPE) -> Path:
    (folder / "events.csv").write_text(EVENTS)
    (folder / "items.csv").write_text(items)
    (folder / "ingest.toml").write_text(recipe)
    return folder / "ingest.toml"


def ingest(folder: Path, *overrides: str):
    sets = [part for override in overrides for part in ("--set", override)]
    return lumos("--workspace", str(folder), "ingest", "--recipe", str(folder / "ingest.toml"), *sets, "--json")


def test_items_join_keeps_every_event_counts_the_missing_and_has_its_own_vocabularies(spark, tmp_path):
    project(tmp_path)
    result = ingest(tmp_path)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    stats = summary["stats"]
    assert stats["events"] == 10 and stats["rows_rejected"] == 0  # nothing dropped: z's two views stay
    assert stats["events_item_missing"] == 2

    vocab = spark.read.format("delta").load(str(tmp_path / ".lumos" / "tables" / "shop" / "vocab")).collect()
    attributes = {(row["feature"], row["token"]): (row["id"], row["count"]) for row in vocab
                  if row["feature"].startswith("item_")}
    assert attributes == {
        ("item_genres", "Action|Comedy"): (ACTION_COMEDY, 5), ("item_genres", "Drama"): (DRAMA, 3),
        ("item_year", "1995"): (Y1995, 6), ("item_year", "1990"): (Y1990, 2),
    }

    rows = spark.read.format("delta").load(str(tmp_path / ".lumos" / "tables" / "shop" / "sequences"))
    test = {row["user_id"]: row for row in rows.where("split = 'test'").collect()}
    # u1's history a, b, z (target c): z is not in the items table, b has no rank.
    assert test["u1"]["item_genres"] == [ACTION_COMEDY, ACTION_COMEDY, OOV]
    assert test["u1"]["item_year"] == [Y1995, Y1990, OOV]
    assert test["u1"]["item_rank"] == [1.5, 0.0, 0.0]
    assert test["u2"]["item_genres"] == [DRAMA, ACTION_COMEDY]

    # Space-separated lists (MovieLens' genres) parse the same way.
    lists = spark.createDataFrame([(" Drama  Comedy",), ("Comedy Drama Comedy",), (" ",), (None,)], "genres string")
    assert [row[0] for row in lists.select(multi_valued_token(lists["genres"], " ")).collect()] == [
        "Comedy Drama", "Comedy Drama", None, None]

    # The attributes reach the model as token features; the items file is a fingerprinted input.
    version = open_sequences(open_workspace(tmp_path), TableRef.parse(summary["tables"]["sequences"]))
    assert version.spec.token_categorical["item_genres"] == 4 and version.spec.token_categorical["item_year"] == 4
    assert "item_rank" in version.spec.token_numeric
    history = json.loads(lumos("--workspace", str(tmp_path), "data", "history", "shop.sequences", "--json").stdout)
    inputs = history["versions"][0]["lineage"]["inputs"]
    assert [Path(item["uri"]).name for item in inputs] == ["events.csv", "items.csv"]
    assert inputs[1]["version"].startswith("sha256:")
    assert json.loads(ingest(tmp_path).stdout)["reused"] is True
    (tmp_path / "items.csv").write_text(ITEMS.replace("c,Drama,1995", "c,Drama,1996"))
    changed = json.loads(ingest(tmp_path).stdout)
    assert changed["reused"] is False and changed["tables"]["sequences"] == "shop.sequences@1"

    # Time splits are built by the Arrow row builder: the same ids, and day tokens carry the day's
    # last event's attributes (u1's day ends with c, u2's with z).
    by_time = ingest(tmp_path, "splits.mode=time", 'splits.cutoffs=[{split = "test", as_of = 2026-06-02}]',
                     "splits.min_history=1", "tokens.unit=day")
    assert by_time.exit_code == 0, by_time.output
    rows = spark.read.format("delta").load(str(tmp_path / ".lumos" / "tables" / "shop" / "sequences"))
    days = {row["user_id"]: row for row in rows.collect()}
    assert days["u1"]["item_genres"] == [DRAMA] and days["u1"]["item_rank"] == [3.0]
    assert days["u2"]["item_genres"] == [OOV] and days["u2"]["item_year"] == [OOV]


def test_bad_items_tables_fail_with_exit_2_and_write_nothing(tmp_path):
    cases = {
        "absent": (ITEMS, RECIPE.replace('path = "items.csv"', 'path = "data/catalog.csv"'),
                   "items.path = 'data/catalog.csv'"),
        "column": (ITEMS, RECIPE.replace('numeric = ["rank"]', 'numeric = ["price"]'),
                   "no column 'price' (named in items)"),
        "duplicate": (ITEMS + "a,Drama,1980,2\n", RECIPE, "item ids appear more than once (e.g. a)"),
    }
    for name, (items, recipe, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        project(folder, items, recipe)
        result = lumos("--workspace", str(folder), "ingest", "--recipe", str(folder / "ingest.toml"))
        assert result.exit_code == 2, (name, result.output)
        assert message in result.stderr, (name, result.stderr)
        assert not (folder / ".lumos" / "tables" / "shop").exists(), name
