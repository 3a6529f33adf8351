"""The Arrow builder's own edges, without Spark: how a partition is cut into batches, and sums."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from lumos.data.contract import OOV_ID
from lumos.data.time_rows import MICROS_PER_DAY, TimeRowsPlan, TokenIds, _ordered_sums, build_rows

PLAN = TimeRowsPlan(
    cutoffs=(("train", 3 * MICROS_PER_DAY), ("test", 6 * MICROS_PER_DAY)), max_len=3, min_history=1,
    id_features=("item",), float_features=("value",), day_counts=False, age_days=True, next_item=True,
    horizons_days=(2,), targets=True, token_ids=TokenIds({"item": (["t2", "t3", "t4"], [2, 3, 4])}),
)


def partition() -> pa.Table:
    """Three users' tokens in token order: a has 2, b 9 (more than most batches), c 1."""
    users = ["a"] * 2 + ["b"] * 9 + ["c"]
    days = [0, 4] + list(range(9)) + [1]
    return pa.table({
        "user_id": users,
        "ts": [day * MICROS_PER_DAY + 3_600_000_000 for day in days],
        "tok_item": [f"t{2 + index % 3}" for index in range(len(users))],
        "value": [None if index % 4 == 0 else 0.1 * index for index in range(len(users))],
        "is_act": [index % 2 == 0 for index in range(len(users))],
    })  # fmt: skip


def rows(batch_size: int) -> list[dict]:
    batches = partition().to_batches(max_chunksize=batch_size)
    out = pa.Table.from_batches(list(build_rows(PLAN, iter(batches))))
    return sorted(out.to_pylist(), key=lambda row: (row["user_id"], row["as_of_micros"]))


def test_rows_do_not_depend_on_where_batches_end():
    whole = rows(100)
    assert [(row["user_id"], row["split"], row["length"]) for row in whole] == [
        ("a", "train", 1), ("a", "test", 2), ("b", "train", 3), ("b", "test", 3), ("c", "train", 1), ("c", "test", 1),
    ]  # fmt: skip
    b_test = whole[3]
    assert b_test["item"] == [2 + index % 3 for index in (5, 6, 7)]  # b's tokens on days 3, 4, 5
    assert b_test["next_item"] == 2 + 8 % 3  # day 6
    # Acts are the even rows: b's test window (days 6, 7) holds one, whose value is null (0);
    # its train window (days 3, 4) one, of value 0.6.
    assert (b_test["act_2d"], b_test["value_2d"]) == (1, 0.0)
    assert (whole[2]["act_2d"], whole[2]["value_2d"]) == (1, 0.1 * 6)
    assert whole[5]["next_item"] is None  # c has nothing after its cutoff
    for size in (1, 2, 3, 5):
        assert rows(size) == whole, size


def test_ordered_sums_add_first_to_last():
    rng = random.Random(0)
    values = np.array([rng.choice([1e16, 1.0, -1e16, 0.1, 3.3]) for _ in range(200)])
    low = np.array([rng.randrange(0, 100) for _ in range(50)])
    high = low + np.array([rng.randrange(0, 100) for _ in range(50)])
    sums = _ordered_sums(values, low, high)
    for row in range(50):
        total = 0.0
        for value in values[low[row]:high[row]]:
            total += value
        assert sums[row] == total  # the same bits: sums this far apart round differently in another order


def test_token_ids_map_null_and_unknown_tokens_to_oov_across_chunks():
    ids = TokenIds({"item": (["b", "a", "c"], [2, 3, 4]), "event_type": ([], [])})
    tokens = pa.chunked_array([["a", None, "zz"], ["c", "a", "b", ""]])
    assert ids.ids("item", tokens).tolist() == [3, OOV_ID, OOV_ID, 4, 3, 2, OOV_ID]
    assert ids.ids("item", tokens).dtype == np.int32
    assert ids.ids("event_type", tokens).tolist() == [OOV_ID] * 7  # an empty vocabulary
    assert ids.ids("item", pa.chunked_array([], pa.string())).tolist() == []
