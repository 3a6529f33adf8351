"""delta-rs (`deltalake`) reads every kind of table Lumos writes exactly as Spark does.

Lumos writes with Spark and reads without it (the training loader, `lumos data …`, lineage):
this builds each table through Lumos's own writers, with several versions, an overwrite, a
schema change and a checkpoint, and compares every version as Spark sees it (the files it
reads, its row count, DESCRIBE HISTORY's userMetadata) with what `deltalake` reports.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable as RustDeltaTable

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageRecord
from lumos.core.tables import (
    TableRef,
    logged_history,
    parse_lineage,
    read_table,
    table_location,
    write_arrow_table,
    write_table,
)
from lumos.core.workspace import init_workspace, open_workspace
from lumos.data.delta_snapshot import open_snapshot
from lumos.data.predictions import write_partition
from lumos.data.synthetic import SyntheticSpec
from lumos.data.table_metadata import describe_table

DATASET = "quickstart"
# Every table Lumos writes, and how: ingest's three (hand-made commits of Parquet written by
# Python workers or pyarrow, and Spark overwrites), inference's two (Spark replaceWhere on a date
# partition). Lumos writes no other table.
TABLES = ("sequences", "vocab", "rejects", "predictions", "infer_rejects")
DAYS = [datetime.date(2026, 9, day) for day in (12, 13, 14)]


def lineage(stage: str, number: int) -> LineageRecord:
    return LineageRecord(stage=stage, config={"number": number}, config_hash=f"sha256:{number}", inputs=[])


@pytest.fixture(scope="module")
def workspace(spark, ingest_quickstart, tmp_path_factory):
    key = "spark.databricks.delta.snapshotPartitions"  # 50 by default: seconds per commit on two cores
    saved = spark.conf.get(key, None)
    spark.conf.set(key, "2")
    folder = tmp_path_factory.mktemp("delta_reads")
    init_workspace(folder)
    ingest_quickstart(folder, SyntheticSpec(users=40, events=1_500, seed=3), 12)
    workspace = open_workspace(folder)
    _more_ingest_versions(spark, workspace)
    _inference_versions(spark, workspace)
    yield workspace
    spark.conf.unset(key) if saved is None else spark.conf.set(key, saved)


def _more_ingest_versions(spark, workspace) -> None:
    """Overwrites of ingest's tables by the writers ingest uses: 11 more vocab versions through
    pyarrow files and a hand-made commit (Delta checkpoints at version 10), Spark overwrites of
    sequences and rejects (one of them empty)."""
    vocab = TableRef(DATASET, "vocab")
    vocab_frame = read_table(spark, workspace, vocab.at(0))
    vocab_rows = pq.read_table([name.removeprefix("file:") for name in vocab_frame.inputFiles()])
    for number in range(1, 12):
        write_arrow_table(spark, workspace, vocab, vocab_rows.slice(0, 3 * number), vocab_frame.schema,
                          lineage("ingest", number))
    sequences = TableRef(DATASET, "sequences")
    for number in (1, 2):
        write_table(spark, workspace, sequences, read_table(spark, workspace, sequences.at(0)).limit(10 * number),
                    lineage("ingest", number))
    rejects = TableRef(DATASET, "rejects")
    schema = read_table(spark, workspace, rejects.at(0)).schema
    write_table(spark, workspace, rejects, spark.createDataFrame([], schema), lineage("ingest", 1))
    write_table(spark, workspace, rejects, read_table(spark, workspace, sequences.at(0)).selectExpr(
        "user_id", "'bad_row' as rule").limit(7), lineage("ingest", 2))


def _inference_versions(spark, workspace) -> None:
    """Three dates, one of them replaced, and a run that adds a column (mergeSchema)."""
    for number, day in enumerate([*DAYS, DAYS[1]]):
        head = ["cast(0.5 as float) as p_value_7d"] if number == 3 else []
        predictions = spark.range(5 + number).selectExpr(
            "cast(id as string) as user_id", "'quickstart/1' as model", "cast(0.25 as float) as p_act_7d", *head,
            f"date'{day.isoformat()}' as as_of")
        write_partition(spark, workspace, TableRef(DATASET, "predictions"), predictions, day, lineage("infer", number))
        rejects = spark.range(number).selectExpr("cast(id as string) as user_id", "'unknown_user' as rule",
                                                 f"date'{day.isoformat()}' as as_of")
        write_partition(spark, workspace, TableRef(DATASET, "infer_rejects"), rejects, day, lineage("infer", number))


def spark_history(spark, location: str) -> dict[int, str | None]:
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{location}`").select("version", "userMetadata").collect()
    return {row["version"]: row["userMetadata"] for row in rows}


def spark_version(spark, location: str, version: int) -> tuple[list[str], int]:
    frame = spark.read.format("delta").option("versionAsOf", version).load(location)
    return sorted(name.removeprefix("file:") for name in frame.inputFiles()), frame.count()


@pytest.mark.parametrize("name", TABLES)
def test_deltalake_reads_every_version_as_spark_does(spark, workspace, name):
    location = table_location(workspace, TableRef(DATASET, name))
    history = spark_history(spark, location)
    latest = RustDeltaTable(location)
    assert latest.version() == max(history) >= 1
    # userMetadata is where Lumos keeps each version's lineage.
    assert {entry["version"]: entry.get("userMetadata") for entry in latest.history()} == history
    for version in sorted(history):
        table = RustDeltaTable(location, version=version)
        files, rows = spark_version(spark, location, version)
        assert table.version() == version
        assert sorted(table.file_uris()) == files, (name, version)
        assert table.to_pyarrow_dataset().count_rows() == rows, (name, version)
        # And Lumos's readers, built on it: the loader's file listing, `lumos data show`.
        assert [data_file.path for data_file in open_snapshot(location, version).files] == files, (name, version)
        assert describe_table(workspace, TableRef(DATASET, name, version))["rows"] == rows, (name, version)
    assert {entry.version: entry.lineage for entry in logged_history(location)} == {
        version: parse_lineage(metadata) for version, metadata in history.items()}
    # No feature that the file-level readers (pyarrow on the listed files) would have to apply.
    protocol = latest.protocol()
    assert "deletionVectors" not in (protocol.reader_features or [])
    assert latest.metadata().configuration.get("delta.columnMapping.mode", "none") == "none"


def test_lumos_tables_cover_overwrites_a_checkpoint_and_a_schema_change(spark, workspace):
    vocab = Path(table_location(workspace, TableRef(DATASET, "vocab")))
    assert (vocab / "_delta_log" / f"{10:020d}.checkpoint.parquet").is_file()
    predictions = table_location(workspace, TableRef(DATASET, "predictions"))
    newest, before = RustDeltaTable(predictions), RustDeltaTable(predictions, version=2)
    assert "p_value_7d" in newest.schema().to_arrow().names and "p_value_7d" not in before.schema().to_arrow().names
    assert newest.metadata().partition_columns == ["as_of"]
    # The replaced date holds the second run's files only.
    day = f"as_of={DAYS[1].isoformat()}"
    first, second = ({uri for uri in table.file_uris() if day in uri} for table in (before, newest))
    assert first and second and not first & second


def test_a_version_with_deletion_vectors_is_refused_by_the_file_listing(spark, tmp_path):
    # Lumos writes none (above); a table someone else deleted rows from with Spark could have them.
    path = str(tmp_path / "deleted")
    spark.range(10, numPartitions=1).write.format("delta").option("delta.enableDeletionVectors", "true").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
    assert len(open_snapshot(path, 0).files) == 1
    with pytest.raises(UsageError, match="deletion vectors"):
        open_snapshot(path)
