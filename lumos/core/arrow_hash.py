"""An order-independent content hash of Arrow rows, computed with NumPy where the rows are made.

`tables.content_hash`'s xxhash64 sum is Spark's: a table written outside Spark (the sequences
files the builders write) would have to be read back by Spark to get it, which at 16M events cost
about 8 s of a 55 s ingest. This hash is computed from the Arrow batches themselves, so the
writer hashes what it writes, and Spark can compute the same figure over any frame
(`frame_hash_sum`, through `mapInArrow`) for a table written by Spark. `tables.content_hash`
formats both algorithms' figures.

Each row's hash is the sum, over its columns, of a mix of the column's name and value; the
table's is the sum of the rows' mixed hashes (mod 2^64) with the row count. Equal rows give equal
hashes in any order, partitioning or batching. A list's elements are weighted by their position,
so reordering a history changes the hash. Values are hashed by their bits in the Arrow type
Spark hands `mapInArrow` (timestamps as UTC microseconds), so the figure does not depend on how a
file stored them (INT96 or INT64 timestamps).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

ALGORITHM = "arrow-sum"

_NULL = np.uint64(0x9E3779B97F4A7C15)
_POSITION = np.uint64(0xC2B2AE3D27D4EB4F)


def table_hash(table: pa.Table | pa.RecordBatch) -> int:
    """The sum (mod 2^64, as a Python int) of the rows' hashes."""
    return int(row_hashes(table).sum(dtype=np.uint64))


def row_hashes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Each row's hash (uint64), for callers that sum them by a key of their own."""
    rows, positions = np.zeros(table.num_rows, dtype=np.uint64), _Positions()
    for name in sorted(table.schema.names):
        column = table.column(name)
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        values = np.concatenate([_column_hash(chunk, name, positions) for chunk in chunks]) if chunks else rows
        rows += _mix(values + _name_key(name))
    return _mix(rows)


def as_bigint(total: int) -> int:
    """A hash sum as a signed 64-bit integer, what a Spark bigint column holds (read back mod 2^64)."""
    total %= 2**64
    return total - 2**64 if total >= 2**63 else total


def frame_hash_sum(frame) -> tuple[int, int]:
    """(the sum of the rows' hashes, the row count) of a Spark DataFrame, each partition hashed in
    Arrow by `table_hash`."""
    partial = frame.mapInArrow(_partition_hash, "total bigint, rows bigint").collect()
    return sum(row["total"] for row in partial), sum(row["rows"] for row in partial)


def _partition_hash(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    total, rows = 0, 0
    for batch in batches:
        total, rows = total + table_hash(batch), rows + batch.num_rows
    yield pa.RecordBatch.from_pydict({"total": [as_bigint(total)], "rows": [rows]})


def _column_hash(array: pa.Array, name: str, positions: _Positions) -> np.ndarray:
    """One uint64 per row of `array`: its value's hash (a list's from its elements and length)."""
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        offsets = array.offsets.to_numpy().astype(np.int64)
        lists = positions.of(offsets)
        elements = _value_bits(array.values.slice(offsets[0], offsets[-1] - offsets[0]), name) * lists.weights
        hashed = lists.lengths.astype(np.uint64) * _POSITION
        if elements.size:  # reduceat over the non-empty lists only: it reads an empty one as one element
            hashed[lists.nonempty] += np.add.reduceat(elements, lists.starts[lists.nonempty])
        if array.null_count:  # a null list, not an empty one
            hashed = np.where(array.is_valid().to_numpy(zero_copy_only=False), hashed, _NULL)
        return hashed
    return _value_bits(array, name)


def _value_bits(array: pa.Array, name: str) -> np.ndarray:
    """Each value as uint64: a number's bits, a string's SipHash (pandas'); nulls as _NULL."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        import pandas as pd

        values = array.to_numpy(zero_copy_only=False)
        bits = pd.util.hash_array(np.where(array.is_valid().to_numpy(zero_copy_only=False), values, ""),
                                  categorize=True)
    elif pa.types.is_boolean(kind):
        bits = array.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
    elif pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_integer(kind) \
            or pa.types.is_floating(kind):
        storage = array.view(pa.from_numpy_dtype(np.dtype(f"u{kind.bit_width // 8}")))
        bits = (storage.fill_null(0) if storage.null_count else storage).to_numpy().astype(np.uint64)
    else:
        raise TypeError(f"column {name!r}: no Arrow content hash for type {kind}")
    if array.null_count:
        bits = np.where(array.is_valid().to_numpy(zero_copy_only=False), bits, _NULL)
    return bits


@dataclass
class _Lists:
    lengths: np.ndarray
    starts: np.ndarray
    """Each list's first element, counted from the first list's."""
    nonempty: np.ndarray
    weights: np.ndarray
    """Each element's weight: an odd number drawn from its position in its list, so that a list's
    hash, the sum of its values times their weights, changes when values move."""


class _Positions:
    """`_Lists` of the last offsets seen: computed once for the list columns that share them (a
    row's history features all have its length)."""

    def __init__(self) -> None:
        self.offsets, self.lists = None, None

    def of(self, offsets: np.ndarray) -> _Lists:
        if self.offsets is None or not np.array_equal(self.offsets, offsets):
            lengths, starts = np.diff(offsets), offsets[:-1] - offsets[0]
            positions = (np.arange(offsets[-1] - offsets[0], dtype=np.int64) - np.repeat(starts, lengths))
            weights = _mix(positions.astype(np.uint64) + _POSITION) | np.uint64(1)
            self.offsets, self.lists = offsets, _Lists(lengths, starts, lengths > 0, weights)
        return self.lists


def _name_key(name: str) -> np.uint64:
    return np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little"))


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit reaches every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
