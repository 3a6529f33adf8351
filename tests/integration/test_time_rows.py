"""The Arrow builder of time-split rows (`lumos.data.time_rows`) against the Spark SQL one.

`test_sequences.py` checks time splits value by value on hand-made users; here both builders run
on a seeded random log made to be awkward (ties on every key, null items, values and categories,
one user far longer than an Arrow batch, events before 1970, cutoffs before and after everything,
users missing from the users table) and must write the same rows, bit for bit.
"""

from __future__ import annotations

import datetime
import random

import pytest

from lumos.core.config import from_dict
from lumos.core.tables import content_hash
from lumos.data.recipe import IngestRecipe
from lumos.data.sequence_files import write_sequence_files
from lumos.data.sequences import build_sequences, build_vocab

DAY0 = datetime.datetime(2026, 3, 2, tzinfo=datetime.UTC)
USERS_SCHEMA = "user_id string, user_country string, user_age double"
SCHEMA = "user_id string, ts timestamp, event_type string, item_id string, value double, cat_channel string, num_price double"


def random_events(seed: int) -> list[tuple]:
    rng = random.Random(seed)
    rows = []
    for user in range(40):
        count = 300 if user == 0 else rng.randrange(0, 25)  # user 0 spans many Arrow batches
        for _ in range(count):
            # Half-hour steps over 12 days (many ties on ts, several tokens a day), some moved by
            # 1, 3, 7 or 15 minutes: gaps on both sides of a gap bucket's edge.
            minutes = 30 * rng.randrange(0, 12 * 48) + rng.choice([0, 0, 0, 1, 3, 7, 15])
            ts = DAY0 + datetime.timedelta(minutes=minutes)
            if user == 1:
                ts = datetime.datetime(1969, 12, 31, 23, tzinfo=datetime.UTC) + datetime.timedelta(minutes=rng.randrange(0, 240))
            rows.append((
                f"u{user}", ts, rng.choice(["view", "cart", "purchase"]), rng.choice(["A", "B", "C", "D", None]),
                rng.choice([None, 1.0, 2.5, 0.1, 1e-3]), rng.choice(["web", "app", None]), rng.choice([None, 3.0, 0.2]),
            ))  # fmt: skip
    return rows


def random_users(seed: int) -> list[tuple]:
    """Users u0 … u29 (u30 … u39 have events and no row), and u99 with a row and no events."""
    rng = random.Random(seed)
    return [(f"u{user}", rng.choice(["FR", "DE", "IT", None]), rng.choice([None, 20.0, 33.5]))
            for user in [*range(30), 99]]


def recipe(unit: str, horizons: list[int], min_history: int, max_len: int, calendar: bool = False) -> IngestRecipe:
    cutoffs = [DAY0.date() + datetime.timedelta(days=days) for days in (-1, 2, 5, 9, 13)]
    cutoffs.insert(0, datetime.date(1970, 1, 1))
    return from_dict(IngestRecipe, {
        "dataset": "shop",
        "source": {"path": "events.parquet"},
        "columns": {"user_id": "uid", "timestamp": "time", "event_type": "kind", "item_id": "sku",
                    "value": "amount", "categorical": ["channel"], "numeric": ["price"]},
        "cleaning": {"event_types": ["view", "cart", "purchase"]},
        "users": {"path": "users.parquet", "categorical": ["country"], "numeric": ["age"]},
        "vocab": {"min_count": 2},
        "tokens": {"unit": unit, "max_len": max_len, "tie_seed": 3},
        "splits": {"mode": "time", "min_history": min_history,
                   "cutoffs": [{"split": "train" if i < 4 else "test", "as_of": day} for i, day in enumerate(cutoffs)]},
        "targets": {"next_item": True, "horizons_days": horizons, "act_event_types": ["purchase"] if horizons else []},
        **({"calendar": {"path": "calendar.csv", "flags": ["holiday", "sale"]}} if calendar else {}),
    })  # fmt: skip


@pytest.fixture(scope="module")
def events(spark):
    """Partitioned by user and cached, as validation leaves the events: the builder's sort then
    reuses that partitioning instead of shuffling again."""
    frame = spark.createDataFrame(random_events(0), SCHEMA).repartition("user_id").persist()
    yield frame
    frame.unpersist()


@pytest.fixture(scope="module")
def users(spark):
    return spark.createDataFrame(random_users(0), USERS_SCHEMA)


