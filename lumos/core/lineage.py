"""Lineage records: what every stage writes beside its output so any result can be traced back.

A record names the stage, the code, the fully resolved config and its hash, the exact input
versions and summary stats. It goes into a Delta commit's `userMetadata` or onto MLflow runs.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import subprocess
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lumos


@dataclass(frozen=True)
class LineageInput:
    kind: str
    """delta (a table version), files (a fingerprint of files), mlflow-run, model-version."""
    uri: str
    """Where the input lives: a table path, a file or folder, a run or model URI."""
    version: int | str | None = None
    """The exact version read: a Delta version, a content fingerprint, a model version."""


@dataclass(frozen=True)
class LineageRecord:
    stage: str
    config: dict[str, Any]
    config_hash: str
    inputs: list[LineageInput]
    stats: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    lumos_version: str = lumos.__version__
    code_version: str = field(default_factory=lambda: code_version())
    created_at: str = field(default_factory=lambda: utc_now())
    record_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique per record, so a writer can find its own commit among concurrent ones."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, text: str) -> LineageRecord:
        data = json.loads(text)
        data["inputs"] = [LineageInput(**item) for item in data.get("inputs", [])]
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})

    def same_work(self, other: LineageRecord) -> bool:
        """True when both records describe the same stage over the same config and input versions."""
        return (self.stage, self.config_hash, self.inputs) == (other.stage, other.config_hash, other.inputs)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.cache
def code_version() -> str:
    """The git commit of the Lumos source when run from a checkout, else its package version.

    Uncommitted edits under lumos/ add "+dirty.<hash of `git diff HEAD` and untracked files>", so two runs with the
    same commit but different local edits record different code versions, and equal ones the same.
    """
    source_dir = Path(lumos.__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(source_dir), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        diff = subprocess.run(
            ["git", "-C", str(source_dir), "diff", "HEAD", "--", "lumos"], capture_output=True, timeout=10, check=True
        ).stdout
        untracked = subprocess.run(
            ["git", "-C", str(source_dir), "ls-files", "--others", "--exclude-standard", "-z", "--", "lumos"],
            capture_output=True, timeout=10, check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.SubprocessError):
        return lumos.__version__
    digest = hashlib.sha256(diff)
    for name in sorted(filter(None, untracked)):  # a new module is an edit too
        digest.update(name + b"\0" + (source_dir / name.decode()).read_bytes())
    dirty = diff.strip() or any(untracked)
    return f"{sha}+dirty.{digest.hexdigest()[:12]}" if dirty else sha
