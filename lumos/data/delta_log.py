"""Which Parquet files make up a version of a Delta table, read straight from its `_delta_log` (no Spark).

The training loader lists a table version's files here and reads them with pyarrow, so loading
needs no JVM. The reader is small and strict: what it cannot replay exactly, it refuses.

Replay (Delta protocol, "Action Reconciliation"): take the newest complete checkpoint whose
version is ≤ the requested one (a single `<v>.checkpoint.parquet`, or every part of a multi-part
`<v>.checkpoint.<i>.<n>.parquet`), keep its `add` actions (its `remove` tombstones are history),
then apply the JSON commits `<v+1>.json` … `<version>.json` in order: an `add` makes a file live,
a `remove` drops it, both keyed by the file's absolute path after URL-decoding the log's path
(relative paths in the log are URL-encoded and relative to the table folder). The last `metaData`
and `protocol` seen win. Without a checkpoint, replay starts at `0.json`; a missing commit in the
chain is an error, never skipped.

Refused, with an error naming the table and the feature: deletion vectors on an `add` action
(rows of that file are deleted without rewriting it), column mapping mode other than `none`
(Parquet column names differ from the table's), v2 checkpoints and sidecar files, and any reader
feature not known to be harmless for listing files. Only the local filesystem is supported:
table paths are local folders or `file:` URIs, and so must be the log's absolute file paths.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from lumos.core.errors import LumosError, UsageError

LOG_FOLDER = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_CHECKPOINT_PART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")

# Reader features that do not change which files are live or how their columns are named; the
# two that could are checked where they act (deletion vectors per add, column mapping by mode).
KNOWN_READER_FEATURES = frozenset({"deletionVectors", "columnMapping", "timestampNtz", "vacuumProtocolCheck"})
MAX_READER_VERSION = 3


class DeltaLogError(LumosError):
    """A log this reader cannot replay: a missing commit, an unreadable action."""


class UnsupportedDeltaFeature(UsageError):
    """The table uses a Delta feature this reader does not implement."""


@dataclass(frozen=True)
class DataFile:
    path: str
    """Absolute local path of the Parquet file."""
    size: int
    """Size in bytes, as the log records it."""
    partition_values: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class DeltaSnapshot:
    """One version of a table: its live data files (sorted by path), schema and settings."""

    table_path: str
    version: int
    files: tuple[DataFile, ...]
    schema_string: str
    """The table schema as Delta writes it (Spark's StructType JSON)."""
    partition_columns: tuple[str, ...] = ()
    configuration: dict[str, str] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:
        return json.loads(self.schema_string)

    @property
    def size_bytes(self) -> int:
        return sum(data_file.size for data_file in self.files)

    def __str__(self) -> str:
        return f"{self.table_path}@{self.version}"


def latest_version(table_path: str | Path) -> int:
    """The newest version of the table (the highest commit or checkpoint in its log)."""
    table = _local_path(table_path)
    return _LogListing.of(table).latest


def active_files(table_path: str | Path, version: int | None = None) -> DeltaSnapshot:
    """The snapshot of `version` (the latest when None): live files, schema, partition columns."""
    table = _local_path(table_path)
    listing = _LogListing.of(table)
    target = listing.latest if version is None else version
    if not 0 <= target <= listing.latest:
        raise UsageError(f"{table} has no version {target}; its versions are 0 … {listing.latest}")
    state = _ReplayState(table)
    checkpoint = listing.checkpoint_at_or_before(target)
    if checkpoint is not None:
        state.apply_checkpoint(listing.checkpoints[checkpoint])
    first_commit = 0 if checkpoint is None else checkpoint + 1
    for commit in range(first_commit, target + 1):
        if commit not in listing.commits:
            raise DeltaLogError(
                f"{table}: commit {commit} is missing from {LOG_FOLDER} (needed for version {target}); "
                "the log was cleaned up or is incomplete, so this version cannot be read"
            )
        state.apply_commit(listing.commits[commit])
    return state.snapshot(target)


def commit_info(table_path: str | Path, version: int) -> dict[str, Any] | None:
    """The `commitInfo` action of one commit (operation, userMetadata, …); None when the commit
    file is gone (log cleanup) or has none."""
    commit = _local_path(table_path) / LOG_FOLDER / f"{version:020d}.json"
    return _first_commit_info(commit) if commit.is_file() else None


@dataclass(frozen=True)
class Commit:
    """One commit's entry in the table's history (its `commitInfo`)."""

    version: int
    timestamp: datetime.datetime
    """When the commit file was written (its modification time, as Delta's own history reports)."""
    operation: str
    user_metadata: str | None


def history(table_path: str | Path, limit: int | None = None) -> list[Commit]:
    """The commits still in the log, newest first (at most `limit`); cleaned-up ones are gone."""
    listing = _LogListing.of(_local_path(table_path))
    commits = []
    for version in sorted(listing.commits, reverse=True)[:limit]:
        path = listing.commits[version]
        info = _first_commit_info(path) or {}
        commits.append(Commit(
            version=version,
            timestamp=datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC),
            operation=info.get("operation", ""),
            user_metadata=info.get("userMetadata"),
        ))
    return commits


