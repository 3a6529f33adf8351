"""The recipe's [items] section: its checks, and where its source sits among the lineage inputs."""

from __future__ import annotations

import pytest

from lumos.core.config import from_dict
from lumos.core.errors import ConfigError
from lumos.data.recipe import IngestRecipe

BASE = {
    "dataset": "shop", "source": {"path": "events.csv"}, "cleaning": {"event_types": ["view"]},
    "columns": {"user_id": "user", "timestamp": "time", "event_type": "kind", "item_id": "item"},
}  # fmt: skip


def recipe(**changes) -> IngestRecipe:
    return from_dict(IngestRecipe, {**BASE, **changes})


def test_items_section_is_checked():
    with pytest.raises(ConfigError) as error:
        recipe(items={"path": "items.csv", "categorical": ["id", "genre"], "multi_valued": ["genre"]})
    assert [problem.key for problem in error.value.problems] == ["items", "items"]
    assert "lists a column twice" in str(error.value) and "clash with item_id" in str(error.value)
    with pytest.raises(ConfigError, match="needs columns.item_id"):
        from_dict(IngestRecipe, {**BASE, "columns": {**BASE["columns"], "item_id": None}, "targets": {"next_item": False},
                                 "items": {"path": "items.csv"}})
    with pytest.raises(ConfigError, match="separator"):
        recipe(items={"path": "items.csv", "multi_valued": ["genres"], "separator": ""})
    with pytest.raises(ConfigError, match="letters, digits and _"):
        recipe(items={"path": "items.csv", "numeric": ["list price"]})


def test_items_are_the_last_lineage_input():
    plain = recipe()
    assert plain.source_sections() == [("events", "source")]
    full = recipe(users={"path": "users.csv"}, items={"path": "items.csv", "multi_valued": ["genres"], "separator": " "})
    assert full.source_sections() == [("events", "source"), ("users", "users"), ("items", "items")]
    assert full.items.attributes == ("genres",)
