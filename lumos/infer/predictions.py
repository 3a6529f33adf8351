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
import threading
import time
import uuid
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
        with _floats_without_dictionary(spark, frame.schema):
            writer.save(table_location(workspace, ref))
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


LEASE_SECONDS = 120.0
"""How long a lock stays valid without renewal; a running infer renews it every third of that."""
_HELD_TOKENS: set[str] = set()
"""Tokens of the locks this process holds: a lock with our PID but another token was left by an
earlier process that had the same PID (a restarted container), not by us."""


@contextlib.contextmanager
def partition_lock(
    workspace: Workspace, ref: TableRef, as_of: datetime.date, lease_seconds: float = LEASE_SECONDS
) -> Iterator[Path | None]:
    """Hold `<workspace>/locks/<dataset>.<table>/<date>.lock` while writing one partition.

    The lock file appears whole or not at all (written aside, then hard-linked into place, which
    fails when a lock exists). It names its holder (host, PID, a random token) and a lease that a
    thread renews while the holder runs. A lock is stale when its lease ran out, when it cannot be
    read, or when it comes from this host and its PID is gone or is this process's without its
    token. A stale lock is taken over by renaming it to a unique name first: of several processes
    that judge it stale, only the one whose rename succeeds goes on to create its own.
    """
    if not workspace.is_local:
        yield None  # no shared file system to lock on; Delta's concurrency check decides
        return
    path = Path(workspace.root.removeprefix("file:")) / "locks" / ref.name / f"{as_of.isoformat()}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "token": token, "started_at": utc_now()}
    acquired = _create(path, holder, lease_seconds)
    if not acquired:
        found = _read_holder(path)
        if _is_stale(path, found) and _take_over(path, found):
            acquired = _create(path, holder, lease_seconds)
    if not acquired:
        raise RunInProgress(_held_message(path, ref, as_of))
    _HELD_TOKENS.add(token)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(path, holder, lease_seconds, stop), daemon=True,
                               name=f"lumos-lock-{as_of}")
    renewer.start()
    try:
        yield path
    finally:
        stop.set()
        renewer.join()
        _HELD_TOKENS.discard(token)
        if _read_holder(path).get("token") == token:
            path.unlink(missing_ok=True)


def _create(path: Path, holder: dict, lease_seconds: float) -> bool:
    """Create the lock with its whole content, or return False when one exists (O_EXCL semantics)."""
    staged = _stage(path, holder, lease_seconds)
    try:
        os.link(staged, path)
        return True
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)


def _stage(path: Path, holder: dict, lease_seconds: float) -> Path:
    staged = path.with_name(f".{path.name}.{holder['token']}.{uuid.uuid4().hex[:8]}")
    staged.write_text(json.dumps({**holder, "expires_at": time.time() + lease_seconds}))
    return staged


def _renew(path: Path, holder: dict, lease_seconds: float, stop: threading.Event) -> None:
    """Push the lease forward while the holder runs; a lock that is no longer ours is left alone."""
    while not stop.wait(lease_seconds / 3):
        if _read_holder(path).get("token") == holder["token"]:
            os.replace(_stage(path, holder, lease_seconds), path)


def _take_over(path: Path, stale: dict) -> bool:
    """Move the stale lock out of the way; True for the one process whose rename moved it."""
    moved = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return False  # another process moved it first
    if _read_holder(moved) != stale:
        # Between our read and our rename another process took over and made a live lock: put it back.
        with contextlib.suppress(FileExistsError):
            os.link(moved, path)
        moved.unlink(missing_ok=True)
        return False
    moved.unlink(missing_ok=True)
    return True


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _is_stale(path: Path, holder: dict) -> bool:
    if not holder:
        return True  # empty or garbled: locks are never written partly, so nobody holds this one
    expires_at = holder.get("expires_at")
    if isinstance(expires_at, (int, float)) and expires_at < time.time():
        return True  # its holder stopped renewing, on this host or another
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    if holder["pid"] == os.getpid():
        return holder.get("token") not in _HELD_TOKENS
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
            f"Wait for it; a lock whose holder died is taken over once its lease runs out, or remove {path}")
