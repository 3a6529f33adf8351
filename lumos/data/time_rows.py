"""Time-split sequences rows, built in one vectorised pass over each user's sorted tokens.

`build_sequences` calls this for `splits.mode = "time"` (every quickstart ingest, and every
`lumos infer`, which reads one time cutoff at its as-of date). It writes the same rows, to the
same contract (see `lumos.data.sequences`), as the Spark path that leave-last-out recipes still
take; `tests/integration/test_time_rows.py` holds the two to each other value for value.

Why a second builder. In Spark SQL, a row's history is a join of the cut rows back to each user's
collected tokens, after a window that numbers the tokens, a cache of them, and a join of every row
to the events after it for the act targets: each a shuffle or a pass over every event. Here Spark
does one shuffle (tokens to the partition of their user, sorted there in token order), and each
partition's tokens go through `mapInArrow` as Arrow batches, where NumPy finds every user's
positions, gaps, cuts, histories and act windows with array operations over the whole batch
(never a Python loop per user or per row).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lumos.core.arrow_hash import row_hashes
from lumos.data.contract import OOV_ID, TIME_FEATURES

MICROS_PER_MINUTE = 60 * 1_000_000
MICROS_PER_HOUR = 60 * MICROS_PER_MINUTE
MICROS_PER_DAY = 24 * MICROS_PER_HOUR
EPOCH_WEEKDAY = datetime.date(1970, 1, 1).weekday()  # a Thursday: 3, counting Monday as 0
# gap_bucket = 1 + floor(log2(1 + minutes)), at most TIME_FEATURES["gap_bucket"] - 1: the powers
# 2^1 … 2^14 that 1 + minutes reaches, counted with integers (a floating log2 can land just below
# a power of two).
GAP_POWERS = 2 ** np.arange(1, TIME_FEATURES["gap_bucket"] - 1, dtype=np.int64)

# `kind` of a builder input row (day tokens with act targets); a user's rows come sorted by it.
TOKEN = 0
ACT_ONLY = 1
"""A raw act event, sent only for the act targets (day tokens: their history is days)."""


@dataclass(frozen=True)
class TokenIds:
    """Each history feature's vocabulary (feature → its tokens and their ids), looked up by the
    builder. In Spark it was a broadcast join per feature, each copying every token row: 1.8 s of
    the 2.5 s that sorting and mapping 4M events took in the JVM."""

    vocabularies: dict[str, tuple[list[str], list[int]]]

    def ids(self, feature: str, tokens: pa.ChunkedArray) -> np.ndarray:
        """The id of each token (int32); null and unknown tokens get OOV. Each distinct token of
        the batch is looked up once."""
        encoded = pc.dictionary_encode(tokens).combine_chunks()
        found = self._index(feature).get_indexer(encoded.dictionary.to_numpy(zero_copy_only=False))
        known = np.array([*self.vocabularies[feature][1], OOV_ID], dtype=np.int32)
        distinct_ids = known[found]  # found is -1 (the OOV after the ids) for unknown tokens
        positions = pc.fill_null(encoded.indices, len(distinct_ids)).to_numpy()  # a null: the OOV after those
        return np.concatenate([distinct_ids, np.array([OOV_ID], dtype=np.int32)])[positions]

    def _index(self, feature: str):
        """A hash index of the feature's tokens, built once per Python worker and feature."""
        import pandas as pd

        cache = self.__dict__.setdefault("_indexes", {})  # not a field: plans pickle without it
        if feature not in cache:
            cache[feature] = pd.Index(self.vocabularies[feature][0], dtype=object)
        return cache[feature]

    def __getstate__(self) -> dict:
        return {"vocabularies": self.vocabularies}


