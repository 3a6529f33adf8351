"""The content hash of a sequences version: the same rows in any order or partitioning hash equal;
any changed, added or repeated row changes it."""

from __future__ import annotations

from lumos.core.tables import content_hash

ROWS = [("u1", "train", [3, 4, 5], 1.5), ("u2", "test", [2], None), ("u3", "train", [], 0.0)]
SCHEMA = "user_id string, split string, item array<int>, value double"


def test_order_independent_and_sensitive_to_every_row(spark):
    base = content_hash(spark.createDataFrame(ROWS, SCHEMA))
    assert base.startswith("xxhash64-sum:") and base.endswith(":3")
    shuffled = spark.createDataFrame(list(reversed(ROWS)), SCHEMA).repartition(3)
    assert content_hash(shuffled) == base
    reordered_columns = spark.createDataFrame(ROWS, SCHEMA).select("value", "item", "split", "user_id")
    assert content_hash(reordered_columns) == base

    changed = [ROWS[0], ("u2", "test", [2, 9], None), ROWS[2]]
    repeated = [*ROWS, ROWS[0]]
    hashes = {content_hash(spark.createDataFrame(rows, SCHEMA)) for rows in (changed, repeated, ROWS[:2])}
    assert base not in hashes and len(hashes) == 3
