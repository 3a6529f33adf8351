"""Strict config loading: every problem named by key path and file, at once; overrides by type."""

from __future__ import annotations

import datetime
import tomllib
from dataclasses import dataclass, field

import pytest

from lumos.core.config import (
    config_hash,
    field_docs,
    from_dict,
    load_config,
    require_valid,
    to_plain,
    to_toml,
)
from lumos.core.errors import ConfigError, UsageError
from lumos.core.settings import LumosSettings
from lumos.core.workspace import init_workspace, open_workspace


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    """A rate between 0 and 1."""
    names: tuple[str, ...] = ("a",)

    def __post_init__(self):
        require_valid([("rate", "must be between 0 and 1")] if not 0 <= self.rate <= 1 else [])


@dataclass(frozen=True)
class Outer:
    name: str
    """Required name."""
    count: int = 3
    enabled: bool = False
    when: datetime.date | None = None
    inner: Inner = field(default_factory=Inner)
    extra: dict[str, str] = field(default_factory=dict)


def problems_of(error: ConfigError) -> dict[str, str]:
    return {problem.key: problem.message for problem in error.problems}


def test_valid_config_converts_types():
    config = from_dict(Outer, {"name": "x", "count": 7, "when": "2026-01-02", "inner": {"rate": 1, "names": ["b", "c"]}})
    assert config == Outer(name="x", count=7, when=datetime.date(2026, 1, 2), inner=Inner(rate=1.0, names=("b", "c")))
    assert isinstance(config.inner.rate, float)


def test_every_problem_is_reported_at_once_with_key_paths():
    data = {"cont": 1, "count": "many", "enabled": "yes", "inner": {"rate": 2.0, "nmes": []}}
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, data, source="outer.toml")
    problems = problems_of(caught.value)
    assert problems["cont"] == "unknown key (did you mean 'count'?)"
    assert problems["count"] == "expected an integer, got string 'many'"
    assert problems["enabled"] == "expected true or false, got string 'yes'"
    assert problems["name"] == "required key is missing"
    assert problems["inner.nmes"] == "unknown key (did you mean 'names'?)"
    assert problems["inner.rate"] == "must be between 0 and 1"
    assert str(caught.value).startswith("outer.toml: 6 problems")


def test_cross_field_checks_report_their_key():
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, {"name": "x", "inner": {"rate": 2.0}})
    assert problems_of(caught.value) == {"inner.rate": "must be between 0 and 1"}


def test_booleans_are_not_integers():
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, {"name": "x", "count": True})
    assert "count" in problems_of(caught.value)


def test_overrides_are_parsed_by_field_type():
    config = from_dict(
        Outer,
        {"name": "x"},
        overrides=["count=12", "enabled=true", "inner.names=[\"p\", \"q\"]", "name=has spaces=and equals", "when=2026-03-04"],
    )
    assert config.count == 12 and config.enabled is True
    assert config.inner.names == ("p", "q")
    assert config.name == "has spaces=and equals"
    assert config.when == datetime.date(2026, 3, 4)


def test_bad_overrides_are_named():
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, {"name": "x"}, source="f.toml", overrides=["inner.rat=0.1", "count=lots", "novalue"])
    problems = problems_of(caught.value)
    assert problems["inner.rat"] == "unknown key (did you mean 'rate'?)"
    assert problems["count"] == "expected an integer, got string 'lots'"
    assert "--set novalue" in problems
    assert "f.toml (with --set overrides)" in str(caught.value)


def test_missing_and_malformed_files_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such config file"):
        load_config(Outer, tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(UsageError, match="broken.toml: not valid TOML"):
        load_config(Outer, broken)


def test_toml_round_trip_and_hash_ignore_key_order():
    config = from_dict(Outer, {"name": "x", "extra": {"a.b": "1"}, "when": "2026-01-02"})
    text = to_toml(config, comments=True)
    assert "# Required name." in text and "# A rate between 0 and 1." in text
    assert from_dict(Outer, tomllib.loads(text)) == config
    reordered = from_dict(Outer, {"when": "2026-01-02", "extra": {"a.b": "1"}, "name": "x"})
    assert config_hash(reordered) == config_hash(config)
    assert config_hash(from_dict(Outer, {"name": "y"})) != config_hash(config)


def test_field_docs_come_from_attribute_docstrings():
    assert field_docs(Inner) == {"rate": "A rate between 0 and 1."}


def test_init_writes_defaults_that_load_back(tmp_path, monkeypatch):
    target = init_workspace(tmp_path)
    with pytest.raises(UsageError, match="already exists"):
        init_workspace(tmp_path)
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    workspace = open_workspace()
    assert workspace.config_file == target
    assert workspace.settings == LumosSettings()
    assert workspace.root == str(tmp_path / ".lumos")
    assert workspace.mlflow_tracking_uri == f"sqlite:///{tmp_path}/.lumos/mlflow.db"


def test_workspace_without_config_uses_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workspace = open_workspace(overrides=["spark.master=local[2]"])
    assert workspace.config_file is None
    assert workspace.settings.spark.master == "local[2]"
    assert to_plain(workspace.settings)["workspace"]["root"] == ".lumos"
