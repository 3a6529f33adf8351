"""The static tables (users, items, the hidden-truth labels), the calendar file, and the ids
every table shares."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa

from lumos.data.synthetic.spec import SyntheticSpec
from lumos.data.synthetic.world import AGE_BUCKETS, COUNTRIES, Calendar, World


def user_ids(spec: SyntheticSpec, users: slice = slice(None)) -> pa.Array:
    width = max(7, len(str(spec.users - 1)))
    return pa.array([f"u{number:0{width}d}" for number in range(spec.users)[users]], pa.string())


def item_ids(spec: SyntheticSpec) -> pa.Array:
    width = max(5, len(str(spec.items - 1)))
    return pa.array([f"i{number:0{width}d}" for number in range(spec.items)], pa.string())


def categories(spec: SyntheticSpec) -> pa.Array:
    return pa.array([f"c{category}" for category in range(spec.clusters)], pa.string())


def take(labels: pa.Array, codes: np.ndarray) -> pa.Array:
    """Plain strings from codes (not a dictionary column, so every reader sees `string`)."""
    return labels.take(pa.array(codes, type=pa.int64()))


def static_tables(spec: SyntheticSpec, world: World) -> dict[str, pa.Table]:
    """users.parquet, items.parquet and labels.parquet (the hidden truths), by file name."""
    people, catalog = world.population, world.catalog
    users = {
        "user_id": user_ids(spec),
        "country": take(pa.array(COUNTRIES), people.country),
        "age_bucket": take(pa.array(AGE_BUCKETS), people.age),
        "tenure_days": pa.array(people.tenure_days, pa.int64()),
    }
    items = {
        "item_id": item_ids(spec),
        "category": take(categories(spec), catalog.category),
        "price": pa.array(catalog.price, pa.float64()),
    }
    labels = {
        "user_id": user_ids(spec),
        "segment": take(categories(spec), people.segment),
        "churned": pa.array(people.churned, pa.bool_()),
    }
    return {
        "users.parquet": pa.table(users),
        "items.parquet": pa.table(items),
        "labels.parquet": pa.table(labels),
    }


def calendar_csv(spec: SyntheticSpec, calendar: Calendar) -> str:
    lines = ["date,holiday,sale"]
    for offset, (holiday, sale) in enumerate(zip(calendar.holiday, calendar.sale, strict=True)):
        day = spec.start + datetime.timedelta(days=offset)
        lines.append(f"{day.isoformat()},{holiday},{sale}")
    return "\n".join(lines) + "\n"
