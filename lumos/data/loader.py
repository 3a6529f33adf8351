"""The training loader: one version of `<dataset>.sequences` → padded `Batch`es, without Spark.

The files of the version come from its Delta log, read by delta-rs (`lumos.data.delta_snapshot`),
and are read with pyarrow, one Parquet row group at a time, only the columns the `FeatureSpec`
names (plus `split`).
Histories become padded (B, T) tensors by offset arithmetic on the Arrow list columns (offsets +
flat values → one numpy gather per column), never a Python loop over rows. Rows of other splits
are skipped by index, never copied out by a filter.

Semantics:

- **Rows.** Only rows whose `split` equals the loader's split. Files are taken in path order,
  row groups in file order, rows in file order; with `shuffle=False` that is the batch order.
- **Shuffle** (per epoch, from `seed` and `epoch` alone): the order of row groups is permuted,
  then the epoch's rows are cut into chunks of `chunk_rows` consecutive rows (a multiple of the
  global batch, W × batch size) and rows are permuted within each chunk. A batch therefore mixes
  the rows of the few row groups its chunk spans; rows of one row group never spread over the whole epoch. Keep
  row groups small relative to `chunk_rows` for a better mix (Spark's files of the sequences
  table hold one row group each).
- **Ranks.** The epoch's first U = W·floor(N / W) rows (of its shuffled order) are used (N = rows
  of the split; the N mod W left over change every epoch when shuffling). Step k's global batch is rows [k·W·B, (k+1)·W·B)
  of the epoch's order, and rank r of W takes its r-th of W equal parts. So W ranks at batch B see
  exactly the rows one rank sees at batch W·B, step for step (DDP then matches single-process
  training), and every rank has the same number of batches, which DDP needs. The price: each
  rank decodes whole chunks, not only its 1/W of them.
- **By length** (`by_length=True`): within each chunk, the rows (in their shuffled order) are
  sorted by history length, stably, and cut into global batches; with `shuffle`, the order of a
  chunk's full global batches is then permuted (a short last one stays last). A batch is padded to
  its longest history, so on skewed lengths this cuts most of the padding; but a batch then holds
  users of similar history length, which changes what a step sees (a training choice).
- **Batches.** The rank's share of each global batch, `batch_size` rows; the last one is short,
  or dropped with `drop_last`. T is the longest history in the batch (at least 1,
  so tensors are never empty). `next_item` null → 0; `act`/`value` columns follow
  `spec.horizons_days`; `future` stacks the `future_<flag>` arrays to (B, slots, flags).
- **Workers.** One thread reads and decodes row groups (pyarrow decodes in parallel underneath);
  `num_workers` threads build batches (numpy releases the GIL in its gathers and copies), up to
  `prefetch` batches ahead, pinned when CUDA is available. The batches do not depend on
  `num_workers`: the plan is fixed by (table version, split, seed, epoch, rank, world size,
  batch and chunk size, by_length).
- **Resume.** `state_dict()` is (epoch, batches already yielded) plus the plan's settings;
  `load_state_dict()` makes the next iteration continue with exactly the batches an uninterrupted
  run would have yielded. An epoch that completes advances `epoch` by one; `set_epoch(e)` with
  a different epoch restarts at its first batch, with the current one keeps the position.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lumos.core.errors import UsageError
from lumos.data.contract import Batch, FeatureSpec
from lumos.data.delta_snapshot import DeltaSnapshot
from lumos.data.user_share import UserShare

# ---------------------------------------------------------------------------------------------
# The plan: which rows each rank reads, in which order


@dataclass(frozen=True)
class _RowGroup:
    file: int
    index: int
    rows: int
    """Rows of the loader's split (and user share) in this row group."""
    filtered: bool
    """True when some rows belong to other splits or users (skipped by index after reading)."""


@dataclass(frozen=True)
class _Segment:
    row_group: int
    """Position in the loader's row-group list."""
    start: int
    stop: int
    """Range of split rows within the row group."""


@dataclass(frozen=True)
class _Chunk:
    epoch: int
    first_row: int
    """Position of its first row in the epoch's global row order (seeds its row shuffle)."""
    rows: int
    segments: tuple[_Segment, ...]


