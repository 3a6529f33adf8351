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
import pyarrow.compute as pc

from lumos.core import arrow_hash
from lumos.core.arrow_hash import as_bigint
from lumos.core.delta_commit import WrittenFile
from lumos.core.tables import content_hash_of
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import EPOCH, future_context, output_columns, time_rows_input
from lumos.data.time_rows import MICROS_PER_DAY, SplitSummary, TimeRowsPlan, write_rows

WRITTEN = ("name string, size bigint, modified_ms bigint, split string, rows bigint, tokens bigint, hash bigint, "
           "users bigint")
"""One row per file and split it holds: the file, what it holds of the split, and on the first
row the users its partition read (a partition that wrote no rows: one row of users only)."""


@dataclass
class SequenceFiles:
    """Rows written into a table's folder, not yet a version of it."""

    folder: Path
    files: list[WrittenFile]
    schema: object
    """The Spark schema of the rows (`build_sequences`'), which the Delta commit records."""
    splits: dict[str, SplitSummary]
    """Split → its rows, tokens and content hash, summed over the files."""
    users: int
    """Users the writers read tokens of: every user with valid events."""

    @property
    def content_hash(self) -> str:
        """The rows' `arrow_hash` content hash, as the writers hashed them."""
        return content_hash_of(sum(split.hash for split in self.splits.values()),
                               sum(split.rows for split in self.splits.values()), arrow_hash.ALGORITHM)

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
    files = sorted({WrittenFile(row["name"], row["size"], row["modified_ms"]) for row in written if row["name"]},
                   key=lambda file: file.name)
    splits = {}
    for row in written:
        if row["split"] is not None:
            part = SplitSummary(row["rows"], row["tokens"], row["hash"] % 2**64)
            splits[row["split"]] = splits.get(row["split"], SplitSummary()).add(part)
    users = sum(row["users"] for row in written)  # a user's tokens are all in one partition
    return SequenceFiles(local, files, schema, dict(sorted(splits.items())), users)


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
    counted = _CountedUsers(batches)
    splits = write_rows(plan, path, schema, future, counted)
    if not splits:
        if counted.users:
            yield pa.RecordBatch.from_pydict({"name": [None], "size": [0], "modified_ms": [0], "split": [None],
                                              "rows": [0], "tokens": [0], "hash": [0], "users": [counted.users]},
                                             schema=_WRITTEN_ARROW)
        return
    stat = os.stat(path)
    yield pa.RecordBatch.from_pydict({
        "name": [name] * len(splits), "size": [stat.st_size] * len(splits),
        "modified_ms": [int(stat.st_mtime * 1000)] * len(splits), "split": list(splits),
        "rows": [part.rows for part in splits.values()], "tokens": [part.tokens for part in splits.values()],
        "hash": [as_bigint(part.hash) for part in splits.values()],
        "users": [counted.users] + [0] * (len(splits) - 1)}, schema=_WRITTEN_ARROW)


_WRITTEN_ARROW = pa.schema([("name", pa.string()), ("size", pa.int64()), ("modified_ms", pa.int64()),
                            ("split", pa.string()), ("rows", pa.int64()), ("tokens", pa.int64()),
                            ("hash", pa.int64()), ("users", pa.int64())])


class _CountedUsers:
    """A partition's token batches (each user's tokens together), passed on while their users
    are counted: the count ingest records, without a Spark job of its own over the events."""

    def __init__(self, batches) -> None:
        self.batches, self.users, self.last = batches, 0, None

    def __iter__(self):
        for batch in self.batches:
            if batch.num_rows:
                ids = batch.column("user_id")
                changes = pc.sum(pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))).as_py() or 0
                self.users += 1 + changes - (ids[0].as_py() == self.last)
                self.last = ids[-1].as_py()
            yield batch