def _first_commit_info(commit: Path) -> dict[str, Any] | None:
    # Writers put commitInfo first: stop there rather than parse every add action of a big commit.
    try:
        with commit.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip() and "commitInfo" in (action := json.loads(line)):
                    return action["commitInfo"]
    except (OSError, ValueError) as error:
        raise DeltaLogError(f"cannot read Delta commit {commit}: {error}") from error
    return None


# ---------------------------------------------------------------------------------------------
# Listing the log


@dataclass(frozen=True)
class _LogListing:
    table: Path
    commits: dict[int, Path]
    checkpoints: dict[int, list[Path]]
    """Complete classic checkpoints: version → its file, or all parts of a multi-part one."""
    v2_checkpoints: frozenset[int]
    latest: int

    @classmethod
    def of(cls, table: Path) -> _LogListing:
        log = table / LOG_FOLDER
        if not log.is_dir():
            raise UsageError(f"{table} is not a Delta table: it has no {LOG_FOLDER} folder")
        commits: dict[int, Path] = {}
        singles: dict[int, Path] = {}
        parts: dict[tuple[int, int], dict[int, Path]] = {}
        v2: set[int] = set()
        for entry in log.iterdir():
            name = entry.name
            if match := _COMMIT.match(name):
                commits[int(match[1])] = entry
            elif match := _CHECKPOINT.match(name):
                singles[int(match[1])] = entry
            elif match := _CHECKPOINT_PART.match(name):
                parts.setdefault((int(match[1]), int(match[3])), {})[int(match[2])] = entry
            elif match := _V2_CHECKPOINT.match(name):
                v2.add(int(match[1]))
        checkpoints = {version: [path] for version, path in singles.items()}
        for (version, count), found in parts.items():
            # A multi-part checkpoint counts only when every part was written.
            if version not in checkpoints and sorted(found) == list(range(1, count + 1)):
                checkpoints[version] = [found[index] for index in range(1, count + 1)]
        versions = [*commits, *checkpoints, *v2]
        if not versions:
            raise UsageError(f"{table} is not a Delta table: {LOG_FOLDER} holds no commits")
        return cls(table, commits, checkpoints, frozenset(v2), max(versions))

    def checkpoint_at_or_before(self, version: int) -> int | None:
        classic = max((v for v in self.checkpoints if v <= version), default=None)
        newer_v2 = [v for v in self.v2_checkpoints if v <= version and (classic is None or v > classic)]
        # Commits may have been cleaned up behind a v2 checkpoint: replaying around it is not safe.
        if newer_v2:
            raise UnsupportedDeltaFeature(
                f"{self.table}: version {max(newer_v2)} has a v2 checkpoint (UUID-named, with sidecars), "
                "which this reader does not support; read the table with Spark"
            )
        return classic


# ---------------------------------------------------------------------------------------------
# Replay


class _ReplayState:
    def __init__(self, table: Path):
        self.table = table
        self.files: dict[str, DataFile] = {}
        self.metadata: dict[str, Any] | None = None
        self.protocol: dict[str, Any] | None = None

    def apply_checkpoint(self, parts: list[Path]) -> None:
        for part in parts:
            for action in _checkpoint_actions(part, self.table):
                if "add" in action:
                    self._add(action["add"], part)
                elif "metaData" in action:
                    self.metadata = action["metaData"]
                elif "protocol" in action:
                    self.protocol = action["protocol"]

    def apply_commit(self, commit: Path) -> None:
        for action in _json_actions(commit):
            if "add" in action:
                self._add(action["add"], commit)
            elif "remove" in action:
                self.files.pop(_data_path(self.table, action["remove"]["path"]), None)
            elif "metaData" in action:
                self.metadata = action["metaData"]
            elif "protocol" in action:
                self.protocol = action["protocol"]
            elif "checkpointMetadata" in action or "sidecar" in action:
                raise UnsupportedDeltaFeature(f"{self.table}: {commit.name} holds v2 checkpoint actions; read the table with Spark")

    def _add(self, add: dict[str, Any], source: Path) -> None:
        path = _data_path(self.table, add["path"])
        if add.get("deletionVector"):
            raise UnsupportedDeltaFeature(
                f"{self.table}: {source.name} adds {Path(path).name} with a deletion vector; this reader "
                "does not apply deletion vectors. Rewrite the table without them (disable "
                "delta.enableDeletionVectors and run REORG TABLE … APPLY (PURGE)), or read it with Spark"
            )
        self.files[path] = DataFile(path, int(add["size"]), dict(add.get("partitionValues") or {}))

    def snapshot(self, version: int) -> DeltaSnapshot:
        if self.protocol is None or self.metadata is None:
            raise DeltaLogError(f"{self.table}: no protocol or metaData action up to version {version}; the log is corrupt")
        _check_protocol(self.table, self.protocol)
        configuration = dict(self.metadata.get("configuration") or {})
        _check_column_mapping(self.table, configuration)
        provider = (self.metadata.get("format") or {}).get("provider", "parquet")
        if provider != "parquet":
            raise UnsupportedDeltaFeature(f"{self.table}: data files are {provider!r}, not parquet")
        return DeltaSnapshot(
            table_path=str(self.table),
            version=version,
            files=tuple(self.files[path] for path in sorted(self.files)),
            schema_string=self.metadata["schemaString"],
            partition_columns=tuple(self.metadata.get("partitionColumns") or ()),
            configuration=configuration,
        )


