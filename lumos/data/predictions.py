"""The predictions table: one Delta partition per as-of date, replaced whole on every run.

A rerun for a date deletes that date's rows and writes the new ones in one commit (Delta's
replaceWhere), so a date never holds two runs' rows and other dates are untouched. Two runs for
the same date are kept apart by a lock file in the workspace (the loser fails at once, before any
work); on a remote workspace, where no local lock can be taken, Delta's optimistic concurrency
check makes the later commit fail instead.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from pathlib import Path

from lumos.core.disk import writing_to
from lumos.core.lineage import LineageRecord
from lumos.core.lock import LEASE_SECONDS, RunInProgress, describe_holder, lease_lock
from lumos.core.tables import LOG_RETENTION, TableRef, committed_version, keep_log, table_location
from lumos.core.workspace import Workspace

PARTITION = "as_of"


def write_partition(spark, workspace: Workspace, ref: TableRef, frame, as_of: datetime.date, lineage: LineageRecord) -> TableRef:
    """Replace partition as_of = `as_of` of `ref` with `frame` in one commit; return the version."""
    writer = (
        frame.write.format("delta")
        .mode("overwrite")
        .partitionBy(PARTITION)
        # The predicate is built from a date object, never from user text.
        .option("replaceWhere", f"{PARTITION} = DATE'{as_of.isoformat()}'")
        # A newer model may add head columns; earlier dates keep theirs and read back as null.
        .option("mergeSchema", "true")
        .options(**LOG_RETENTION)
        .option("userMetadata", lineage.to_json())
    )
    location = table_location(workspace, ref)
    try:
        with writing_to(location), _floats_without_dictionary(spark, frame.schema):
            keep_log(spark, location)
            writer.save(location)
    except Exception as error:
        if "Concurrent" in type(error).__name__ or "Concurrent" in str(error)[:500]:
            raise RunInProgress(f"another run wrote {ref.name} for {as_of} at the same time and committed first; "
                                f"this run wrote nothing. Rerun to replace that partition again.") from error
        raise
    return committed_version(spark, workspace, ref, lineage)


@contextlib.contextmanager
def _floats_without_dictionary(spark, schema) -> Iterator[None]:
    """Write float columns and float arrays (embeddings, scores) without a Parquet dictionary.

    A model's outputs are nearly all distinct values, so Parquet filled a dictionary for every
    page and then threw it away: about a tenth of the JVM's samples while infer scored (JFR). Delta
    does not pass writer options on to Parquet, so the per-column setting goes in the session's
    conf (which Spark copies into the write's Hadoop conf) for this write only.
    """
    from pyspark.sql.types import ArrayType, DoubleType, FloatType

    floats = (FloatType, DoubleType)
    paths = [field.name for field in schema.fields if isinstance(field.dataType, floats)]
    paths += [f"{field.name}.list.element" for field in schema.fields
              if isinstance(field.dataType, ArrayType) and isinstance(field.dataType.elementType, floats)]
    keys = [f"parquet.enable.dictionary#{path}" for path in paths]
    before = {key: spark.conf.get(key, None) for key in keys}
    for key in keys:
        spark.conf.set(key, "false")
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


@contextlib.contextmanager
def partition_lock(
    workspace: Workspace, ref: TableRef, as_of: datetime.date, lease_seconds: float = LEASE_SECONDS
) -> Iterator[Path | None]:
    """Hold `<workspace>/locks/<dataset>.<table>/<date>.lock` while writing one partition
    (lumos.core.lock: a lease renewed while this run lives, taken over once its holder is gone)."""
    if not workspace.is_local:
        yield None  # no shared file system to lock on; Delta's concurrency check decides
        return
    path = Path(workspace.root.removeprefix("file:")) / "locks" / ref.name / f"{as_of.isoformat()}.lock"

    def busy(holder: dict) -> str:
        return (f"another lumos infer is writing {ref.name} for {as_of} ({describe_holder(holder)}); "
                f"this run wrote nothing. Wait for it; a lock whose holder died is taken over once its lease "
                f"runs out, or remove {path}")

    with lease_lock(path, busy, lease_seconds) as held:
        yield held