def _epoch_chunks(rows_per_group: np.ndarray, order: np.ndarray, epoch: int, rows: int, chunk_rows: int) -> list[_Chunk]:
    """Cut the epoch's `rows` rows (row groups in `order`) into chunks of `chunk_rows`.

    The chunks are the same on every rank: ranks differ only in which rows of each global batch
    they take (see `_planned_batches`).
    """
    ends = np.cumsum(rows_per_group[order])
    return [
        _Chunk(epoch, first, min(first + chunk_rows, rows) - first, _segments(order, ends, first, min(first + chunk_rows, rows)))
        for first in range(0, rows, chunk_rows)
    ]


def _segments(order: np.ndarray, ends: np.ndarray, first: int, last: int) -> tuple[_Segment, ...]:
    """The row-group ranges that cover global rows [first, last)."""
    segments = []
    position = int(np.searchsorted(ends, first, side="right"))
    while first < last:
        group_start = int(ends[position - 1]) if position else 0
        stop = min(last, int(ends[position]))
        segments.append(_Segment(int(order[position]), first - group_start, stop - group_start))
        first = stop
        position += 1
    return tuple(segments)


# ---------------------------------------------------------------------------------------------
# Reading: a row group → numpy views; a chunk's segments → one set of flat arrays


@dataclass
class _RowGroupArrays:
    """One row group's columns as numpy (zero-copy views of Arrow's buffers where possible), all
    rows of every split; `rows` picks the loader's split."""

    rows: np.ndarray
    """Indices of the split's rows, ascending."""
    offsets: np.ndarray
    """(rows + 1,) int64 from 0: the history lists' offsets, the same for every history column."""
    history: dict[str, np.ndarray]
    """Flat values of each history column (token_categorical then token_numeric)."""
    static_categorical: dict[str, np.ndarray]
    per_row: dict[str, np.ndarray]
    """Batch field → per-row array: static_numeric, future, next_item, act, value."""


@dataclass
class _Columns:
    """One chunk's rows. History values are flat, all rows' tokens one row after the other, with
    one extra 0 at index `padding`, so that a single gather fills real and padded positions."""

    starts: np.ndarray
    lengths: np.ndarray
    padding: int
    tokens: dict[str, np.ndarray]
    """Feature → (values + 1,) int64."""
    numeric: np.ndarray
    """(values + 1, len(token_numeric)) float32."""
    static_categorical: dict[str, np.ndarray]
    per_row: dict[str, np.ndarray]


class _RowGroupReader:
    """Reads one row group at a time; remembers the last one, since chunk boundaries cut through
    row groups and consecutive chunks then share one."""

    def __init__(self, paths: list[str], metadata: list[pq.FileMetaData], spec: FeatureSpec, split: str,
                 users: UserShare | None, where: str):
        self.paths, self.metadata, self.spec, self.split, self.where = paths, metadata, spec, split, where
        self.users = users
        self.columns = [*_spec_columns(spec), "split", *(["user_id"] if users else [])]
        self._files: dict[int, pq.ParquetFile] = {}
        self._last: tuple[int, _RowGroupArrays] | None = None

    def read(self, position: int, group: _RowGroup) -> _RowGroupArrays:
        if self._last is not None and self._last[0] == position:
            return self._last[1]
        if group.file not in self._files:
            self._files[group.file] = pq.ParquetFile(self.paths[group.file], metadata=self.metadata[group.file])
        table = self._files[group.file].read_row_group(group.index, columns=self.columns)
        # Rows of other splits are skipped by index, not filtered out: filtering would copy
        # every list column once more.
        if group.filtered:
            rows = np.flatnonzero(selected_rows(table, self.split, self.users))
        else:
            rows = np.arange(table.num_rows)
        arrays = _row_group_arrays(table, rows, self.spec, self.where)
        self._last = (position, arrays)
        return arrays

    def close(self) -> None:
        for parquet_file in self._files.values():
            parquet_file.close()
        self._files.clear()
        self._last = None


