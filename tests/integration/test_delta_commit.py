"""Parquet files written outside Spark, committed as a Delta version through Delta's own
transaction (`lumos.core.delta_commit`): what Spark, Delta's history and Lumos's log reader see."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lumos.core.delta_commit import WrittenFile
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.tables import (
    LOG_RETENTION,
    TableRef,
    commit_table_files,
    read_table,
    table_history,
    table_location,
    write_table,
)
from lumos.core.workspace import open_workspace
from lumos.data.delta_snapshot import open_snapshot

SCHEMA = "id int, tags array<int>"


@pytest.fixture()
def workspace(tmp_path):
    return open_workspace(tmp_path)


def lineage(rows: int) -> LineageRecord:
    return LineageRecord(stage="test", config={"rows": rows}, config_hash=f"sha256:{rows}",
                         inputs=[LineageInput("files", "/data/in", "sha256:abc")], stats={"rows": rows})


def write_parquet(folder: str, ids: list[int]) -> WrittenFile:
    os.makedirs(folder, exist_ok=True)
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    table = pa.table({"id": pa.array(ids, pa.int32()), "tags": pa.array([[i, i + 1] for i in ids], pa.list_(pa.int32()))})
    pq.write_table(table, os.path.join(folder, name))
    stat = os.stat(os.path.join(folder, name))
    return WrittenFile(name, stat.st_size, int(stat.st_mtime * 1000))


def test_committed_files_become_a_version_that_replaces_the_table(spark, workspace):
    ref = TableRef.parse("demo.tags")
    folder = table_location(workspace, ref)
    schema = spark.createDataFrame([], SCHEMA).schema

    # A new table, from two files.
    first = commit_table_files(spark, workspace, ref, [write_parquet(folder, [1, 2]), write_parquet(folder, [3])],
                               schema, lineage(3))
    assert first == ref.at(0)
    assert sorted((row.id, list(row.tags)) for row in read_table(spark, workspace, ref).collect()) == [
        (1, [1, 2]), (2, [2, 3]), (3, [3, 4])]

    # Over a version Spark wrote: its files are removed, the properties kept, the schema replaced.
    write_table(spark, workspace, ref, spark.createDataFrame([(9, "x")], "id int, other string"), lineage(1))
    spark.sql(f"ALTER TABLE delta.`{folder}` SET TBLPROPERTIES ('lumos.test' = 'kept')")
    record = lineage(1)
    third = commit_table_files(spark, workspace, ref, [write_parquet(folder, [7])], schema, record)
    assert third == ref.at(3)
    latest = read_table(spark, workspace, ref)
    assert latest.schema == schema and [(row.id, list(row.tags)) for row in latest.collect()] == [(7, [7, 8])]
    assert read_table(spark, workspace, ref.at(1)).columns == ["id", "other"]  # time travel still reads it
    assert len(read_table(spark, workspace, ref.at(0)).collect()) == 3

    properties = {row["key"]: row["value"] for row in spark.sql(f"SHOW TBLPROPERTIES delta.`{folder}`").collect()}
    assert properties["lumos.test"] == "kept"
    assert all(properties[key] == value for key, value in LOG_RETENTION.items())

    # The commit reads like a DataFrame overwrite, with the lineage: in Delta's history and in
    # the log that Lumos's readers (delta-rs) read.
    history = table_history(spark, workspace, ref)
    assert history[0].version == 3 and history[0].operation == "WRITE"
    assert history[0].lineage.record_id == record.record_id
    delta_history = spark.sql(f"DESCRIBE HISTORY delta.`{folder}`").where("version = 3").first()
    assert delta_history["operationParameters"]["mode"] == "Overwrite"
    files = open_snapshot(folder).files
    assert len(files) == 1 and pq.read_table(files[0].path).column("id").to_pylist() == [7]
