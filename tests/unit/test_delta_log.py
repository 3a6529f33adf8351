"""The pure-Python Delta log reader on hand-written logs: replay, checkpoints, paths, refusals.

A real Spark-written log (with a checkpoint Spark made) is checked in tests/integration/test_loader.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lumos.data.delta_log import (
    DeltaLogError,
    UnsupportedDeltaFeature,
    active_files,
    commit_info,
    latest_version,
)

SCHEMA = json.dumps({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]})
PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
METADATA = {"metaData": {"id": "t", "format": {"provider": "parquet", "options": {}}, "schemaString": SCHEMA,
                         "partitionColumns": [], "configuration": {}}}


def add(path: str, size: int = 10, **extra) -> dict:
    return {"add": {"path": path, "partitionValues": {}, "size": size, "modificationTime": 0, "dataChange": True, **extra}}


def remove(path: str) -> dict:
    return {"remove": {"path": path, "deletionTimestamp": 0, "dataChange": True}}


def write_commit(table: Path, version: int, *actions: dict) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [{"commitInfo": {"operation": "WRITE", "userMetadata": f"v{version}"}}, *actions]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


# A checkpoint in the shape Spark writes: one row per action, one struct column per action kind.
CHECKPOINT_SCHEMA = pa.schema([
    ("add", pa.struct([("path", pa.string()), ("partitionValues", pa.map_(pa.string(), pa.string())),
                       ("size", pa.int64()), ("stats", pa.string()),
                       ("deletionVector", pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string())]))])),
    ("remove", pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64())])),
    ("metaData", pa.struct([("id", pa.string()), ("format", pa.struct([("provider", pa.string()),
                                                                       ("options", pa.map_(pa.string(), pa.string()))])),
                            ("schemaString", pa.string()), ("partitionColumns", pa.list_(pa.string())),
                            ("configuration", pa.map_(pa.string(), pa.string()))])),
    ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32()),
                            ("readerFeatures", pa.list_(pa.string()))])),
])


def checkpoint_rows(*actions: dict) -> list[dict]:
    rows = []
    for action in actions:
        (kind, body), = action.items()
        body = dict(body)
        for key in ("partitionValues", "configuration"):
            if key in body:
                body[key] = list(body[key].items())
        if kind == "metaData":
            body["format"] = {"provider": "parquet", "options": []}
        rows.append({kind: body})
    return rows


def write_checkpoint(table: Path, version: int, *actions: dict, parts: int = 1) -> None:
    rows = checkpoint_rows(*actions)
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    if parts == 1:
        pq.write_table(pa.Table.from_pylist(rows, schema=CHECKPOINT_SCHEMA), log / f"{version:020d}.checkpoint.parquet")
        return
    for part in range(parts):
        chunk = rows[part::parts]
        name = f"{version:020d}.checkpoint.{part + 1:010d}.{parts:010d}.parquet"
        pq.write_table(pa.Table.from_pylist(chunk, schema=CHECKPOINT_SCHEMA), log / name)


def names(snapshot) -> list[str]:
    return [Path(data_file.path).name for data_file in snapshot.files]


def test_commits_replay_adds_and_removes_by_path(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet", 1), add("b.parquet", 2))
    write_commit(tmp_path, 1, remove("a.parquet"), add("c.parquet", 3))
    write_commit(tmp_path, 2, remove("b.parquet"), remove("c.parquet"), add("d.parquet", 4))

    assert latest_version(tmp_path) == 2
    assert names(active_files(tmp_path, 0)) == ["a.parquet", "b.parquet"]
    assert names(active_files(tmp_path, 1)) == ["b.parquet", "c.parquet"]
    latest = active_files(tmp_path)
    assert latest.version == 2 and names(latest) == ["d.parquet"]
    assert latest.files[0].path == str(tmp_path.resolve() / "d.parquet") and latest.files[0].size == 4
    assert latest.schema["fields"][0]["name"] == "id"
    assert commit_info(tmp_path, 1)["userMetadata"] == "v1"
    assert commit_info(tmp_path, 7) is None


def test_paths_are_url_decoded_and_file_uris_accepted(tmp_path):
    absolute = tmp_path.resolve() / "elsewhere" / "e f.parquet"
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("k=a%20b/x%252Fy.parquet"), add(f"file:{str(absolute).replace(' ', '%20')}"))
    write_commit(tmp_path, 1, remove(f"file://{tmp_path.resolve()}/k=a%20b/x%252Fy.parquet"))
    assert [f.path for f in active_files(tmp_path, 0).files] == sorted([str(absolute), str(tmp_path.resolve() / "k=a b" / "x%2Fy.parquet")])
    assert [f.path for f in active_files(f"file:{tmp_path}", 1).files] == [str(absolute)]


def test_replay_starts_at_the_newest_checkpoint_at_or_before_the_version(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"))
    write_commit(tmp_path, 1, add("b.parquet"))
    # Checkpoint 1: the commits before it may be cleaned up; its removes are tombstones only.
    write_checkpoint(tmp_path, 1, PROTOCOL, METADATA, add("a.parquet", 5), add("b.parquet", 6), remove("old.parquet"))
    (tmp_path / "_delta_log" / f"{0:020d}.json").unlink()
    write_commit(tmp_path, 2, remove("a.parquet"), add("c.parquet"))

    assert names(active_files(tmp_path, 1)) == ["a.parquet", "b.parquet"]
    assert [f.size for f in active_files(tmp_path, 1).files] == [5, 6]
    assert names(active_files(tmp_path, 2)) == ["b.parquet", "c.parquet"]
    with pytest.raises(DeltaLogError, match="commit 0 is missing"):
        active_files(tmp_path, 0)


def test_multi_part_checkpoints_count_only_when_complete(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"), add("b.parquet"), add("c.parquet"))
    write_checkpoint(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"), add("b.parquet"), add("c.parquet"), parts=2)
    (tmp_path / "_delta_log" / f"{0:020d}.json").unlink()
    assert names(active_files(tmp_path, 0)) == ["a.parquet", "b.parquet", "c.parquet"]

    write_commit(tmp_path, 1, remove("a.parquet"))
    write_commit(tmp_path, 2, remove("b.parquet"))
    write_checkpoint(tmp_path, 2, PROTOCOL, METADATA, add("c.parquet"), add("zzz.parquet"), parts=2)
    (tmp_path / "_delta_log" / f"{2:020d}.checkpoint.{2:010d}.{2:010d}.parquet").unlink()  # a torn write
    assert names(active_files(tmp_path, 2)) == ["c.parquet"]  # replayed from checkpoint 0 + commits


def test_missing_version_and_missing_log_are_clear(tmp_path):
    with pytest.raises(Exception, match="not a Delta table"):
        active_files(tmp_path)
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"))
    with pytest.raises(Exception, match="no version 3; its versions are 0 … 0"):
        active_files(tmp_path, 3)


def test_deletion_vectors_on_an_add_are_refused(tmp_path):
    features = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"]}}
    write_commit(tmp_path, 0, features, METADATA, add("a.parquet"))
    assert names(active_files(tmp_path)) == ["a.parquet"]  # the feature alone is fine
    write_commit(tmp_path, 1, remove("a.parquet"), add("a.parquet", deletionVector={"storageType": "u", "pathOrInlineDv": "x"}))
    with pytest.raises(UnsupportedDeltaFeature, match=rf"{tmp_path.name}.*deletion vector"):
        active_files(tmp_path)


def test_deletion_vectors_in_a_checkpoint_are_refused(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"))
    write_checkpoint(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet", deletionVector={"storageType": "u", "pathOrInlineDv": "x"}))
    with pytest.raises(UnsupportedDeltaFeature, match="deletion vector"):
        active_files(tmp_path)


def test_column_mapping_other_than_none_is_refused(tmp_path):
    mapped = {"metaData": {**METADATA["metaData"], "configuration": {"delta.columnMapping.mode": "name"}}}
    protocol = {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}
    write_commit(tmp_path, 0, protocol, mapped, add("a.parquet"))
    with pytest.raises(UnsupportedDeltaFeature, match=rf"{tmp_path.name}.*column mapping mode 'name'"):
        active_files(tmp_path)


@pytest.mark.parametrize("feature", ["v2Checkpoint", "typeWidening", "catalogManaged"])
def test_unknown_reader_features_are_refused(tmp_path, feature):
    protocol = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz", feature]}}
    write_commit(tmp_path, 0, protocol, METADATA, add("a.parquet"))
    with pytest.raises(UnsupportedDeltaFeature, match=rf"{tmp_path.name}.*reader feature {feature}"):
        active_files(tmp_path)


def test_v2_checkpoints_are_refused(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("a.parquet"))
    write_commit(tmp_path, 1, add("b.parquet"))
    (tmp_path / "_delta_log" / f"{1:020d}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.json").write_text("{}\n")
    assert names(active_files(tmp_path, 0)) == ["a.parquet"]
    with pytest.raises(UnsupportedDeltaFeature, match="v2 checkpoint"):
        active_files(tmp_path, 1)


def test_remote_data_files_are_refused(tmp_path):
    write_commit(tmp_path, 0, PROTOCOL, METADATA, add("s3://bucket/a.parquet"))
    with pytest.raises(UnsupportedDeltaFeature, match="not on the local filesystem"):
        active_files(tmp_path)
    with pytest.raises(UnsupportedDeltaFeature, match="only local tables"):
        active_files("s3://bucket/table")
