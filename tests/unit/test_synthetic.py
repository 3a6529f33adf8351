"""Synthetic quickstart data: files and schemas, determinism, sizes, and learnable structure.

The structure checks compare against what chance would give, so they fail if a signal the models
are meant to learn (sequence, funnel, calendar, churn, static attributes) goes missing.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import InvalidFields
from lumos.data.synthetic import EVENTS_SCHEMA, SyntheticSpec, generate_quickstart

SMALL = SyntheticSpec(users=200, events=10_000, items=120, clusters=6, days=60)
# Calendar and population effects need more days and users than SMALL to stand above noise.
MEDIUM = SyntheticSpec(users=2000, events=60_000, items=200, clusters=8, seed=3)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    generate_quickstart(out, SMALL)
    return out


@pytest.fixture(scope="module")
def events(small_dir: Path) -> pd.DataFrame:
    return read_events(small_dir)


@pytest.fixture(scope="module")
def medium_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic_medium")
    generate_quickstart(out, MEDIUM)
    return out


@pytest.fixture(scope="module")
def medium_events(medium_dir: Path) -> pd.DataFrame:
    return read_events(medium_dir)


def read_events(out: Path) -> pd.DataFrame:
    return pq.read_table(out / "events").to_pandas()


def read_calendar(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "calendar.csv", parse_dates=["date"])


def digests(out: Path) -> dict[str, str]:
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def views_with_next(events: pd.DataFrame) -> pd.DataFrame:
    """View events (each starts on a new item) with the same user's next view beside them."""
    views = events[events.event_type == "view"].copy()
    by_user = views.groupby("user_id", sort=False)
    views["next_item"] = by_user.item_id.shift(-1)
    views["next_category"] = by_user.category.shift(-1)
    return views.dropna(subset=["next_item"])


def bigram_accuracy(pairs: pd.DataFrame) -> float:
    """In-sample accuracy of predicting the most frequent next item of each item."""
    counts = pairs.groupby(["item_id", "next_item"]).size()
    return counts.groupby(level=0).max().sum() / len(pairs)


# ---------------------------------------------------------------------------------------------
# Files and schemas


def test_writes_every_file_with_its_schema(small_dir: Path) -> None:
    for name in ("users.parquet", "items.parquet", "labels.parquet", "calendar.csv"):
        assert (small_dir / name).is_file(), name
    assert [path.name for path in (small_dir / "events").iterdir()] == ["part-00000.parquet"]
    assert pq.read_schema(small_dir / "events" / "part-00000.parquet").equals(EVENTS_SCHEMA)
    users = pq.read_table(small_dir / "users.parquet")
    assert users.schema.names == ["user_id", "country", "age_bucket", "tenure_days"]
    assert users.schema.field("tenure_days").type == pa.int64()
    items = pq.read_table(small_dir / "items.parquet")
    assert items.schema.names == ["item_id", "category", "price"]
    assert items.schema.field("price").type == pa.float64()
    labels = pq.read_table(small_dir / "labels.parquet")
    assert labels.schema.names == ["user_id", "segment", "churned"]
    assert labels.schema.field("churned").type == pa.bool_()
    assert users.num_rows == labels.num_rows == SMALL.users
    assert items.num_rows == SMALL.items
    assert not [path for path in small_dir.rglob(".*")], "temporary files were left behind"


def test_values_have_the_documented_shapes(small_dir: Path, events: pd.DataFrame) -> None:
    assert events.user_id.str.fullmatch(r"u\d{7}").all()
    assert events.item_id.str.fullmatch(r"i\d{5}").all()
    assert set(events.event_type) == {"view", "click", "add_to_cart", "purchase"}
    assert set(events.device) == {"ios", "android", "web"}
    start = pd.Timestamp(SMALL.start)
    assert events.ts.min() >= start
    assert events.ts.max() < start + pd.Timedelta(days=SMALL.days + 1)
    # The category column is the item's own category from items.parquet.
    items = pq.read_table(small_dir / "items.parquet").to_pandas()
    joined = events.merge(items, on="item_id", suffixes=("", "_of_item"))
    assert len(joined) == len(events)
    assert (joined.category == joined.category_of_item).all()
    assert (items.price > 0).all()
    users = pq.read_table(small_dir / "users.parquet").to_pandas()
    assert set(events.user_id) == set(users.user_id)
    assert users.age_bucket.isin(["18-24", "25-34", "35-44", "45-54", "55+"]).all()
    assert (users.tenure_days > 0).all()


def test_calendar_covers_data_and_sixty_days_beyond(small_dir: Path) -> None:
    calendar = read_calendar(small_dir)
    assert list(calendar.columns) == ["date", "holiday", "sale"]
    assert len(calendar) == SMALL.days + 60
    expected = pd.date_range(SMALL.start, periods=SMALL.days + 60, freq="D")
    assert (calendar.date.to_numpy() == expected.to_numpy()).all()
    assert set(calendar.holiday) <= {0, 1} and set(calendar.sale) <= {0, 1}
    assert 3 <= calendar.holiday.sum() <= 12
    in_data = calendar.date < pd.Timestamp(SMALL.start) + pd.Timedelta(days=SMALL.days)
    assert calendar.sale[in_data].sum() >= 2, "the data period needs sale days"
    # Sales last several days: there are fewer sale starts than sale days.
    sale_starts = ((calendar.sale == 1) & (calendar.sale.shift(fill_value=0) == 0)).sum()
    assert sale_starts < calendar.sale.sum()


