"""Replace a Delta table's contents with Parquet files already written into its folder.

Spark's own writer turns rows into Parquet one value at a time (about 30M values a second here):
most of an ingest's write. Lumos's time-split rows are built in Arrow by Python workers, which
write them as Parquet directly (`lumos.data.time_rows.write_rows`); this module then makes those
files one Delta version through Delta's own transaction (`DeltaLog.startTransaction` →
`OptimisticTransaction.commit`), reached through py4j: the same optimistic concurrency, log
format, protocol and commit info as a `DataFrame.write.format("delta")` overwrite, operation
WRITE with mode Overwrite. Delta has no public API for committing files it did not write, so
this uses its Scala classes (delta-spark 4.4); `tests/integration/test_delta_commit.py` pins them.

Actions are built as Delta's JSON and parsed by Delta itself (`Action.fromJson`), which keeps the
py4j surface to a few calls. Files are added without per-file statistics (Delta's data skipping
then reads every file of the table, as Lumos's readers do anyway).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WrittenFile:
    name: str
    """Path relative to the table's folder (no partition folders: Lumos's tables are unpartitioned)."""
    size: int
    """Bytes."""
    modified_ms: int
    """Modification time, epoch milliseconds."""


def commit_overwrite(spark, location: str, files: Sequence[WrittenFile], schema_json: str,
                     configuration: Mapping[str, str], user_metadata: str) -> int:
    """One Delta commit at `location` that removes every live file and adds `files`, with the
    table's schema set to `schema_json` (a Spark StructType's JSON; overwriteSchema) and
    `configuration` merged into its properties. Creates the table when it does not exist.
    Returns the version committed."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location)
    transaction = log.startTransaction()
    current = transaction.metadata()
    existing = dict(jvm.scala.jdk.javaapi.CollectionConverters.asJava(current.configuration()))
    is_new = transaction.readVersion() < 0
    metadata = {
        "id": str(uuid.uuid4()) if is_new else current.id(),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_json,
        "partitionColumns": [],
        "configuration": {**existing, **configuration},
        "createdTime": int(time.time() * 1000) if is_new else _created_time(current),
    }
    action = jvm.org.apache.spark.sql.delta.actions.Action.fromJson
    transaction.updateMetadata(action(json.dumps({"metaData": metadata})), False)
    actions = [action(json.dumps({"add": {"path": file.name, "partitionValues": {}, "size": file.size,
                                          "modificationTime": file.modified_ms, "dataChange": True}}))
               for file in files]
    live = transaction.filterFiles().iterator()
    while live.hasNext():
        actions.append(live.next().remove())
    return transaction.commit(_scala_list(jvm, actions), _overwrite(jvm, user_metadata))


def _created_time(metadata) -> int | None:
    created = metadata.createdTime()
    return created.get() if created.isDefined() else None


def _scala_list(jvm, items: list):
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(jvm.java.util.ArrayList(items)).toList()


def _overwrite(jvm, user_metadata: str):
    """DeltaOperations.Write(mode = Overwrite, userMetadata = Some(user_metadata)), the other
    fields at their defaults: what a DataFrame overwrite records in the commit info."""
    write = getattr(getattr(jvm.org.apache.spark.sql.delta.DeltaOperations, "Write$"), "MODULE$")
    default = [getattr(write, f"apply$default${index}")() for index in range(2, 10)]
    default[2] = jvm.scala.Option.apply(user_metadata)  # the 4th field: userMetadata
    return write.apply(jvm.org.apache.spark.sql.SaveMode.Overwrite, *default)
