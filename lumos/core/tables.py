"""Versioned tables: every write is one Delta commit carrying its lineage record.

Tables are named `<dataset>.<table>` and live at `<workspace>/tables/<dataset>/<table>`; a reader
names `dataset.table@version` (time travel) or `dataset.table` (latest). Names are validated before
they touch a path, and no SQL is built from them: every access goes through the DataFrame API.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from lumos.core.disk import writing_to
from lumos.core.errors import LumosError, UsageError
from lumos.core.lineage import LineageRecord
from lumos.core.workspace import Workspace

_PART = r"[A-Za-z][A-Za-z0-9_]*"
TABLE_REF = re.compile(rf"^(?P<dataset>{_PART})\.(?P<table>{_PART})(?:@(?P<version>\d+))?$")


@dataclass(frozen=True)
class TableRef:
    dataset: str
    table: str
    version: int | None = None
    """None means the latest version."""

    @classmethod
    def parse(cls, text: str) -> TableRef:
        match = TABLE_REF.match(text.strip())
        if not match:
            raise UsageError(
                f"{text!r} is not a table name; expected dataset.table or dataset.table@VERSION "
                "(letters, digits and _), e.g. quickstart.sequences@0"
            )
        version = match["version"]
        return cls(match["dataset"], match["table"], int(version) if version is not None else None)

    @property
    def name(self) -> str:
        return f"{self.dataset}.{self.table}"

    def at(self, version: int | None) -> TableRef:
        return TableRef(self.dataset, self.table, version)

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


@dataclass(frozen=True)
class TableVersion:
    version: int
    timestamp: str
    operation: str
    lineage: LineageRecord | None
    """None for commits not written by Lumos (or with unreadable metadata)."""


def table_location(workspace: Workspace, ref: TableRef) -> str:
    return "/".join([workspace.tables_root, ref.dataset, ref.table])


def table_exists(spark, location: str) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, location)


LOG_RETENTION = {
    "delta.logRetentionDuration": "interval 36500 days",
    "delta.checkpointRetentionDuration": "interval 36500 days",
}
"""Table properties of every table Lumos writes. Lineage lives in the Delta commit files, which
Delta deletes after 30 days by default (at its next checkpoint); then `data trace`, an old
model's data version and time travel to a pinned vocab break. A century keeps them for the life
of the table. Given as write options they are set when a write creates the table."""


def write_table(spark, workspace: Workspace, ref: TableRef, frame, lineage: LineageRecord) -> TableRef:
    """Replace the table's contents with `frame` in one Delta commit; return the version written.

    The lineage record travels in the commit's userMetadata, so history shows how every version
    was made. Concurrent writers are serialized by Delta's optimistic concurrency: a loser fails
    with Delta's ConcurrentModification error rather than interleaving rows.
    """
    location = table_location(workspace, ref)
    with writing_to(location):
        keep_log(spark, location)
        (
            frame.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .options(**LOG_RETENTION)
            .option("userMetadata", lineage.to_json())
            .save(location)
        )
    return committed_version(spark, workspace, ref, lineage)


def commit_table_files(spark, workspace: Workspace, ref: TableRef, files, schema, lineage: LineageRecord) -> TableRef:
    """`write_table` for rows already written as Parquet files into the table's folder
    (`lumos.core.delta_commit.WrittenFile`s, Spark schema `schema`): one Delta commit that
    replaces the table's contents with them, carrying `lineage`; returns the version written."""
    from lumos.core.delta_commit import commit_overwrite

    location = table_location(workspace, ref)
    with writing_to(location):
        version = commit_overwrite(spark, location, files, schema.json(), LOG_RETENTION, lineage.to_json())
    return ref.at(version)


def write_arrow_table(spark, workspace: Workspace, ref: TableRef, table, schema, lineage: LineageRecord) -> TableRef:
    """`write_table` for a small Arrow table on the driver, in a local workspace: pyarrow writes it
    as one Parquet file into the table's folder and `commit_table_files` makes that the new version
    (no file for an empty table). A Spark write of such a table cost a job, and a read of the
    history to find its version: 0.3-0.5 s a table. `schema` is the table's Spark schema."""
    import uuid
    from pathlib import Path

    import pyarrow.parquet as pq

    from lumos.core.delta_commit import WrittenFile

    files = []
    if table.num_rows:
        folder = Path(table_location(workspace, ref))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        with writing_to(str(folder)):
            pq.write_table(table, path, compression="snappy")
        stat = path.stat()
        files.append(WrittenFile(path.name, stat.st_size, int(stat.st_mtime * 1000)))
    return commit_table_files(spark, workspace, ref, files, schema, lineage)