def test_summary_names_what_was_written(tmp_path: Path) -> None:
    summary = generate_quickstart(tmp_path, SyntheticSpec(users=30, events=600, days=28))
    assert summary.out_dir == str(tmp_path)
    assert (summary.users, summary.events, summary.items) == (30, 600, 500)
    assert sorted(summary.files) == sorted(str(path) for path in tmp_path.rglob("*.*"))


# ---------------------------------------------------------------------------------------------
# Determinism and sizes


def test_same_spec_gives_identical_bytes(tmp_path: Path, small_dir: Path) -> None:
    generate_quickstart(tmp_path, SMALL)
    assert digests(tmp_path) == digests(small_dir)


def test_another_seed_gives_other_data(tmp_path: Path, events: pd.DataFrame) -> None:
    generate_quickstart(tmp_path, SyntheticSpec(**{**SMALL.__dict__, "seed": 1}))
    other = read_events(tmp_path)
    assert not (len(other) == len(events) and (other.item_id == events.item_id).all())


@pytest.mark.parametrize("users, events", [(200, 10_000), (37, 1_783), (500, 500)])
def test_event_count_is_as_requested(tmp_path: Path, users: int, events: int) -> None:
    summary = generate_quickstart(tmp_path, SyntheticSpec(users=users, events=events, days=30))
    written = len(read_events(tmp_path))
    assert written == summary.events
    assert abs(written - events) <= 0.05 * events


def test_small_blocks_write_several_parts_and_replace_old_ones(tmp_path: Path, events: pd.DataFrame) -> None:
    generate_quickstart(tmp_path, SyntheticSpec(**{**SMALL.__dict__, "users_per_file": 64}))
    parts = sorted(path.name for path in (tmp_path / "events").iterdir())
    assert parts == [f"part-{block:05d}.parquet" for block in range(4)]
    tables = [pq.read_table(tmp_path / "events" / name) for name in parts]
    assert [len(set(table.column("user_id").to_pylist())) for table in tables] == [64, 64, 64, 8]
    assert sum(table.num_rows for table in tables) == SMALL.events
    # Rerunning with bigger blocks in the same folder leaves no stale part behind.
    generate_quickstart(tmp_path, SMALL)
    assert [path.name for path in (tmp_path / "events").iterdir()] == ["part-00000.parquet"]


def test_rows_are_unique_and_time_ordered_per_user(events: pd.DataFrame) -> None:
    assert not events.duplicated().any()
    assert events.user_id.is_monotonic_increasing
    assert (events.groupby("user_id").ts.diff().dropna() > pd.Timedelta(0)).all()


# ---------------------------------------------------------------------------------------------
# Learnable structure


def test_consecutive_views_stay_in_a_category_far_above_chance(events: pd.DataFrame) -> None:
    pairs = views_with_next(events)
    same_category = (pairs.category == pairs.next_category).mean()
    shares = events.category.value_counts(normalize=True)
    chance = float((shares**2).sum())  # two independent draws from the category mix
    assert same_category > 0.6
    assert same_category > 2.5 * chance


def test_order_matters_for_the_next_item(events: pd.DataFrame) -> None:
    pairs = views_with_next(events)
    # The same views in a random order within each user: tastes kept, sequence destroyed.
    rng = np.random.default_rng(0)
    shuffled = events[events.event_type == "view"].copy()
    shuffled["key"] = rng.random(len(shuffled))
    shuffled = shuffled.sort_values(["user_id", "key"], kind="stable")
    shuffled_pairs = views_with_next(shuffled)
    popularity = pairs.next_item.value_counts(normalize=True).iloc[0]
    assert bigram_accuracy(pairs) > 2 * bigram_accuracy(shuffled_pairs)
    assert bigram_accuracy(pairs) > 5 * popularity


def test_funnel_narrows_and_steps_follow_each_other(events: pd.DataFrame) -> None:
    counts = events.event_type.value_counts()
    assert counts["view"] > counts["click"] > counts["add_to_cart"] > counts["purchase"] > 0
    previous = events.groupby("user_id").shift(1)
    for step, before in [("click", "view"), ("add_to_cart", "click"), ("purchase", "add_to_cart")]:
        rows = events.event_type == step
        assert (previous.event_type[rows] == before).all(), step
        assert (previous.item_id[rows] == events.item_id[rows]).all(), step


def test_only_purchases_have_values(events: pd.DataFrame) -> None:
    purchases = events.event_type == "purchase"
    assert events.value[purchases].notna().all()
    assert (events.value[purchases] > 0).all()
    assert events.value[~purchases].isna().all()