@dataclass(frozen=True)
class TimeRowsPlan:
    """What the per-partition builder needs from the recipe: plain values, shipped to executors."""

    cutoffs: tuple[tuple[str, int], ...]
    """(split, as_of in epoch microseconds), in recipe order."""
    max_len: int
    min_history: int
    id_features: tuple[str, ...]
    """History features of vocabulary ids: item, event_type, cat_<name> (input column tok_<name>,
    the token, mapped to its id by `token_ids`)."""
    float_features: tuple[str, ...]
    """History features of floats (nulls read 0.0): value, num_<name> (input column: the same name)."""
    day_counts: bool
    """Day tokens: each token's `count` of events is a history feature."""
    age_days: bool
    next_item: bool
    horizons_days: tuple[int, ...]
    targets: bool
    """False: every act_<K>d and value_<K>d is 0 (inference)."""
    static_ids: tuple[str, ...] = ()
    """user_<name> columns of vocabulary ids, on every token row (null: not in the users table: OOV)."""
    static_floats: tuple[str, ...] = ()
    """user_<name> columns of floats, on every token row (null reads 0.0)."""
    token_ids: TokenIds = TokenIds({})

    def spark_schema(self) -> str:
        """The DDL of the rows `build_rows` yields (as_of as epoch microseconds)."""
        return ", ".join(f"`{name}` {kind}" for name, kind in self.columns())

    def columns(self) -> list[tuple[str, str]]:
        """(name, Spark SQL type) of the columns `build_rows` yields, in order."""
        columns = [("user_id", "string"), ("split", "string"), ("as_of_micros", "bigint"), ("length", "int")]
        columns += [(name, "array<int>") for name in self.id_features]
        columns += [(name, "array<float>") for name in self.float_features]
        columns += [("count", "array<int>")] if self.day_counts else []
        columns += [(name, "array<int>") for name in TIME_FEATURES]
        columns += [("age_days", "array<float>")] if self.age_days else []
        columns += [(name, "int") for name in self.static_ids] + [(name, "float") for name in self.static_floats]
        columns += [("next_item", "int")] if self.next_item else []
        for days in self.horizons_days:
            columns += [(f"act_{days}d", "int"), (f"value_{days}d", "double")]
        return columns


