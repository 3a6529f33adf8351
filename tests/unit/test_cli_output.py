"""`--json` output: core result dataclasses become JSON objects keyed by their field names."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field

from lumos.cli.output import emit_json, json_data, renamed


@dataclass
class Inner:
    kind: str
    version: int


@dataclass
class Outer:
    name: str
    as_of: datetime.date
    inputs: list[Inner] = field(default_factory=list)
    pairs: tuple[tuple[str, int], ...] = ()
    extra: dict[str, Inner] = field(default_factory=dict)


def test_nested_dataclasses_become_plain_json(capsys):
    result = Outer("m", datetime.date(2026, 8, 2), [Inner("delta", 3)], (("a", 1),), {"x": Inner("files", 0)})
    assert json_data(result) == {
        "name": "m", "as_of": datetime.date(2026, 8, 2), "inputs": [{"kind": "delta", "version": 3}],
        "pairs": [["a", 1]], "extra": {"x": {"kind": "files", "version": 0}},
    }
    emit_json(renamed(json_data(result), name="model"))
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"] == "m" and "name" not in printed and printed["as_of"] == "2026-08-02"