@pytest.fixture
def small_arrow_batches(spark):
    """Batches of 16 rows, so that users straddle batches (user 0 spans about 19)."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "16")
    yield
    spark.conf.set(key, before)


@pytest.mark.parametrize(
    ("unit", "horizons", "min_history", "max_len", "targets"),
    [
        ("event", [1, 3], 1, 5, True),
        ("event", [2], 0, 40, False),
        ("day", [1, 3], 2, 3, True),
        ("day", [], 1, 4, True),
    ],
)
def test_arrow_rows_equal_spark_rows(spark, events, users, small_arrow_batches, unit, horizons, min_history, max_len,
                                     targets):
    config = recipe(unit, horizons, min_history, max_len)
    vocab = build_vocab(events, users, config)
    arrow = build_sequences(events, vocab, users, None, config, targets=targets)
    reference = build_sequences(events, vocab, users, None, config, targets=targets, builder="spark")

    assert arrow.dtypes == reference.dtypes
    arrow_rows, reference_rows = _rows(arrow), _rows(reference)
    assert len(arrow_rows) == len(reference_rows) > 60
    assert {row["split"] for row in arrow_rows.values()} == {"train", "test"}
    assert any(row["length"] == max_len for row in arrow_rows.values())  # some histories are cut short
    assert {row["user_country"] for row in arrow_rows.values()} > {1}  # known countries, and OOV
    for key, row in reference_rows.items():
        assert arrow_rows[key] == row, key  # every value exactly, floats included


@pytest.mark.parametrize(("unit", "horizons", "calendar"), [("event", [1, 3], True), ("day", [], True), ("event", [2], False)])
def test_rows_written_by_the_builders_equal_the_built_rows(spark, tmp_path, events, users, small_arrow_batches, unit,
                                                           horizons, calendar):
    """What ingest writes in a local workspace (Parquet files from the Python workers) against
    `build_sequences`' rows: the same schema, rows, values and content hash."""
    config = recipe(unit, horizons, 1, 5, calendar=calendar)
    vocab = build_vocab(events, users, config)
    days = spark.createDataFrame(
        [(DAY0.date() + datetime.timedelta(days=days), days % 2, int(days % 3 == 0)) for days in range(-3, 12)],
        "date date, holiday int, sale int") if calendar else None  # the last cutoff's slots run past its end
    built = build_sequences(events, vocab, users, days, config)
    files = write_sequence_files(events, vocab, users, days, config, str(tmp_path / "sequences"))

    written = spark.read.schema(files.schema).parquet(*[str(files.folder / file.name) for file in files.files])
    assert files.schema == built.schema and written.dtypes == built.dtypes  # (a file read makes every column nullable)
    assert files.files and all((tmp_path / "sequences" / file.name).stat().st_size == file.size for file in files.files)
    written_rows, built_rows = _rows(written), _rows(built)
    assert len(written_rows) == len(built_rows) > 60
    assert written_rows == built_rows  # every value exactly, floats and future flags included
    if calendar:
        assert any(any(row["future_holiday"]) for row in written_rows.values())
    # The writers' own counts and hash: what ingest records without reading the files back.
    assert files.content_hash == content_hash(built, "arrow-sum") == content_hash(written, "arrow-sum")
    assert {split: part.rows for split, part in files.splits.items()} == {
        row["split"]: row["count"] for row in built.groupBy("split").count().collect()}
    assert sum(part.tokens for part in files.splits.values()) == built.selectExpr("sum(length)").first()[0]
    assert files.users == events.select("user_id").distinct().count()
    files.discard()
    assert not list((tmp_path / "sequences").iterdir())


def test_users_without_rows_are_counted_and_write_no_file(spark, tmp_path, events, users, small_arrow_batches):
    """Users whose every event follows the last cutoff have no rows: no file is written for them,
    and they still count as users with events (what ingest records)."""
    config = recipe("event", [1], 1, 5)
    late = DAY0 + datetime.timedelta(days=30)
    rows = [(f"late{user}", late + datetime.timedelta(minutes=minute), "view", "A", 1.0, "web", 1.0)
            for user in range(7) for minute in range(user + 1)]
    late_events = spark.createDataFrame(rows, SCHEMA).repartition("user_id")
    files = write_sequence_files(late_events, build_vocab(events, users, config), users, None, config,
                                 str(tmp_path / "sequences"))
    assert files.files == [] and files.splits == {} and files.users == 7
    assert files.content_hash == "arrow-sum:0000000000000000:0"


def _rows(frame) -> dict:
    return {(row.user_id, row.split, row.as_of): row.asDict() for row in frame.collect()}