def _row_group_arrays(table: pa.Table, rows: np.ndarray, spec: FeatureSpec, where: str) -> _RowGroupArrays:
    """Arrow columns → numpy, checking the sequences contract on the way."""
    names = [*spec.token_categorical, *spec.token_numeric]
    history, offsets = {}, None
    for name in names:
        column_offsets, history[name] = _list_values(table.column(name), name, where)
        if offsets is None:
            offsets = column_offsets
        elif not np.array_equal(column_offsets, offsets):
            raise UsageError(f"{where}: history column {name} has other lengths than {names[0]}")
    if len(offsets) > 1 and int(np.diff(offsets).max()) > spec.max_len:
        raise UsageError(f"{where}: a history is longer than the feature spec's max_len {spec.max_len}")
    return _RowGroupArrays(
        rows=rows,
        offsets=offsets,
        history=history,
        static_categorical={name: _plain(table, name, where).astype(np.int64) for name in spec.static_categorical},
        per_row={
            "static_numeric": _stack(table, spec.static_numeric, where),
            "future": _future(table, spec, where),
            "next_item": _next_item(table) if spec.next_item else np.zeros(table.num_rows, dtype=np.int64),
            "act": _stack(table, [f"act_{days}d" for days in spec.horizons_days], where),
            "value": _stack(table, [f"value_{days}d" for days in spec.horizons_days], where),
        },
    )


def _assemble(parts: list[tuple[_RowGroupArrays, slice]], spec: FeatureSpec) -> _Columns:
    """One chunk's flat arrays from slices of the split's rows of some row groups.

    A slice's rows are ascending, so their history values lie in one range of the row group's
    flat values; that range is copied (int32 → int64 on the way), with the values of other
    splits' rows in between, which the starts simply skip.
    """
    starts, lengths, spans, total = [], [], [], 0
    for arrays, selected in parts:
        rows = arrays.rows[selected]
        begin, end = arrays.offsets[rows], arrays.offsets[rows + 1]
        low, high = int(begin[0]), int(end[-1])
        starts.append(begin - low + total)
        lengths.append(end - begin)
        spans.append((arrays.history, low, high, total))
        total += high - low
    tokens = {name: np.zeros(total + 1, dtype=np.int64) for name in spec.token_categorical}
    numeric = np.zeros((total + 1, len(spec.token_numeric)), dtype=np.float32)
    for history, low, high, at in spans:
        for name, ids in tokens.items():
            ids[at:at + high - low] = history[name][low:high]
        for index, name in enumerate(spec.token_numeric):
            numeric[at:at + high - low, index] = history[name][low:high]
    return _Columns(
        starts=np.concatenate(starts),
        lengths=np.concatenate(lengths),
        padding=total,
        tokens=tokens,
        numeric=numeric,
        static_categorical={name: _selected(parts, "static_categorical", name) for name in spec.static_categorical},
        per_row={field: _selected(parts, "per_row", field) for field in parts[0][0].per_row},
    )


def _selected(parts: list[tuple[_RowGroupArrays, slice]], field: str, key: str) -> np.ndarray:
    """`field[key]` of the selected rows of every part, concatenated."""
    return np.concatenate([getattr(arrays, field)[key][arrays.rows[selected]] for arrays, selected in parts])


def _future(table: pa.Table, spec: FeatureSpec, where: str) -> np.ndarray:
    """(rows, slots, flags) float32 from the future_<flag> arrays, which have one element per slot."""
    rows, slots = table.num_rows, spec.future_slots
    future = np.zeros((rows, slots, len(spec.future_flags)), dtype=np.float32)
    for index, flag in enumerate(spec.future_flags):
        offsets, values = _list_values(table.column(f"future_{flag}"), f"future_{flag}", where)
        if not np.all(np.diff(offsets) == slots):
            raise UsageError(f"{where}: future_{flag} arrays must have {slots} elements (one per decoder slot)")
        future[:, :, index] = values.reshape(rows, slots)
    return future


