"""Time-split sequences rows written as Parquet by the Python workers that build them.

`build_sequences` hands its Arrow-built rows back to the JVM, where ingest cached them and Spark's
writer turned them into Parquet one value at a time: at 4M events about 6 s of a 26 s ingest,
and the cache a few more, for 19.4M history tokens × 11 features. Here each partition's builder
(`time_rows.write_rows`) writes its rows straight to a Parquet file in the table's folder, and
ingest commits those files as the new version (`lumos.core.tables.commit_table_files`) once it
has read them back for their counts and content hash. Same rows, same schema, same content hash
as `build_sequences` (the tests hold them to it). Local workspaces only: the workers write with
pyarrow's local filesystem, while a remote root's credentials are Spark's.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa

from lumos.core.arrow_hash import as_bigint, content_hash_of
from lumos.core.delta_commit import WrittenFile
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import EPOCH, future_context, output_columns, time_rows_input
from lumos.data.time_rows import MICROS_PER_DAY, SplitSummary, TimeRowsPlan, write_rows

WRITTEN = "name string, size bigint, modified_ms bigint, split string, rows bigint, tokens bigint, hash bigint"
"""One row per file and split it holds: the file, and what it holds of the split."""


@dataclass
class SequenceFiles:
    """Rows written into a table's folder, not yet a version of it."""

    folder: Path
    files: list[WrittenFile]
    schema: object
    """The Spark schema of the rows (`build_sequences`'), which the Delta commit records."""
    splits: dict[str, SplitSummary]
    """Split → its rows, tokens and content hash, summed over the files."""

    @property
    def content_hash(self) -> str:
        """`arrow_hash.content_hash_of` the rows, as the writers hashed them."""
        return content_hash_of(sum(split.hash for split in self.splits.values()),
                               sum(split.rows for split in self.splits.values()))

    def frame(self, spark):
        """The rows, read back from the files by Spark."""
        if not self.files:
            return spark.createDataFrame([], self.schema)
        return spark.read.schema(self.schema).parquet(*[str(self.folder / file.name) for file in self.files])

    def discard(self) -> None:
        """Delete the files (when the ingest fails before committing them)."""
        for file in self.files:
            (self.folder / file.name).unlink(missing_ok=True)


def write_sequence_files(events, vocab, users, calendar, recipe: IngestRecipe, folder: str) -> SequenceFiles:
    """The rows of `build_sequences(events, vocab, users, calendar, recipe)` (a time-split
    recipe), written as one Parquet file per partition into the local `folder`."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tokens, plan = time_rows_input(events, vocab, users, recipe, targets=True)
    schema = sequences_schema(plan, recipe)
    dates = [cutoff.as_of for cutoff in recipe.splits.cutoffs]
    future = {(date - EPOCH).days * MICROS_PER_DAY: flags
              for date, flags in future_context(calendar, recipe, dates).items()}
    local = Path(folder.removeprefix("file:"))
    local.mkdir(parents=True, exist_ok=True)
    write = partial(_write_partition, plan, str(local), to_arrow_schema(schema, timezone="UTC"), future)
    written = tokens.mapInArrow(write, WRITTEN).collect()
    files = sorted({WrittenFile(row["name"], row["size"], row["modified_ms"]) for row in written},
                   key=lambda file: file.name)
    splits = {}
    for row in written:
        part = SplitSummary(row["rows"], row["tokens"], row["hash"] % 2**64)
        splits[row["split"]] = splits.get(row["split"], SplitSummary()).add(part)
    return SequenceFiles(local, files, schema, dict(sorted(splits.items())))


def sequences_schema(plan: TimeRowsPlan, recipe: IngestRecipe):
    """The Spark schema of `build_sequences`' rows for a time-split recipe (the test holds them
    equal), without analysing that plan: half a second of the driver's time at every ingest."""
    from pyspark.sql import types as T

    types = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType(), "float": T.FloatType(),
             "double": T.DoubleType(), "timestamp": T.TimestampType(), "array<int>": T.ArrayType(T.IntegerType()),
             "array<float>": T.ArrayType(T.FloatType())}
    built = {**dict(plan.columns()), "as_of": "timestamp"}

    def field(name: str):
        if name.startswith("future_"):  # coalesced with a constant array: never null, nor its values
            return T.StructField(name, T.ArrayType(T.IntegerType(), containsNull=False), nullable=False)
        return T.StructField(name, types[built[name]])

    return T.StructType([field(name) for name in output_columns(recipe)])


def _write_partition(plan: TimeRowsPlan, folder: str, schema: pa.Schema, future: dict, batches):
    """The mapInArrow function: one file per partition, named by the partition first (the loader
    reads files in path order, as it does Spark's part-NNNNN files)."""
    from pyspark import TaskContext

    name = f"part-{TaskContext.get().partitionId():05d}-{uuid.uuid4()}-c000.snappy.parquet"
    path = os.path.join(folder, name)
    splits = write_rows(plan, path, schema, future, batches)
    if splits:
        stat = os.stat(path)
        yield pa.RecordBatch.from_pydict({  # WRITTEN's types
            "name": [name] * len(splits), "size": [stat.st_size] * len(splits),
            "modified_ms": [int(stat.st_mtime * 1000)] * len(splits), "split": list(splits),
            "rows": [part.rows for part in splits.values()], "tokens": [part.tokens for part in splits.values()],
            "hash": [as_bigint(part.hash) for part in splits.values()]})
