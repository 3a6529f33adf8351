"""A full disk, reported as what it is: the place whose device is full, and what to do.

A write that runs out of space fails deep inside pyarrow, safetensors, the Spark JVM or Hadoop,
with a message that names neither the place nor the cause in its first line (a Spark write reads
"An error occurred while calling o1441.save"). `writing_to(location)` around a write turns any such
failure into a `DiskFull` naming the location. Each writer commits only after its data is whole
(a Delta commit, a checkpoint link swapped by one rename), so a full disk leaves the previous
version in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from lumos.core.errors import LumosError

NO_SPACE = "No space left on device"
"""strerror(ENOSPC), as Python, Java (java.io.IOException) and Rust (safetensors) all report it."""


class DiskFull(LumosError):
    """A write found no space left on the device it writes to."""

    def __init__(self, location: str) -> None:
        self.location = location
        super().__init__(f"no space left on device writing {location}: that write was not committed (the previous "
                         "version, if any, stands). Free space there and rerun.")


def out_of_space(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is ENOSPC."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        try:
            text = str(current)  # a Spark error's text holds the Java causes; Rust's holds the OS error
        except Exception:  # the JVM is gone: its error cannot print itself
            text = ""
        if NO_SPACE in text:
            return True
        current = current.__cause__ or current.__context__
    return False


def full_disk_message(error: BaseException) -> str | None:
    """For a full disk met by a write that `writing_to` does not wrap: what happened, with the
    file where the error names one; None for any other error."""
    if not out_of_space(error):
        return None
    filename = getattr(error, "filename", None)
    return f"no space left on device{f' writing {filename}' if filename else ''}. Free space there and rerun."


@contextlib.contextmanager
def writing_to(location: str) -> Iterator[None]:
    """Run a write to `location`; a full disk under it raises DiskFull naming it."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as error:
        if out_of_space(error) or _device_full(location):
            raise DiskFull(location) from error
        raise


def _device_full(location: str) -> bool:
    """Whether the device under a local `location` has no byte left. Asked after a write failed
    with an error that names no cause: torch.save reports a full disk as "PytorchStreamWriter
    failed writing file data/0: file write failed", its errno dropped."""
    if "://" in location or location.startswith("file:"):
        return False
    folder = Path(location)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False
