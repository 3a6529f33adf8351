"""A test hook for fault injection: `LUMOS_FAULT_POINT=<point>[:<SIGNAL>]` makes the process send
itself SIGNAL (default SIGKILL) when it reaches the named point, so that a test can kill or stop a
real `lumos` process at an exact place (between two renames, after step 5). Only tests set it.

Points: `train.step.<N>` (after optimizer step N), `checkpoint.replace` (a new checkpoint written,
the old one still in place under its name), `infer.write` (the partition scored, nothing committed).
"""

from __future__ import annotations

import os
import signal


def fault_point(name: str) -> None:
    wanted = os.environ.get("LUMOS_FAULT_POINT")
    if not wanted:
        return
    point, _, signal_name = wanted.partition(":")
    if point == name:
        os.kill(os.getpid(), getattr(signal, signal_name or "SIGKILL"))