def build_rows(plan: TimeRowsPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function. Its input: one partition's rows, each user's rows together, sorted
    by kind (tokens, then act-only rows) and the tokens in token order: user_id, ts (epoch micros),
    kind, is_act, tok_<feature>, the float features, count for day tokens, and user_<name>.

    A user's rows can straddle Arrow batches, so the last user of each batch waits for the next
    (a user longer than many batches waits in pieces, joined once).
    """
    waiting: list[pa.RecordBatch] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        users = batch.column("user_id")
        last_user = users[-1].as_py()
        last_user_start = int(np.flatnonzero(pc.equal(users, last_user).to_numpy(zero_copy_only=False))[0])
        if last_user_start == 0 and waiting and waiting[-1].column("user_id")[-1].as_py() == last_user:
            waiting.append(batch)  # the same user still
            continue
        complete = [*waiting, batch.slice(0, last_user_start)]
        waiting = [batch.slice(last_user_start)]
        yield from _rows(plan, complete)
    yield from _rows(plan, waiting)


ROW_GROUP_BYTES = 64 << 20
"""Rows `write_rows` gathers (in Arrow, uncompressed) before writing them as one Parquet row
group: about Spark's 128 MB row groups once compressed (the loader shuffles by row group)."""


@dataclass
class SplitSummary:
    """What a writer wrote of one split: what ingest records, without reading the rows back."""

    rows: int = 0
    tokens: int = 0
    hash: int = 0
    """The sum of the rows' `arrow_hash.row_hashes`, mod 2^64."""

    def add(self, other: SplitSummary) -> SplitSummary:
        return SplitSummary(self.rows + other.rows, self.tokens + other.tokens, (self.hash + other.hash) % 2**64)


def write_rows(plan: TimeRowsPlan, path: str, schema: pa.Schema, future: dict[int, dict[str, list[int]]],
               batches: Iterator[pa.RecordBatch]) -> dict[str, SplitSummary]:
    """Build one partition's rows (`build_rows`) and write them to a Parquet file at `path`, in
    the columns and types of `schema` (the sequences table's: `as_of` a UTC timestamp); return
    each split's rows, tokens and content hash (no file when no rows). `future`: as_of micros →
    flag → its value on each decoder slot, every row's future_<flag> (the calendar is the same for
    every user)."""
    import pyarrow.parquet as pq

    writer, pending, summary = None, [], {}

    def flush() -> None:
        nonlocal writer, pending
        if pending:
            table = pa.concat_tables(pending)
            writer = writer or pq.ParquetWriter(path, schema, compression="snappy")
            writer.write_table(table, row_group_size=table.num_rows)
            pending = []

    for batch in build_rows(plan, batches):
        table = _table_rows(batch, schema, future)
        for split, part in _summarise(table).items():  # hashed here, while the batch is in cache
            summary[split] = summary.get(split, SplitSummary()).add(part)
        pending.append(table)
        if sum(table.nbytes for table in pending) >= ROW_GROUP_BYTES:
            flush()
    flush()
    if writer is not None:
        writer.close()
    return summary


def _summarise(table: pa.Table) -> dict[str, SplitSummary]:
    hashes, lengths = row_hashes(table), table.column("length").to_numpy()
    splits = table.column("split").to_numpy(zero_copy_only=False)
    return {split: SplitSummary(int(rows.sum()), int(lengths[rows].sum()), int(hashes[rows].sum(dtype=np.uint64)))
            for split in np.unique(splits) for rows in [splits == split]}


def _table_rows(batch: pa.RecordBatch, schema: pa.Schema, future: dict[int, dict[str, list[int]]]) -> pa.Table:
    """`build_rows`' batch as the table's rows: as_of a timestamp, future_<flag> added, `schema`'s order."""
    as_of = batch.column("as_of_micros")
    cutoffs = np.array(sorted(future), dtype=np.int64)
    columns = []
    for field in schema:
        if field.name == "as_of":
            columns.append(as_of.cast(pa.timestamp("us", tz="UTC")))
        elif field.name.startswith("future_"):
            flag = field.name.removeprefix("future_")
            values = np.array([future[micros][flag] for micros in cutoffs], dtype=np.int32)  # (cutoffs, slots)
            rows = values[np.searchsorted(cutoffs, as_of.to_numpy())]
            offsets = np.arange(0, rows.size + 1, values.shape[1], dtype=np.int32)
            columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows.ravel())))
        else:
            columns.append(batch.column(field.name))
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def _rows(plan: TimeRowsPlan, batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    batches = [batch for batch in batches if batch.num_rows]
    if not batches:
        return
    rows = _Rows(plan, pa.Table.from_batches(batches).combine_chunks())
    if rows.count:
        yield rows.record_batch()


class _Rows:
    """The rows of complete users: one per user and cutoff with at least min_history tokens before it."""

    def __init__(self, plan: TimeRowsPlan, table: pa.Table) -> None:
        self.plan = plan
        user_ids = table.column("user_id").combine_chunks()
        new_user = np.ones(len(user_ids), dtype=bool)
        new_user[1:] = pc.not_equal(user_ids.slice(1), user_ids.slice(0, len(user_ids) - 1)).to_numpy(zero_copy_only=False)
        user_of_row = np.cumsum(new_user) - 1
        n_users = int(user_of_row[-1]) + 1
        kind = _numbers(table, "kind", np.int8) if "kind" in table.column_names else None
        if kind is None:
            token_table, token_user = table, user_of_row
        else:
            is_token = kind == TOKEN
            token_table, token_user = table.filter(pa.array(is_token)), user_of_row[is_token]
        self.tokens = _Tokens(plan, token_table, token_user, n_users)
        self.static = self.tokens.static(plan)
        self.acts = _Acts(table, user_of_row, n_users) if plan.targets and plan.horizons_days else None
        self.user_ids = user_ids.filter(pa.array(new_user))

        # One candidate per (user, cutoff), user-major; keep those with enough history.
        tokens = self.tokens
        as_of = np.array([micros for _, micros in plan.cutoffs], dtype=np.int64)
        cuts = np.stack([tokens.before(micros) for micros in as_of], axis=1)  # (users, cutoffs)
        keep = (cuts >= plan.min_history) & (tokens.count > 0)[:, None]  # act-only rows are no history
        self.user, self.cutoff = np.nonzero(keep)
        self.cut = cuts[keep]
        self.as_of = as_of[self.cutoff]
        self.count = len(self.cut)

    def record_batch(self) -> pa.RecordBatch:
        plan, tokens = self.plan, self.tokens
        first = np.maximum(self.cut - plan.max_len, 0)
        length = self.cut - first
        offsets = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        # Index of every history token, row after row: each row's run start … start + length - 1.
        run_start = tokens.start[self.user] + first
        gather = np.repeat(run_start - offsets[:-1], length) + np.arange(offsets[-1], dtype=np.int64)
        arrow_offsets = pa.array(offsets.astype(np.int32))

        def history(values: np.ndarray) -> pa.Array:
            return pa.ListArray.from_arrays(arrow_offsets, pa.array(values[gather]))

        columns: dict[str, pa.Array] = {
            "user_id": self.user_ids.take(pa.array(self.user)),
            "split": pa.array(np.array([split for split, _ in plan.cutoffs], dtype=object)[self.cutoff], pa.string()),
            "as_of_micros": pa.array(self.as_of),
            "length": pa.array(length.astype(np.int32)),
        }
        columns |= {name: history(tokens.ids[name]) for name in plan.id_features}
        columns |= {name: history(tokens.floats[name]) for name in plan.float_features}
        if plan.day_counts:
            columns["count"] = history(tokens.day_counts)
        columns |= {name: history(values) for name, values in tokens.time_features().items()}
        if plan.age_days:
            ages = (np.repeat(self.as_of, length) - tokens.ts[gather]).astype(np.float64) / MICROS_PER_DAY
            columns["age_days"] = pa.ListArray.from_arrays(arrow_offsets, pa.array(ages.astype(np.float32)))
        columns |= {name: pa.array(values[self.user]) for name, values in self.static.items()}
        if plan.next_item:
            has_target = self.cut < tokens.count[self.user]
            target = np.where(has_target, tokens.start[self.user] + self.cut, 0)
            columns["next_item"] = pa.array(tokens.ids["item"][target], mask=~has_target)
        for days in plan.horizons_days:
            acted, value = self._act_targets(days)
            columns[f"act_{days}d"], columns[f"value_{days}d"] = pa.array(acted), pa.array(value)
        return pa.RecordBatch.from_pydict(columns)

    def _act_targets(self, days: int) -> tuple[np.ndarray, np.ndarray]:
        """act_<days>d (int32) and value_<days>d (float64) of every row."""
        if self.acts is None:
            return np.zeros(self.count, dtype=np.int32), np.zeros(self.count, dtype=np.float64)
        low = self.acts.first_at_or_after(self.user, self.as_of)
        high = self.acts.first_at_or_after(self.user, self.as_of + days * MICROS_PER_DAY)
        return (high > low).astype(np.int32), _ordered_sums(self.acts.values, low, high)


class _Tokens:
    """A batch's token rows (users together, each in token order) as NumPy arrays."""

    def __init__(self, plan: TimeRowsPlan, table: pa.Table, user: np.ndarray, n_users: int) -> None:
        self.table = table
        self.ts = _numbers(table, "ts", np.int64)
        self.user = user
        self.count = np.bincount(user, minlength=n_users)
        self.start = np.zeros(n_users, dtype=np.int64)
        np.cumsum(self.count[:-1], out=self.start[1:])
        self.ids = {name: plan.token_ids.ids(name, table.column(f"tok_{name}")) for name in plan.id_features}
        self.floats = {name: _numbers(table, name, np.float64).astype(np.float32) for name in plan.float_features}
        self.day_counts = _numbers(table, "count", np.int32) if plan.day_counts else None

    def static(self, plan: TimeRowsPlan) -> dict[str, np.ndarray]:
        """user_<name> → its value per user, read from the user's first token (OOV or 0.0 for null)."""
        first = np.minimum(self.start, max(len(self.ts) - 1, 0))
        values = {name: _numbers(self.table, name, np.int32, null=OOV_ID)[first] for name in plan.static_ids}
        return values | {name: _numbers(self.table, name, np.float32)[first] for name in plan.static_floats}

    def before(self, micros: int) -> np.ndarray:
        """Per user, how many tokens come before `micros` (tokens are in time order, so a prefix)."""
        return np.bincount(self.user, weights=self.ts < micros, minlength=len(self.count)).astype(np.int64)

    def time_features(self) -> dict[str, np.ndarray]:
        """hour, weekday (0 = Monday) and gap_bucket of every token, in UTC."""
        day, micros_of_day = np.divmod(self.ts, MICROS_PER_DAY)  # floor division: right before 1970 too
        first = np.zeros(len(self.ts), dtype=bool)
        first[self.start[self.count > 0]] = True
        minutes = np.zeros(len(self.ts), dtype=np.int64)
        minutes[1:] = (self.ts[1:] - self.ts[:-1]) // MICROS_PER_MINUTE
        gap = np.where(first, 0, 1 + np.searchsorted(GAP_POWERS, minutes + 1, side="right"))
        return {
            "hour": (micros_of_day // MICROS_PER_HOUR).astype(np.int32),
            "weekday": ((day + EPOCH_WEEKDAY) % 7).astype(np.int32),
            "gap_bucket": gap.astype(np.int32),
        }


class _Acts:
    """A batch's act events, per user in (time, value) order: what the act targets count and sum."""

    def __init__(self, table: pa.Table, user_of_row: np.ndarray, n_users: int) -> None:
        is_act = _numbers(table, "is_act", np.bool_)
        user = user_of_row[is_act]
        ts = _numbers(table, "ts", np.int64)[is_act]
        value = table.column("value").filter(pa.array(is_act)) if "value" in table.column_names else None
        has_value = np.zeros(len(user), dtype=bool) if value is None else pc.is_valid(value).to_numpy(zero_copy_only=False)
        values = np.zeros(len(user)) if value is None else _numbers(pa.table({"value": value}), "value", np.float64)
        order = np.lexsort((values, has_value, ts, user))  # the last key sorts first; nulls first
        self.user, self.ts, self.values = user[order], ts[order], values[order]
        self.start = np.searchsorted(self.user, np.arange(n_users))
        self.n_users = n_users

    def first_at_or_after(self, user: np.ndarray, micros: np.ndarray) -> np.ndarray:
        """Per row, the index of its user's first act at or after its `micros` (one value per row).

        Rows share a handful of distinct bounds (cutoff + horizon), so each user's count of acts
        before a bound is one bincount over the acts per distinct bound.
        """
        index = np.empty(len(user), dtype=np.int64)
        for bound in np.unique(micros):
            rows = micros == bound
            before = np.bincount(self.user, weights=self.ts < bound, minlength=self.n_users).astype(np.int64)
            index[rows] = self.start[user[rows]] + before[user[rows]]
        return index


def _ordered_sums(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """sum(values[low:high]) per row, added first to last from 0.0: the same bits on every run
    (a pairwise or cumulative sum would round differently from one element order to another).

    Rows are visited longest first, so step j adds the j-th value of the rows that have one."""
    lengths = high - low
    by_length = np.argsort(-lengths, kind="stable")
    sorted_lengths, sorted_low = lengths[by_length], low[by_length]
    totals = np.zeros(len(low))
    for step in range(int(sorted_lengths[0]) if len(low) else 0):
        active = int(np.searchsorted(-sorted_lengths, -step, side="left"))  # rows with length > step
        totals[:active] += values[sorted_low[:active] + step]
    out = np.empty_like(totals)
    out[by_length] = totals
    return out


def _numbers(table: pa.Table, name: str, dtype, null=0) -> np.ndarray:
    """A column as a NumPy array, nulls read as `null`."""
    column = table.column(name)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(null, column.type) if dtype is not np.bool_ else False)
    return column.to_numpy().astype(dtype, copy=False)
