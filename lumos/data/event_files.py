"""The events source's files as the user state consumed them, so that a night opens only the files
it needs: its cost grows with the day's new files, not with the history.

The state's lineage records, per file of the events source (`sources.source_files`): its identity
(size and modification time; a Delta file's size, as Delta never changes a file in place), its
content hash (local files) and the times of its first and latest events. The next incremental
night lists the source, reading no data, and

- hashes only the files it does not find recorded with the same identity, for the source's
  version (`sources.files_fingerprint`, the value a full night gets by hashing every file);
- reads the new files, and of the recorded files only those holding events on or after the
  state's date (events that date left out); every other recorded file holds nothing it needs;
- looks for late events (before the state's date) only when a new file's first event is so.

A recorded file whose identity changed, or that is gone, means the source was rewritten: the
night is a full rebuild (`user_state._rebuild_reason`). A full night hashes every file, as a
rebuild that may be reproduced should, and finds the files' event times in one more pass over
the timestamp column; an incremental night, over its new files only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote

from lumos.core.lineage import LineageInput
from lumos.core.workspace import is_uri
from lumos.data.sources import file_sha256, files_fingerprint


@dataclass(frozen=True)
class EventFile:
    identity: str
    """Size and modification time (`sources.source_files`): a new identity means a rewritten file."""
    sha256: str | None = None
    """Its content hash: local files only (a remote folder's version is its listing)."""
    first_event: int | None = None
    """Its earliest event time as validation reads it (unix micros); None when no row has a
    readable time, or while a new file is not read yet."""
    last_event: int | None = None
    """Its latest event time, likewise."""


def fingerprinted(events: LineageInput, listed: dict[str, str] | None,
                  known: dict[str, EventFile]) -> tuple[LineageInput, dict[str, EventFile] | None]:
    """The events input with its version, and its files as `EventFile`s. Files in `known` with the
    same identity keep their hash and event times; the others are hashed (local files) and have
    no event times until read (`with_event_times`). A local file or folder's version is
    `files_fingerprint` of the hashes; any other source's version is the one it was read with."""
    if listed is None:
        return events, None
    local = events.kind == "files" and not is_uri(events.uri)
    files = {}
    for uri, identity in listed.items():
        earlier = known.get(uri)
        if earlier is not None and earlier.identity == identity and (earlier.sha256 or not local):
            files[uri] = earlier
        else:
            files[uri] = EventFile(identity, file_sha256(Path(comparable_path(uri))) if local else None)
    if local:
        root = Path(events.uri)
        hashes = {_relative(Path(comparable_path(uri)), root): item.sha256 for uri, item in files.items()}
        events = replace(events, version=files_fingerprint(hashes))
    return events, files


def event_times(frame, timestamp) -> dict[str, tuple[int | None, int | None]]:
    """Each file's first and latest `timestamp` (unix micros) in `frame`, a read of source files,
    by `comparable_path`; (None, None) for a file with no readable time. One Spark action; a
    Parquet read opens only the timestamp column."""
    from pyspark.sql import functions as F

    micros = F.unix_micros("ts")
    per_file = (frame.select(F.input_file_name().alias("file"), timestamp.alias("ts"))
                .groupBy("file").agg(F.min(micros).alias("first"), F.max(micros).alias("last")))
    # input_file_name gives a URL-encoded URI; the listing's names are not encoded
    return {comparable_path(unquote(row["file"])): (row["first"], row["last"]) for row in per_file.collect()}


def with_event_times(files: dict[str, EventFile], read: list[str],
                     found: dict[str, tuple[int | None, int | None]]) -> dict[str, EventFile]:
    """`files` with the event times `found` (`event_times`) for the files `read`: a file read
    but absent from `found` has no rows."""
    read = set(read)
    return {uri: _with_times(item, *found.get(comparable_path(uri), (None, None))) if uri in read else item
            for uri, item in files.items()}


def _with_times(item: EventFile, first: int | None, last: int | None) -> EventFile:
    return replace(item, first_event=first, last_event=last)


def comparable_path(uri: str) -> str:
    """A file's name as the listing, Delta's log and Spark's `input_file_name` all give it:
    file:/a, file:///a and /a are /a."""
    return re.sub(r"^file:/+", "/", uri)


def _relative(path: Path, root: Path) -> str:
    return path.name if path == root else str(path.relative_to(root))
