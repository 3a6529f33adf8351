"""A test hook for the fault-injection suite: `LUMOS_FAULT_POINT=<point>[:<SIGNAL>]` makes the
process send itself SIGNAL (default SIGKILL) when it reaches the named point, so that a test can
kill or stop a real `lumos` process at an exact place. Only tests set it; unset, each point costs
one environment lookup.

A SIGKILL takes the Spark JVM down with the process, as a machine crash or an OOM kill would: no
exception handlers, no cleanup, no `finally`. Points:
- ingest: `after_rejects` (rejects committed), `mid_vocab` (the vocab write has put down data
  files, before its commit), `before_sequences` (vocab committed, sequences not yet written);
- train: `train.step.<N>` (after optimizer step N, on every rank), `train.step.<N>.rank<R>` (there, on
  rank R only), `checkpoint.replace` (a new checkpoint written,
  the old one still in place under its name);
- infer: `infer.write` (the partition scored, nothing committed), `infer.mid_write` (the
  predictions' write has put down data files, before its commit);
- promote: `promote.alias` (a new version registered, the alias not yet moved);
- compile: `compile.upload` (the plan's source uploaded to the run, its plan.json not yet).
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


def _wanted(point: str) -> signal.Signals | None:
    """The signal to send at `point`, or None when the hook does not name it."""
    wanted = os.environ.get(FAULT_POINT)
    if not wanted:
        return None
    name, _, signal_name = wanted.partition(":")
    return getattr(signal, signal_name or "SIGKILL") if name == point else None


def fault_point(point: str) -> None:
    sent = _wanted(point)
    if sent is not None:
        _send(sent)


@contextlib.contextmanager
def crash_during_write(point: str, location: str) -> Iterator[None]:
    """Die as soon as the write inside the block has put a new data file under `location`
    (a local Delta table folder), that is after its data and before its commit."""
    sent = _wanted(point)
    if sent is None:
        yield
        return
    root = Path(location)
    existing = _data_files(root)

    def watch() -> None:
        while not _data_files(root) - existing:
            time.sleep(0.002)
        _send(sent)

    threading.Thread(target=watch, daemon=True).start()
    yield
    _send(sent)  # the write finished before the watcher saw it: still die, so the run never goes on


def _data_files(root: Path) -> set[Path]:
    if not root.is_dir():
        return set()
    return {path for path in root.rglob("*.parquet") if "_delta_log" not in path.parts}


def _send(sent: signal.Signals) -> None:
    if sent == signal.SIGKILL:
        _kill_spark_jvm()
    os.kill(os.getpid(), sent)


def _kill_spark_jvm() -> None:
    # The JVM outlives its Python driver for a moment (it exits when its stdin closes) and could
    # finish a commit in that moment; a crash takes both at once.
    import sys

    if "pyspark" not in sys.modules:  # no Spark in this process (training)
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None) if gateway is not None else None
    if process is not None:
        os.kill(process.pid, signal.SIGKILL)