def keep_log(spark, location: str) -> None:
    """Give an existing table without LOG_RETENTION (made before Lumos set it) those properties.

    Write options only set properties on a table's creation, so an older table gets them in one
    commit of their own (operation SET TBLPROPERTIES, no lineage) before its next write.
    """
    if not table_exists(spark, location):
        return
    # The location is a workspace path (table names are validated); backticks inside it are escaped.
    table = f"delta.`{location.replace('`', '``')}`"
    # SHOW TBLPROPERTIES reads the table's metadata only; DeltaTable.detail() also sized the new
    # version's files, three Spark jobs and 1.4-1.9 s before every write to an existing table.
    properties = {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}
    if all(properties.get(key) == value for key, value in LOG_RETENTION.items()):
        return
    assignments = ", ".join(f"'{key}' = '{value}'" for key, value in LOG_RETENTION.items())
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ({assignments})")


def committed_version(spark, workspace: Workspace, ref: TableRef, lineage: LineageRecord) -> TableRef:
    """The version whose commit carries `lineage` (found by its record id among the latest commits)."""
    for entry in table_history(spark, workspace, ref, limit=20):
        if entry.lineage is not None and entry.lineage.record_id == lineage.record_id:
            return ref.at(entry.version)
    raise RuntimeError(f"wrote {ref.name} but cannot find the commit with lineage {lineage.record_id}")


def read_table(spark, workspace: Workspace, ref: TableRef):
    """The DataFrame of `ref` at its version (latest when the ref has none)."""
    location = require_table(spark, workspace, ref)
    reader = spark.read.format("delta")
    if ref.version is not None:
        latest = latest_version(spark, workspace, ref)
        if ref.version > latest:
            raise UsageError(f"{ref} does not exist: the latest version of {ref.name} is {latest}")
        reader = reader.option("versionAsOf", ref.version)
    return reader.load(location)


def require_table(spark, workspace: Workspace, ref: TableRef) -> str:
    location = table_location(workspace, ref)
    if not table_exists(spark, location):
        raise UsageError(
            f"no table {ref.name} in workspace {workspace.root}; `lumos data list` shows the tables there"
        )
    return location


def table_history(spark, workspace: Workspace, ref: TableRef, limit: int | None = None) -> list[TableVersion]:
    """Versions of a table, newest first, with the lineage record of each commit parsed.

    For writers, which run Spark anyway and may write to remote roots. In a local workspace the
    commits are read straight from the table's log, as `lumos.data.table_metadata` does for
    commands that run no Spark: Delta's history() ran Spark jobs, about 0.5 s after every write
    (finding the version written) and before every read of a pinned version."""
    location = require_table(spark, workspace, ref)
    if workspace.is_local:
        return logged_history(location, limit)
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, location)
    history = table.history(limit) if limit else table.history()
    rows = history.select("version", "timestamp", "operation", "userMetadata").orderBy("version", ascending=False)
    return [
        TableVersion(
            version=row["version"],
            timestamp=row["timestamp"].strftime("%Y-%m-%dT%H:%M:%SZ") if row["timestamp"] else "",
            operation=row["operation"],
            lineage=parse_lineage(row["userMetadata"]),
        )
        for row in rows.collect()
    ]


def logged_history(location: str, limit: int | None = None) -> list[TableVersion]:
    """`table_history` of a local table, read from its Delta log by delta-rs, without Spark.

    The timestamp is the commit's own (its commitInfo), which Delta writes just before the
    commit file: Spark's DESCRIBE HISTORY shows the file's modification time, a moment later."""
    commits = sorted(open_delta_table(location).history(limit), key=lambda commit: commit["version"], reverse=True)
    return [
        TableVersion(
            version=commit["version"],
            timestamp=_utc_text(commit.get("timestamp")),
            operation=commit.get("operation", ""),
            lineage=parse_lineage(commit.get("userMetadata")),
        )
        for commit in commits
    ]


def open_delta_table(location: str, version: int | None = None):
    """One version (the latest when None) of the local Delta table at `location`, read by delta-rs
    (`deltalake.DeltaTable`): its files, schema and history, with no JVM. Writers use Spark."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(location, version=version)
    except TableNotFoundError as error:
        raise UsageError(f"{location} is not a Delta table (no readable _delta_log)") from error
    except DeltaError as error:
        damaged = damaged_log_files(location, version, read_contents=True)
        if damaged:
            raise DamagedDeltaLog(_damaged_message(location, damaged)) from error
        latest = DeltaTable(location).version() if version is not None else None
        if latest is not None and version > latest:
            raise UsageError(f"{location} has no version {version}; its versions are 0 … {latest}") from None
        raise
    # delta-rs replays an empty commit file as a commit of nothing: the files it added would vanish
    # from every later version without an error.
    damaged = damaged_log_files(location, table.version(), read_contents=False)
    if damaged:
        raise DamagedDeltaLog(_damaged_message(location, damaged))
    return table


class DamagedDeltaLog(LumosError):
    """A commit or checkpoint file in a table's _delta_log is empty, cut short or not what it claims."""


