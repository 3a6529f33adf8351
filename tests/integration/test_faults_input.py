"""Input that must never poison or vanish: every bad row lands in rejects with its own rule.

Each test reads real files through the real Spark reader and the recipe's validation, as an
ingest does; the fault-injection cases (marked `faults`) also kill real `lumos ingest` processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lumos.core.config import from_dict
from lumos.core.workspace import open_workspace
from lumos.data.recipe import IngestRecipe
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
