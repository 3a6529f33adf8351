"""Reading Delta tables without Spark: a version's files (`open_snapshot`), the history with its
lineage (`logged_history`), and the errors, on tables written by delta-rs itself.

Tables that Spark writes, every kind Lumos makes, are checked in tests/integration/test_delta_reads.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, write_deltalake

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageRecord
from lumos.core.tables import logged_history, open_delta_table
from lumos.data.delta_snapshot import open_snapshot


def lineage(number: int) -> LineageRecord:
    return LineageRecord(stage="test", config={"number": number}, config_hash=f"sha256:{number}", inputs=[])


def write(path: Path, ids: list[int], mode: str, number: int | None = None, **options) -> None:
    metadata = {"userMetadata": lineage(number).to_json()} if number is not None else {}
    write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64())}), mode=mode,
                    commit_properties=CommitProperties(custom_metadata=metadata), **options)


def test_a_snapshot_lists_each_version_s_live_files(tmp_path):
    write(tmp_path, [1, 2], "overwrite", 0)
    write(tmp_path, [3], "append", 1)
    write(tmp_path, [4, 5, 6], "overwrite", 2)
    first, second, latest = open_snapshot(tmp_path, 0), open_snapshot(tmp_path, 1), open_snapshot(tmp_path)
    assert (first.version, second.version, latest.version) == (0, 1, 2)
    first_paths, paths, latest_paths = ([data_file.path for data_file in snapshot.files] for snapshot in (first, second, latest))
    assert len(first_paths) == 1 and len(paths) == 2 and set(first_paths) < set(paths)
    assert not set(latest_paths) & set(paths)  # the overwrite removed them
    assert paths == sorted(paths) and all(Path(path).is_absolute() for path in paths)
    assert [data_file.size for data_file in second.files] == [Path(path).stat().st_size for path in paths]
    assert second.size_bytes == sum(Path(path).stat().st_size for path in paths)
    assert str(latest) == f"{tmp_path}@2" and latest.partition_columns == ()


def test_partition_folders_with_odd_values_are_the_files_on_disk(tmp_path):
    table = pa.table({"id": [1, 2, 3, 4], "k": ["a b", "x/y%z", "é=+&?#", None]})
    write_deltalake(tmp_path, table, partition_by=["k"])
    snapshot = open_snapshot(tmp_path)
    assert snapshot.partition_columns == ("k",) and len(snapshot.files) == 4
    assert all(Path(data_file.path).is_file() for data_file in snapshot.files)
    assert sorted((data_file.partition_values["k"] or "") for data_file in snapshot.files) == sorted(["a b", "x/y%z", "é=+&?#", ""])


def test_the_history_carries_each_commit_s_lineage_newest_first(tmp_path):
    write(tmp_path, [1], "overwrite", 0)
    write(tmp_path, [2], "append")  # not written by Lumos: no lineage
    write(tmp_path, [3], "overwrite", 2)
    history = logged_history(str(tmp_path))
    assert [entry.version for entry in history] == [2, 1, 0]
    assert [entry.lineage.config if entry.lineage else None for entry in history] == [{"number": 2}, None, {"number": 0}]
    assert history[0].operation == "WRITE" and history[0].timestamp.endswith("Z")
    assert [entry.version for entry in logged_history(str(tmp_path), limit=1)] == [2]


def test_missing_tables_and_versions_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="is not a Delta table"):
        open_snapshot(tmp_path / "absent")
    write(tmp_path, [1], "overwrite", 0)
    with pytest.raises(UsageError, match="no version 3; its versions are 0 … 0"):
        open_delta_table(str(tmp_path), 3)


def test_column_mapping_other_than_none_is_refused(tmp_path):
    write(tmp_path, [1], "overwrite", 0)
    # A commit that turns on column mapping by name, as Spark's ALTER TABLE would: the table's
    # columns then have physical names in the Parquet files that differ from their names.
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {
        "delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "id"}}]}
    log = tmp_path / "_delta_log"
    (metadata,) = [action for line in (log / f"{0:020d}.json").read_text().splitlines()
                   if "metaData" in (action := json.loads(line))]
    metadata["metaData"].update(schemaString=json.dumps(schema), configuration={
        "delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "1"})
    protocol = {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}
    commit = [{"commitInfo": {"operation": "SET TBLPROPERTIES"}}, protocol, metadata]
    (log / f"{1:020d}.json").write_text("\n".join(json.dumps(action) for action in commit) + "\n")
    assert open_snapshot(tmp_path, 0).version == 0
    with pytest.raises(UsageError, match=rf"{tmp_path.name}.*column mapping mode 'name'"):
        open_snapshot(tmp_path)


def test_reproduce_checks_a_delta_input_against_its_latest_version(tmp_path):
    from lumos.core.lineage import LineageInput
    from lumos.experiments.reproduce import check_inputs

    write(tmp_path / "events", [1], "overwrite", 0)
    read = LineageInput("delta", str(tmp_path / "events"), 0)
    assert check_inputs([read]) == ([], [])
    write(tmp_path / "events", [2], "append", 1)
    assert check_inputs([read]) == ([f"{tmp_path / 'events'}: the Delta table is at version 1; version 0 was read"], [])
    gone = LineageInput("delta", str(tmp_path / "absent"), 0)
    assert check_inputs([gone]) == ([f"{tmp_path / 'absent'}: the Delta table is gone (version 0 was read)"], [])
