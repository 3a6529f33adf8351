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
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from lumos.core.errors import LumosError
from lumos.core.lineage import LineageRecord, utc_now
from lumos.core.tables import LOG_RETENTION, TableRef, committed_version, keep_log, table_location
from lumos.core.workspace import Workspace

PARTITION = "as_of"


class RunInProgress(LumosError):
    """Another run holds the lock for the same table and date."""


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
    keep_log(spark, table_location(workspace, ref))
    try:
        writer.save(table_location(workspace, ref))
    except Exception as error:
        if "Concurrent" in type(error).__name__ or "Concurrent" in str(error)[:500]:
            raise RunInProgress(f"another run wrote {ref.name} for {as_of} at the same time and committed first; "
                                f"this run wrote nothing. Rerun to replace that partition again.") from error
        raise
    return committed_version(spark, workspace, ref, lineage)


@contextlib.contextmanager
def partition_lock(workspace: Workspace, ref: TableRef, as_of: datetime.date) -> Iterator[Path | None]:
    """Hold `<workspace>/locks/<dataset>.<table>/<date>.lock` while writing one partition.

    The file records who holds it. A lock left by a process that died on this host is taken over;
    one held elsewhere must be removed by hand (the message says which file).
    """
    if not workspace.is_local:
        yield None  # no shared file system to lock on; Delta's concurrency check decides
        return
    path = Path(workspace.root.removeprefix("file:")) / "locks" / ref.name / f"{as_of.isoformat()}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": utc_now()}
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _stale(path):
                path.unlink(missing_ok=True)
                continue
            raise RunInProgress(_held_message(path, ref, as_of)) from None
        with os.fdopen(descriptor, "w") as handle:
            json.dump(holder, handle)
        break
    else:
        raise RunInProgress(_held_message(path, ref, as_of))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stale(path: Path) -> bool:
    """True when the lock's holder was a process on this host that no longer runs."""
    holder = _read_holder(path)
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _held_message(path: Path, ref: TableRef, as_of: datetime.date) -> str:
    holder = _read_holder(path)
    who = f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started_at')}" if holder else "unknown"
    return (f"another lumos infer is writing {ref.name} for {as_of} ({who}); this run wrote nothing. "
            f"Wait for it, or if it died on another host, remove {path}")
