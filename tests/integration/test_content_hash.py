"""The content hash of a sequences version, in both algorithms (Spark's xxhash64 sum, and the
Arrow hash the sequences writers compute): the same rows in any order or partitioning hash equal;
any changed, added, repeated or reordered value changes it."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from lumos.core import arrow_hash
from lumos.core.tables import content_hash, content_hash_of

ROWS = [("u1", "train", [3, 4, 5], 1.5), ("u2", "test", [2], None), ("u3", "train", [], 0.0)]
SCHEMA = "user_id string, split string, item array<int>, value double"


@pytest.mark.parametrize("algorithm", ["xxhash64-sum", "arrow-sum"])
def test_order_independent_and_sensitive_to_every_row(spark, algorithm):
    base = content_hash(spark.createDataFrame(ROWS, SCHEMA), algorithm)
    assert base.startswith(f"{algorithm}:") and base.endswith(":3")
    shuffled = spark.createDataFrame(list(reversed(ROWS)), SCHEMA).repartition(3)
    assert content_hash(shuffled, algorithm) == base
    reordered_columns = spark.createDataFrame(ROWS, SCHEMA).select("value", "item", "split", "user_id")
    assert content_hash(reordered_columns, algorithm) == base

    changed = [ROWS[0], ("u2", "test", [2, 9], None), ROWS[2]]
    repeated = [*ROWS, ROWS[0]]
    reordered_list = [("u1", "train", [4, 3, 5], 1.5), *ROWS[1:]]
    moved = [("u1", "train", [3, 4], 1.5), ("u2", "test", [5, 2], None), ROWS[2]]  # a value into the next row
    variants = [changed, repeated, ROWS[:2], reordered_list, moved]
    if algorithm == "arrow-sum":  # Spark's xxhash64 skips a null and hashes an empty array to the same seed
        variants.append([*ROWS[:2], ("u3", "train", None, 0.0)])
    hashes = {content_hash(spark.createDataFrame(rows, SCHEMA), algorithm) for rows in variants}
    assert base not in hashes and len(hashes) == len(variants)


def test_arrow_hash_of_batches_equals_sparks_of_the_frame(spark):
    """What a writer sums over the batches it writes equals what Spark computes over the same rows
    read as a frame: timestamps by their UTC microseconds, with or without a zone in the type."""
    as_of = datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
    rows = [(user, as_of, list(range(user % 4)), float(user) if user % 3 else None) for user in range(50)]
    schema = "user_id int, as_of timestamp, item array<int>, value double"
    table = pa.table({"user_id": pa.array([row[0] for row in rows], pa.int32()),
                      "as_of": pa.array([row[1] for row in rows], pa.timestamp("us", tz="UTC")),
                      "item": pa.array([row[2] for row in rows], pa.list_(pa.int32())),
                      "value": pa.array([row[3] for row in rows], pa.float64())})
    by_batches = sum(arrow_hash.table_hash(batch) for batch in table.to_batches(max_chunksize=7))
    expected = content_hash_of(by_batches, len(rows), arrow_hash.ALGORITHM)
    assert content_hash(spark.createDataFrame(rows, schema).repartition(4), "arrow-sum") == expected
    naive = table.set_column(1, "as_of", table.column("as_of").cast(pa.timestamp("us")))
    assert arrow_hash.table_hash(naive) == arrow_hash.table_hash(table)
