"""A lock file with a lease, for the writers that must not run twice at once on one workspace
(`lumos infer` for one table and date, `lumos ingest` for one dataset).

The lock file appears whole or not at all (written aside, then hard-linked into place, which fails
when a lock exists). It names its holder (host, PID, a random token) and the length of its lease,
which a thread renews by rewriting the file while the holder runs. A lock is stale when its lease
ran out, when it cannot be read, or when it comes from this host and its PID is gone or is this
process's without its token. A stale lock is taken over by renaming it to a unique name first: of
several processes that judge it stale, only the one whose rename succeeds goes on to create its own.

A lease is judged on the file system's clock, never by comparing the holder's clock with ours:
the lock's last write time against the write time of a file we write beside it now. Hosts whose
clocks disagree (a holder minutes behind would look expired to us) still agree on a shared file
system's times.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from lumos.core.errors import LumosError
from lumos.core.lineage import utc_now

LEASE_SECONDS = 120.0
"""How long a lock stays valid without renewal; its holder renews it every third of that."""
_HELD_TOKENS: set[str] = set()
"""Tokens of the locks this process holds: a lock with our PID but another token was left by an
earlier process that had the same PID (a restarted container), not by us."""


class RunInProgress(LumosError):
    """Another run holds the lock (exit 1, before any work)."""


@contextlib.contextmanager
def lease_lock(path: Path, busy: Callable[[dict], str], lease_seconds: float = LEASE_SECONDS) -> Iterator[Path]:
    """Hold the lock file `path` for the block, or raise RunInProgress(busy(holder)) when a live
    holder has it; `holder` is what the lock file says (empty when unreadable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "token": token, "started_at": utc_now(),
              "lease_seconds": lease_seconds}
    acquired = _create(path, holder)
    if not acquired:
        found = read_holder(path)
        if _is_stale(path, found) and _take_over(path, found):
            acquired = _create(path, holder)
    if not acquired:
        raise RunInProgress(busy(read_holder(path)))
    _HELD_TOKENS.add(token)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(path, holder, stop), daemon=True, name=f"lumos-lock-{path.name}")
    renewer.start()
    try:
        yield path
    finally:
        stop.set()
        renewer.join()
        _HELD_TOKENS.discard(token)
        if read_holder(path).get("token") == token:
            path.unlink(missing_ok=True)


def describe_holder(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started_at')}" if holder else "unknown"


def _create(path: Path, holder: dict) -> bool:
    """Create the lock with its whole content, or return False when one exists (O_EXCL semantics)."""
    staged = _stage(path, holder)
    try:
        os.link(staged, path)
        return True
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)


def _stage(path: Path, holder: dict) -> Path:
    staged = path.with_name(f".{path.name}.{holder['token']}.{uuid.uuid4().hex[:8]}")
    staged.write_text(json.dumps(holder))
    return staged


def _renew(path: Path, holder: dict, stop: threading.Event) -> None:
    """Rewrite the lock (its write time is the lease's start) while the holder runs; a lock that is
    no longer ours is left alone."""
    while not stop.wait(holder["lease_seconds"] / 3):
        if read_holder(path).get("token") == holder["token"]:
            os.replace(_stage(path, holder), path)


def _take_over(path: Path, stale: dict) -> bool:
    """Move the stale lock out of the way; True for the one process whose rename moved it."""
    moved = path.with_name(f".{path.name}.stale-{uuid.uuid4().hex}")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return False  # another process moved it first
    if read_holder(moved) != stale:
        # Between our read and our rename another process took over and made a live lock: put it back.
        with contextlib.suppress(FileExistsError):
            os.link(moved, path)
        moved.unlink(missing_ok=True)
        return False
    moved.unlink(missing_ok=True)
    return True


def read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _is_stale(path: Path, holder: dict) -> bool:
    if not holder:
        return True  # empty or garbled: locks are never written partly, so nobody holds this one
    if _lease_over(path, holder):
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


def _lease_over(path: Path, holder: dict) -> bool:
    """True when the lock was last written longer than its lease ago, on the file system's clock."""
    lease = holder.get("lease_seconds")
    lease = lease if isinstance(lease, (int, float)) else LEASE_SECONDS
    try:
        written = path.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: the create that follows decides
    return _file_system_now(path.parent) - written > lease


def _file_system_now(folder: Path) -> float:
    """The current time as the file system holding `folder` stamps it: a shared file system's
    server sets write times by its own clock, whichever host writes."""
    probe = folder / f".clock-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    try:
        return probe.stat().st_mtime
    finally:
        probe.unlink(missing_ok=True)