def _list_values(column: pa.ChunkedArray, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from 0, flat values) of a list column; nulls break the table's contract."""
    array = column.combine_chunks()
    if array.null_count:
        raise UsageError(f"{where}: column {name} has null arrays")
    offsets = np.asarray(array.offsets, dtype=np.int64)
    flat = array.values.slice(offsets[0], offsets[-1] - offsets[0])
    if flat.null_count:
        raise UsageError(f"{where}: column {name} has null elements")
    # Zero-copy unless the values carry a validity bitmap (no nulls, checked above), as pyarrow's
    # take() leaves on lists built from pandas.
    return offsets - offsets[0], flat.to_numpy(zero_copy_only=False)


def _plain(table: pa.Table, name: str, where: str) -> np.ndarray:
    column = table.column(name)
    if column.null_count:
        raise UsageError(f"{where}: column {name} has nulls")
    return column.to_numpy()


def _stack(table: pa.Table, names: list[str] | tuple[str, ...], where: str) -> np.ndarray:
    """(rows, len(names)) float32 from scalar columns."""
    out = np.zeros((table.num_rows, len(names)), dtype=np.float32)
    for index, name in enumerate(names):
        out[:, index] = _plain(table, name, where)
    return out


def _next_item(table: pa.Table) -> np.ndarray:
    # A row with no target token (time cutoff after the user's last event) has next_item null.
    return pc.fill_null(table.column("next_item"), 0).to_numpy().astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Building one batch: a gather with offset arithmetic


def build_batch(columns: _Columns, rows: np.ndarray) -> Batch:
    """The Batch of `rows` (indices into the chunk), histories right-padded to the longest one."""
    lengths = columns.lengths[rows]
    positions = np.arange(max(int(lengths.max(initial=0)), 1))
    mask = positions < lengths[:, None]  # (B, T)
    # Where each (row, position) reads from in the flat values: the row's start + the position,
    # or the trailing 0 for padding. One gather per column then builds the padded array.
    source = np.where(mask, columns.starts[rows][:, None] + positions, columns.padding)  # (B, T)
    return Batch(
        tokens={name: torch.from_numpy(np.take(ids, source)) for name, ids in columns.tokens.items()},
        numeric=torch.from_numpy(np.take(columns.numeric, source, axis=0)),  # (B, T, F)
        mask=torch.from_numpy(mask),
        static_categorical={name: torch.from_numpy(ids[rows]) for name, ids in columns.static_categorical.items()},
        **{field: torch.from_numpy(values[rows]) for field, values in columns.per_row.items()},
    )


def by_history_length(table: pa.Table, spec: FeatureSpec) -> pa.Table:
    """The table's rows, shortest history first (ties keep their order).

    A batch is padded to its longest history, and real histories are skewed (in the quickstart
    world the median is a quarter of max_len while most batches of 512 hold one full-length user),
    so batches of rows in table order were mostly padding: scoring length-sorted batches took
    the model a third of the time. Only for work whose rows are scored independently.
    """
    return table if table.num_rows < 2 else table.take(pa.array(history_length_order(table, spec)))


def history_length_order(table: pa.Table, spec: FeatureSpec) -> np.ndarray:
    """Row indices of `table`, shortest history first (stable): `by_history_length`'s order, for
    callers that must put their results back in the table's own order (`unsort`)."""
    lengths = pc.list_value_length(table.column(next(iter(spec.token_categorical)))).to_numpy(zero_copy_only=False)
    return np.argsort(lengths, kind="stable")


