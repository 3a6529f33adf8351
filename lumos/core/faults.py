"""A test hook for the fault-injection suite: die by SIGKILL at a named point of a run.

When the environment variable LUMOS_FAULT_POINT names a point that the running code passes, the
process kills its Spark JVM and then itself with SIGKILL there, as a machine crash or an OOM kill
would: no exception handlers, no cleanup, no `finally`. `lumos ingest` passes after_rejects (the
rejects table committed), mid_vocab (the vocab write has put down data files, before its commit)
and before_sequences (vocab committed, sequences not yet written). Only tests set it
(tests/integration/test_faults_input.py); unset, each point costs one dictionary lookup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FAULT_POINT = "LUMOS_FAULT_POINT"


def crash_here(point: str) -> None:
    if os.environ.get(FAULT_POINT) == point:
        _die()


@contextlib.contextmanager
def crash_during_write(point: str, location: str) -> Iterator[None]:
    """Die as soon as the write inside the block has put a new data file under `location`
    (a local Delta table folder), that is after its data and before its commit."""
    if os.environ.get(FAULT_POINT) != point:
        yield
        return
    root = Path(location)
    existing = _data_files(root)

    def watch() -> None:
        while not _data_files(root) - existing:
            time.sleep(0.002)
        _die()

    threading.Thread(target=watch, daemon=True).start()
    yield
    _die()  # the write finished before the watcher saw it: still die, so the run never goes on


def _data_files(root: Path) -> set[Path]:
    if not root.is_dir():
        return set()
    return {path for path in root.rglob("*.parquet") if "_delta_log" not in path.parts}


def _die() -> None:
    # The JVM outlives its Python driver for a moment (it exits when its stdin closes) and could
    # finish a commit in that moment; a crash takes both at once.
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None) if gateway is not None else None
    if process is not None:
        os.kill(process.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
