"""Versioned tables on a real local Spark + Delta: lineage in userMetadata, history, time travel."""

from __future__ import annotations

import pytest

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.spark import delta_maven_coordinates, remembered_delta_jars
from lumos.core.tables import (
    TableRef,
    read_table,
    table_history,
    write_table,
)
from lumos.core.workspace import open_workspace
from lumos.data.table_metadata import describe_table, list_tables


@pytest.fixture()
def workspace(tmp_path):
    return open_workspace(tmp_path)


def lineage(rows: int) -> LineageRecord:
    return LineageRecord(
        stage="test", config={"rows": rows}, config_hash=f"sha256:{rows}",
        inputs=[LineageInput("files", "/data/in", "sha256:abc")], stats={"rows": rows}, seed=7,
    )


def test_versions_carry_lineage_and_time_travel(spark, workspace):
    ref = TableRef.parse("demo.numbers")
    first = write_table(spark, workspace, ref, spark.range(3), lineage(3))
    second = write_table(spark, workspace, ref, spark.range(5), lineage(5))
    assert (first.version, second.version) == (0, 1)

    assert read_table(spark, workspace, ref).count() == 5
    assert sorted(row.id for row in read_table(spark, workspace, ref.at(0)).collect()) == [0, 1, 2]

    history = table_history(spark, workspace, ref)
    assert [entry.version for entry in history] == [1, 0]
    assert history[1].lineage == lineage(3).__class__.from_json(history[1].lineage.to_json())
    assert history[1].lineage.stats == {"rows": 3} and history[1].lineage.seed == 7
    assert history[1].lineage.inputs == [LineageInput("files", "/data/in", "sha256:abc")]

    details = describe_table(workspace, ref.at(0))
    assert details["rows"] == 3 and details["version"] == 0
    assert details["schema"] == [{"name": "id", "type": "bigint"}]
    assert details["lineage"]["config_hash"] == "sha256:3"
    assert list_tables(workspace) == ["demo.numbers"]


def test_missing_versions_and_tables_are_usage_errors(spark, workspace):
    ref = TableRef.parse("demo.small")
    write_table(spark, workspace, ref, spark.range(1), lineage(1))
    with pytest.raises(UsageError, match="latest version of demo.small is 0"):
        read_table(spark, workspace, ref.at(4))
    with pytest.raises(UsageError, match="no table demo.absent"):
        read_table(spark, workspace, TableRef.parse("demo.absent"))


@pytest.mark.parametrize("name", ["../etc.passwd", "demo", "demo.t@x", "demo.t;drop", "demo./x", "1a.b", "a.b.c"])
def test_table_names_are_validated(name):
    with pytest.raises(UsageError, match="not a table name"):
        TableRef.parse(name)


def test_table_refs_parse():
    assert TableRef.parse("qs.sequences@12") == TableRef("qs", "sequences", 12)
    assert str(TableRef.parse("qs.sequences")) == "qs.sequences"


def test_the_delta_log_reader_reports_the_history_spark_reports(spark, workspace):
    from lumos.data.table_metadata import table_history as logged_history

    ref = TableRef.parse("demo.logged")
    write_table(spark, workspace, ref, spark.range(2), lineage(2))
    write_table(spark, workspace, ref, spark.range(4), lineage(4))
    from_spark, from_log = table_history(spark, workspace, ref), logged_history(workspace, ref)
    assert [(e.version, e.operation, e.lineage) for e in from_log] == [(e.version, e.operation, e.lineage) for e in from_spark]
    assert describe_table(workspace, ref)["rows"] == 4 and describe_table(workspace, ref.at(0))["rows"] == 2
    with pytest.raises(UsageError, match="latest version of demo.logged is 1"):
        describe_table(workspace, ref.at(7))
    with pytest.raises(UsageError, match="no table demo.absent"):
        logged_history(workspace, TableRef.parse("demo.absent"))


def test_the_session_names_the_delta_jars_remembered_for_the_next_start(spark):
    # Whether this session resolved them through Ivy or named them from an earlier start, the next
    # local start names the same jars.
    jars = spark.sparkContext.getConf().get("spark.jars").split(",")
    assert any("delta-spark" in jar for jar in jars)
    assert remembered_delta_jars(delta_maven_coordinates()) == jars