def test_sale_days_bring_more_activity_and_purchases(medium_dir: Path, medium_events: pd.DataFrame) -> None:
    events = medium_events.assign(date=medium_events.ts.dt.floor("D"))
    days = events.merge(read_calendar(medium_dir), on="date")
    by_sale = days.groupby("sale").agg(
        events=("ts", "size"),
        dates=("date", "nunique"),
        purchase_rate=("event_type", lambda types: (types == "purchase").mean()),
    )
    per_day = by_sale.events / by_sale.dates
    assert per_day[1] > 1.2 * per_day[0]
    assert by_sale.purchase_rate[1] > 1.25 * by_sale.purchase_rate[0]


def test_weekends_and_evenings_are_busier(medium_events: pd.DataFrame) -> None:
    per_day = medium_events.groupby(medium_events.ts.dt.floor("D")).size()
    weekend = per_day.index.dayofweek >= 5
    assert per_day[weekend].mean() > 1.15 * per_day[~weekend].mean()
    hours = medium_events.ts.dt.hour.value_counts().sort_index()
    assert hours.loc[18:22].sum() > 3 * hours.loc[1:5].sum()


def test_each_user_mostly_uses_one_device(events: pd.DataFrame) -> None:
    main_share = events.groupby("user_id").device.agg(lambda d: d.value_counts(normalize=True).iloc[0])
    assert main_share.mean() > 0.8


def test_churned_users_are_silent_at_the_end(small_dir: Path, events: pd.DataFrame) -> None:
    labels = pq.read_table(small_dir / "labels.parquet").to_pandas()
    assert labels.churned.sum() == round(SMALL.churn_fraction * SMALL.users)
    last_two_weeks = pd.Timestamp(SMALL.start) + pd.Timedelta(days=SMALL.days - 14)
    recent = set(events.user_id[events.ts >= last_two_weeks])
    labels["recent"] = labels.user_id.isin(recent)
    assert not labels.recent[labels.churned].any()
    assert labels.recent[~labels.churned].mean() > 0.5
    # Churners stop somewhere in the second half, not at the very start.
    halfway = pd.Timestamp(SMALL.start) + pd.Timedelta(days=SMALL.days // 2)
    churners = set(labels.user_id[labels.churned])
    assert events.user_id[events.ts >= halfway].isin(churners).any()


def test_activity_is_heavy_tailed(events: pd.DataFrame) -> None:
    per_user = events.groupby("user_id").size()
    assert per_user.min() < 0.25 * per_user.mean()
    assert per_user.max() > 4 * per_user.mean()


def test_static_attributes_and_labels_match_behaviour(medium_dir: Path, medium_events: pd.DataFrame) -> None:
    events = medium_events
    users = pq.read_table(medium_dir / "users.parquet").to_pandas()
    labels = pq.read_table(medium_dir / "labels.parquet").to_pandas()
    # The segment label is usually the category a user views most.
    top_category = events.groupby("user_id").category.agg(lambda c: c.value_counts().index[0])
    agree = (labels.set_index("user_id").segment == top_category).mean()
    assert agree > 0.7
    # Age shifts taste: each bucket's commonest segment is far above a uniform share.
    table = pd.crosstab(users.age_bucket, labels.segment, normalize="index")
    assert (table.max(axis=1) > 2.0 / MEDIUM.clusters).all()
    # Country shifts activity (medians: activity is heavy-tailed) and spend.
    per_user = events.groupby("user_id").agg(events=("ts", "size"), spend=("value", "sum"))
    per_country = per_user.join(users.set_index("user_id")).groupby("country")
    assert per_country.events.median()["US"] > 1.25 * per_country.events.median()["IN"]
    assert per_country.spend.mean()["US"] > 1.5 * per_country.spend.mean()["IN"]


# ---------------------------------------------------------------------------------------------
# Spec and command line


def test_spec_reports_every_bad_field_at_once() -> None:
    with pytest.raises(InvalidFields) as raised:
        SyntheticSpec(users=10, events=5, churn_fraction=1.5, days=7, users_per_file=0)
    fields = {field for field, _ in raised.value.problems}
    assert fields == {"events", "churn_fraction", "days", "users_per_file"}


def test_data_synth_writes_and_prints_one_line(tmp_path: Path) -> None:
    argv = ["data", "synth", "--out", str(tmp_path), "--users", "40", "--events", "2000", "--seed", "5"]
    result = CliRunner().invoke(app, argv + ["--start", "2026-01-05", "--days", "30"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "2,000 events" in lines[0] and str(tmp_path) in lines[0]
    calendar = read_calendar(tmp_path)
    assert calendar.date.iloc[0] == pd.Timestamp(datetime.date(2026, 1, 5))


def test_data_synth_rejects_a_bad_spec_as_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["data", "synth", "--out", str(tmp_path), "--users", "10", "--events", "3"])
    assert result.exit_code == 2 and "events" in result.output
    assert not (tmp_path / "events").exists()  # nothing written