def _check_protocol(table: Path, protocol: dict[str, Any]) -> None:
    reader_version = int(protocol.get("minReaderVersion", 1))
    if reader_version > MAX_READER_VERSION:
        raise UnsupportedDeltaFeature(
            f"{table}: protocol minReaderVersion {reader_version} is newer than this reader supports "
            f"({MAX_READER_VERSION}); read the table with Spark"
        )
    features = set(protocol.get("readerFeatures") or ()) if reader_version == MAX_READER_VERSION else set()
    unknown = sorted(features - KNOWN_READER_FEATURES)
    if unknown:
        hint = " (v2 checkpoints)" if "v2Checkpoint" in unknown else ""
        raise UnsupportedDeltaFeature(
            f"{table}: the protocol requires reader feature{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}{hint}, which this reader does not support; read the table with Spark"
        )


def _check_column_mapping(table: Path, configuration: dict[str, str]) -> None:
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise UnsupportedDeltaFeature(
            f"{table}: column mapping mode {mode!r} (Parquet column names differ from the table's); "
            "this reader supports only mode 'none'; read the table with Spark"
        )


# ---------------------------------------------------------------------------------------------
# Reading actions and paths


def _json_actions(commit: Path) -> list[dict[str, Any]]:
    try:
        lines = commit.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as error:
        raise DeltaLogError(f"cannot read Delta commit {commit}: {error}") from error


def _checkpoint_actions(part: Path, table: Path) -> list[dict[str, Any]]:
    """The add, metaData and protocol actions of one checkpoint file, as dicts like the JSON ones.

    Only the columns replay needs are read (nested projection), so per-file stats are skipped.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    dataset = ds.dataset(str(part), format="parquet")
    schema = dataset.schema
    for v2_column in ("checkpointMetadata", "sidecar"):
        if v2_column in schema.names and dataset.to_table(columns=[v2_column]).column(v2_column).null_count < dataset.count_rows():
            raise UnsupportedDeltaFeature(f"{table}: checkpoint {part.name} is a v2 checkpoint ({v2_column}); read the table with Spark")
    actions: list[dict[str, Any]] = []
    if "add" in schema.names:
        add_fields = {name for name in ("path", "size", "partitionValues", "deletionVector")
                      if schema.field("add").type.get_field_index(name) >= 0}
        adds = dataset.to_table(
            columns={name: pc.field("add", name) for name in sorted(add_fields)},
            filter=pc.field("add", "path").is_valid(),
        )
        for add in adds.to_pylist():
            add["partitionValues"] = dict(add.get("partitionValues") or [])
            actions.append({"add": add})
    for name in ("metaData", "protocol"):
        if name in schema.names:
            column = dataset.to_table(columns=[name], filter=pc.field(name).is_valid()).column(name)
            actions += [{name: _plain_maps(value)} for value in column.to_pylist()]
    return actions


def _plain_maps(action: dict[str, Any]) -> dict[str, Any]:
    """Parquet maps come back from pyarrow as lists of (key, value) pairs; make them dicts."""
    result = dict(action)
    if "configuration" in result:
        result["configuration"] = dict(result["configuration"] or [])
    if isinstance(result.get("format"), dict):
        result["format"] = {**result["format"], "options": dict(result["format"].get("options") or [])}
    return result


def _data_path(table: Path, logged: str) -> str:
    """The absolute local path of a file named in the log (URL-encoded, relative or a file: URI)."""
    if "://" in logged or logged.startswith("file:"):
        url = urlparse(logged)
        if url.scheme != "file":
            raise UnsupportedDeltaFeature(f"{table}: data file {logged} is not on the local filesystem; read the table with Spark")
        return str(Path(unquote(url.path)))
    return str(table / unquote(logged))


def _local_path(table_path: str | Path) -> Path:
    text = str(table_path)
    if text.startswith("file:"):
        text = unquote(urlparse(text).path)
    elif "://" in text:
        raise UnsupportedDeltaFeature(f"{text}: only local tables can be read without Spark")
    return Path(text).resolve()