def unsort(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rows computed in `order` (row i is the table's row order[i]) put back in the table's order."""
    restored = np.empty_like(values)
    restored[order] = values
    return restored


def table_batches(table: pa.Table, spec: FeatureSpec, batch_size: int, where: str) -> Iterator[Batch]:
    """Batches of an in-memory Arrow table with the sequences columns, in row order (batch
    inference: Spark hands each task its rows as Arrow)."""
    if table.num_rows == 0:
        return
    columns = _assemble([(_row_group_arrays(table, np.arange(table.num_rows), spec, where), slice(None))], spec)
    for start in range(0, table.num_rows, batch_size):
        yield build_batch(columns, np.arange(start, min(start + batch_size, table.num_rows)))


# ---------------------------------------------------------------------------------------------
# The loader


@dataclass(frozen=True)
class _PlannedBatch:
    chunk: int
    rows: slice
    """Rows of the chunk (in its shuffled order)."""


class SequenceLoader:
    """Batches of one split of one sequences version, for one rank of `world_size` (see module doc).

    `chunk_rows` is rounded up to a multiple of `batch_size`. `prefetch` is how many batches are
    built ahead; `pin_memory` defaults to whether CUDA is available.
    """

    def __init__(
        self,
        snapshot: DeltaSnapshot,
        spec: FeatureSpec,
        batch_size: int,
        *,
        split: str = "train",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int | None = None,
        prefetch: int = 8,
        chunk_rows: int = 8192,
        pin_memory: bool | None = None,
        by_length: bool = False,
        users: UserShare | None = None,
    ):
        num_workers = default_workers() if num_workers is None else num_workers
        _check_arguments(batch_size, seed, rank, world_size, num_workers, prefetch, chunk_rows)
        if snapshot.partition_columns:
            raise UsageError(f"{snapshot} is partitioned by {', '.join(snapshot.partition_columns)}; the loader reads unpartitioned sequences tables")
        self.snapshot, self.spec, self.split = snapshot, spec, split
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.num_workers, self.prefetch = num_workers, prefetch
        self.by_length = by_length
        self.users = users if users is not None and users.split == split else None  # it divides one split's users; others are read whole
        # Chunks hold whole global batches (all ranks' rows of one step), so that chunk boundaries,
        # and with them the epoch's row order, do not depend on how many ranks share the batch.
        global_batch = batch_size * world_size
        self.chunk_rows = math.ceil(chunk_rows / global_batch) * global_batch
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.columns = _spec_columns(spec)
        self._paths = [data_file.path for data_file in snapshot.files]
        self._metadata = [pq.read_metadata(path) for path in self._paths]
        self._row_groups = _split_row_groups(self._paths, self._metadata, self.columns, split, self.users, str(snapshot))
        self._rows_per_group = np.array([group.rows for group in self._row_groups], dtype=np.int64)
        self.rows = int(self._rows_per_group.sum())
        if self.rows == 0:
            raise UsageError(f"{snapshot} has no rows in split {split!r}" + (f" on the {self.users.side} side" if self.users else ""))
        self.epoch = 0
        self._position = 0

    # --- sizes and position -------------------------------------------------------------------

    @property
    def rows_per_rank(self) -> int:
        return self.rows // self.world_size

    def __len__(self) -> int:
        if self.drop_last:
            return self.rows_per_rank // self.batch_size
        return math.ceil(self.rows_per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._position = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_yielded": self._position, "plan": self._plan_settings()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ours, theirs = self._plan_settings(), dict(state["plan"])
        differences = sorted(key for key in ours.keys() | theirs.keys() if ours.get(key) != theirs.get(key))
        if differences:
            raise ValueError(f"the loader state was saved for another plan; differing: {', '.join(differences)}")
        self.epoch, self._position = int(state["epoch"]), int(state["batches_yielded"])

    def _plan_settings(self) -> dict[str, Any]:
        # Everything that fixes the batch sequence except the rank: one rank's state fits all,
        # since every rank is at the same batch.
        return {
            "table": self.snapshot.table_path, "version": self.snapshot.version, "split": self.split,
            "batch_size": self.batch_size, "chunk_rows": self.chunk_rows, "shuffle": self.shuffle,
            "seed": self.seed, "drop_last": self.drop_last, "world_size": self.world_size,
            "by_length": self.by_length, "users": repr(self.users) if self.users else None,
        }

    # --- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch's batches, from the saved position."""
        if self._position >= len(self):
            self.epoch, self._position = self.epoch + 1, 0
        chunks = self._chunks(self.epoch)
        planned = self._planned_batches(chunks, self._position)
        reader = _RowGroupReader(self._paths, self._metadata, self.spec, self.split, self.users, str(self.snapshot))
        batches = self._serial(chunks, planned, reader) if self.num_workers == 0 else self._threaded(chunks, planned, reader)
        try:
            for batch in batches:
                # Advance before handing the batch out: a state_dict taken while it is in use
                # must not yield it again after a resume.
                self._position += 1
                if self._position == len(self):
                    self.epoch, self._position = self.epoch + 1, 0
                yield batch
        finally:
            batches.close()
            reader.close()

    def _chunks(self, epoch: int) -> list[_Chunk]:
        groups = len(self._row_groups)
        order = np.random.default_rng([self.seed, epoch, 0]).permutation(groups) if self.shuffle else np.arange(groups)
        # Chunks cover every row, so their shuffles do not depend on the world size; the W-dependent
        # remainder is cut from the end of the shuffled order instead (see _planned_batches).
        return _epoch_chunks(self._rows_per_group, order, epoch, self.rows, self.chunk_rows)

    def _planned_batches(self, chunks: list[_Chunk], start: int) -> Iterator[_PlannedBatch]:
        """Batches `start` … len(self) - 1: batch k of rank r is the r-th of W equal parts of the
        epoch's global batch k (W × batch_size rows; the last one may be short, by a multiple of W)."""
        global_batch = self.batch_size * self.world_size
        per_chunk = self.chunk_rows // global_batch
        usable = self.rows_per_rank * self.world_size
        for number in range(start, len(self)):
            chunk, first = divmod(number, per_chunk)
            first *= global_batch
            rows = min(chunks[chunk].rows, usable - chunks[chunk].first_row)
            share = min(global_batch, rows - first) // self.world_size
            first += self.rank * share
            yield _PlannedBatch(chunk, slice(first, first + share))

    def _load_chunk(self, chunk: _Chunk, reader: _RowGroupReader) -> tuple[_Columns, np.ndarray]:
        """Decoded columns of a chunk and its row order."""
        parts = [(reader.read(s.row_group, self._row_groups[s.row_group]), slice(s.start, s.stop)) for s in chunk.segments]
        columns = _assemble(parts, self.spec)
        order = np.arange(chunk.rows)
        if self.shuffle:
            order = np.random.default_rng([self.seed, chunk.epoch, 1, chunk.first_row]).permutation(chunk.rows)
        if self.by_length:
            order = self._by_length(chunk, columns.lengths, order)
        return columns, order

    def _by_length(self, chunk: _Chunk, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
        """`order` sorted by history length (stable) and cut into global batches; with shuffle,
        the full global batches in a seeded random order, a short last one kept last."""
        order = order[np.argsort(lengths[order], kind="stable")]
        global_batch = self.batch_size * self.world_size
        full = len(order) // global_batch
        if not self.shuffle or full < 2:
            return order
        batches = order[:full * global_batch].reshape(full, global_batch)
        shuffled = np.random.default_rng([self.seed, chunk.epoch, 2, chunk.first_row]).permutation(full)
        return np.concatenate([batches[shuffled].ravel(), order[full * global_batch:]])

    def _finish(self, loaded: tuple[_Columns, np.ndarray], rows: slice) -> Batch:
        columns, order = loaded
        batch = build_batch(columns, order[rows])
        return batch.pin_memory() if self.pin_memory else batch

    def _serial(self, chunks: list[_Chunk], planned: Iterator[_PlannedBatch], reader: _RowGroupReader) -> Iterator[Batch]:
        loaded: tuple[int, tuple[_Columns, np.ndarray]] | None = None
        for item in planned:
            if loaded is None or loaded[0] != item.chunk:
                loaded = (item.chunk, self._load_chunk(chunks[item.chunk], reader))
            yield self._finish(loaded[1], item.rows)

    def _threaded(self, chunks: list[_Chunk], planned: Iterator[_PlannedBatch], reader: _RowGroupReader) -> Iterator[Batch]:
        """One reader thread (chunks in order, one ahead), `num_workers` batch builders, results
        taken in plan order so that timing never changes the sequence."""
        reading = ThreadPoolExecutor(1, thread_name_prefix="lumos-read")
        building = ThreadPoolExecutor(self.num_workers, thread_name_prefix="lumos-batch")
        loads: dict[int, Future] = {}
        pending: deque[Future] = deque()

        def load(number: int) -> Future | None:
            if number not in loads and number < len(chunks):
                loads[number] = reading.submit(self._load_chunk, chunks[number], reader)
            return loads.get(number)

        def submit(item: _PlannedBatch) -> None:
            loaded = load(item.chunk)
            load(item.chunk + 1)  # read ahead while this chunk's batches are built
            for old in [number for number in loads if number < item.chunk]:
                del loads[old]  # queued batches keep their chunk alive; let go of the rest
            pending.append(building.submit(lambda: self._finish(loaded.result(), item.rows)))

        try:
            for item in planned:
                submit(item)
                if len(pending) >= self.prefetch:
                    break
            while pending:
                batch = pending.popleft().result()
                if (following := next(planned, None)) is not None:
                    submit(following)
                yield batch
        finally:
            for future in pending:
                future.cancel()
            building.shutdown(wait=True, cancel_futures=True)
            reading.shutdown(wait=True, cancel_futures=True)


def _spec_columns(spec: FeatureSpec) -> list[str]:
    """The table columns a FeatureSpec reads."""
    columns = [*spec.token_categorical, *spec.token_numeric, *spec.static_categorical, *spec.static_numeric]
    columns += [f"future_{flag}" for flag in spec.future_flags]
    columns += ["next_item"] if spec.next_item else []
    for days in spec.horizons_days:
        columns += [f"act_{days}d", f"value_{days}d"]
    return columns


def _split_row_groups(
    paths: list[str], metadata: list[pq.FileMetaData], columns: list[str], split: str, users: UserShare | None,
    where: str
) -> list[_RowGroup]:
    """Every row group holding rows of `split` (on `users`' side), with their count: from the
    `split` column's min/max statistics when they settle it, else by reading the key columns."""
    groups = []
    for file, (path, meta) in enumerate(zip(paths, metadata, strict=True)):
        names = meta.schema.to_arrow_schema().names
        missing = [name for name in [*columns, "split"] if name not in names]
        if missing:
            raise UsageError(f"{where}: {Path(path).name} lacks column(s) {', '.join(missing)} that the feature spec needs")
        split_column = names.index("split")
        parquet_file = None
        for index in range(meta.num_row_groups):
            total = meta.row_group(index).num_rows
            rows = _rows_by_statistics(meta.row_group(index).column(split_column).statistics, split, total)
            if rows is None or (rows and users):
                parquet_file = parquet_file or pq.ParquetFile(path, metadata=meta)
                keys = parquet_file.read_row_group(index, columns=["split", *(["user_id"] if users else [])])
                rows = int(selected_rows(keys, split, users).sum())
            if rows:
                groups.append(_RowGroup(file, index, rows, filtered=rows < total))
        if parquet_file is not None:
            parquet_file.close()
    return groups


def selected_rows(table: pa.Table, split: str, users: UserShare | None = None) -> np.ndarray:
    """Which rows of `table` the loader reads: those of `split`, on `users`' side when given."""
    rows = pc.equal(table.column("split"), split).to_numpy(zero_copy_only=False)
    if users is not None:
        rows = rows & users.holds(table.column("user_id"))
    return rows


def _rows_by_statistics(statistics, split: str, total: int) -> int | None:
    if statistics is None or not statistics.has_min_max or not statistics.has_null_count or statistics.null_count:
        return None
    if statistics.min == statistics.max == split:
        return total
    if split < statistics.min or split > statistics.max:
        return 0
    return None


def _check_arguments(batch_size: int, seed: int, rank: int, world_size: int, num_workers: int, prefetch: int, chunk_rows: int) -> None:
    problems = [f"batch_size must be at least 1, got {batch_size}"] if batch_size < 1 else []
    problems += [f"seed must be non-negative, got {seed}"] if seed < 0 else []
    problems += [f"rank must be in 0 … world_size - 1, got rank {rank} of {world_size}"] if not 0 <= rank < world_size else []
    problems += ["num_workers must be ≥ 0, prefetch and chunk_rows ≥ 1"] if min(num_workers + 1, prefetch, chunk_rows) < 1 else []
    if problems:
        raise ValueError("; ".join(problems))


def default_workers() -> int:
    """Batch-building threads: the CPUs this process may use, at most 4 (beyond that the single
    reader thread is the limit)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
