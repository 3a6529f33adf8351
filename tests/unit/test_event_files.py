"""The events source's version computed file by file (`event_files.fingerprinted`): an
incremental night hashes its new files only, and gets the value a full night's hashing of every
file gives; a recorded file that changed makes the night a full rebuild."""

from __future__ import annotations

import datetime
from pathlib import Path

from lumos.core.lineage import LineageInput
from lumos.core.tables import TableRef
from lumos.data.event_files import EventFile, comparable_path, fingerprinted, with_event_times
from lumos.data.sources import file_sha256, files_fingerprint
from lumos.data.user_state import StateKey, StateVersion, _rebuild_reason


def listing(folder: Path) -> dict[str, str]:
    """What `sources.source_files` gives for a local folder: Hadoop's file:/ URIs, size:mtime."""
    return {f"file:{path}": f"{path.stat().st_size}:{path.stat().st_mtime_ns // 1_000_000}"
            for path in sorted(folder.glob("*.csv"))}


def test_a_night_hashes_only_files_it_has_not_recorded(tmp_path):
    (tmp_path / "day-1.csv").write_text("user_id,ts\nu1,2026-09-01\n")
    (tmp_path / "day-2.csv").write_text("user_id,ts\nu2,2026-09-02\n")
    events = LineageInput("files", str(tmp_path), "")
    first, recorded = fingerprinted(events, listing(tmp_path), known={})
    assert first.version == files_fingerprint({"day-1.csv": file_sha256(tmp_path / "day-1.csv"),
                                               "day-2.csv": file_sha256(tmp_path / "day-2.csv")})

    (tmp_path / "day-3.csv").write_text("user_id,ts\nu3,2026-09-03\n")
    listed = listing(tmp_path)
    everything, _ = fingerprinted(events, listed, known={})  # a full night hashes every file
    # The recorded files are not opened again: with their bytes gone, the version is the same.
    (tmp_path / "day-1.csv").unlink()
    (tmp_path / "day-2.csv").unlink()
    tonight, files = fingerprinted(events, listed, known=recorded)
    assert tonight.version == everything.version != first.version
    new = f"file:{tmp_path / 'day-3.csv'}"
    assert files[new].sha256 == file_sha256(tmp_path / "day-3.csv") and files[new].last_event is None
    assert {uri: item for uri, item in files.items() if uri != new} == recorded


def test_a_recorded_file_with_a_new_size_or_time_is_hashed_again_and_rebuilds(tmp_path):
    (tmp_path / "day-1.csv").write_text("user_id,ts\nu1,2026-09-01\n")
    events = LineageInput("files", str(tmp_path), "")
    first, recorded = fingerprinted(events, listing(tmp_path), known={})
    (tmp_path / "day-1.csv").write_text("user_id,ts\nu1,2026-09-01\nu9,2026-09-01\n")  # rewritten in place
    listed = listing(tmp_path)
    tonight, _ = fingerprinted(events, listed, known=recorded)
    assert tonight.version != first.version

    day = datetime.date(2026, 9, 2)
    key = StateKey("sha256:recipe", "quickstart.vocab@0", str(tmp_path), 21)
    previous = StateVersion(TableRef("quickstart", "user_state", 0), day, key, first, recorded)
    assert "rewritten, not appended" in _rebuild_reason(previous, key, day, tonight, listed)


def test_event_times_are_set_for_the_files_read_only():
    files = {"file:/e/a.csv": EventFile("1:1", "s", 2, 5), "file:/e/b.csv": EventFile("2:2", "t")}
    found = {"/e/b.csv": (7, 9)}  # as `event_times` names files: Spark's file:///e/b.csv
    assert comparable_path("file:///e/b.csv") == comparable_path("file:/e/b.csv") == "/e/b.csv"
    assert with_event_times(files, ["file:/e/b.csv"], found) == {
        "file:/e/a.csv": EventFile("1:1", "s", 2, 5), "file:/e/b.csv": EventFile("2:2", "t", 7, 9)}
    assert with_event_times(files, ["file:/e/a.csv"], {})["file:/e/a.csv"] == EventFile("1:1", "s")  # read: no rows