def damaged_log_files(location: str, up_to: int | None, read_contents: bool) -> dict[str, str]:
    """File name → what is wrong, for each commit (NNN.json) up to version `up_to` (all when None)
    that is empty, and with `read_contents` (after delta-rs failed: it reads every commit) each
    commit that is not JSON lines and each checkpoint (NNN.checkpoint.parquet) without a footer."""
    log = Path(location.removeprefix("file:")) / "_delta_log"
    damaged = {}
    for entry in sorted(os.scandir(log), key=lambda entry: entry.name) if log.is_dir() else ():
        version_text = entry.name.split(".", 1)[0]
        if not version_text.isdigit() or (up_to is not None and int(version_text) > up_to):
            continue
        if entry.name.endswith(".json"):
            if entry.stat().st_size == 0:
                damaged[entry.name] = "empty"
            elif read_contents and not _json_lines(Path(entry.path)):
                damaged[entry.name] = "not JSON lines (cut short or overwritten)"
        elif read_contents and entry.name.endswith(".checkpoint.parquet") and not _parquet_footer(Path(entry.path)):
            damaged[entry.name] = "not a whole Parquet file (no footer)"
    return damaged


def _json_lines(path: Path) -> bool:
    try:
        return all(isinstance(json.loads(line), dict) for line in path.read_text().splitlines() if line.strip())
    except (ValueError, UnicodeDecodeError):
        return False


def _parquet_footer(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 4))
        return handle.read(4) == b"PAR1"


def _damaged_message(location: str, damaged: dict[str, str]) -> str:
    files = "; ".join(f"{location}/_delta_log/{name} is {what}" for name, what in damaged.items())
    return (f"the Delta log of {location} is damaged: {files}. Nothing was read. Restore the file from a "
            f"backup; a damaged checkpoint can instead be deleted (with _delta_log/_last_checkpoint), and the "
            f"JSON commits are replayed")


def _utc_text(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return ""
    return datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def latest_version(spark, workspace: Workspace, ref: TableRef) -> int:
    return table_history(spark, workspace, ref, limit=1)[0].version


def resolve(spark, workspace: Workspace, ref: TableRef) -> TableRef:
    """Pin a ref to an exact version, so lineage can name what was actually read."""
    return ref if ref.version is not None else ref.at(latest_version(spark, workspace, ref))


def parse_lineage(metadata: str | None) -> LineageRecord | None:
    """The lineage record in a commit's userMetadata; None for commits not written by Lumos."""
    if not metadata:
        return None
    try:
        return LineageRecord.from_json(metadata)
    except (ValueError, TypeError, KeyError):
        return None


XXHASH64_SUM = "xxhash64-sum"


def content_hash(frame, algorithm: str = XXHASH64_SUM) -> str:
    """An order-independent hash of a DataFrame's rows: by default the sum (mod 2^64) of each
    row's xxhash64 over its columns in name order, with the row count; computed by Spark in one
    aggregation, so it scales with the table. Equal rows in any order and partitioning hash
    equal. `algorithm` "arrow-sum": `lumos.core.arrow_hash`'s, what the sequences writers record."""
    from pyspark.sql import functions as F

    from lumos.core import arrow_hash

    if algorithm == arrow_hash.ALGORITHM:
        return content_hash_of(*arrow_hash.frame_hash_sum(frame), algorithm)
    if algorithm != XXHASH64_SUM:
        raise ValueError(f"unknown content hash algorithm {algorithm!r}")
    total = frame.agg(F.sum(row_hash(frame)).alias("total"), F.count(F.lit(1)).alias("rows")).collect()[0]
    return content_hash_of(total["total"], total["rows"])


def hash_algorithm(content_hash: str) -> str:
    """The algorithm a `content_hash` string was made with (its first field)."""
    return content_hash.split(":", 1)[0]


def row_hash(frame):
    """Each row's part of `content_hash`, for callers that sum it in an aggregation of their own."""
    from pyspark.sql import functions as F

    return F.xxhash64(*[frame[name] for name in sorted(frame.columns)]).cast("decimal(38,0)")  # a decimal sum cannot overflow


def content_hash_of(total, rows: int, algorithm: str = XXHASH64_SUM) -> str:
    """`content_hash` from the sum of the rows' hashes (None for no rows), their count and the
    algorithm that hashed them (`row_hash`'s by default)."""
    return f"{algorithm}:{int(total or 0) % 2**64:016x}:{rows}"
