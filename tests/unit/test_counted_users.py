"""The sequences writers count the users whose tokens they read: each user once, whether their
tokens fill many Arrow batches, share one with others, or start right after a batch boundary."""

from __future__ import annotations

import pyarrow as pa

from lumos.data.sequence_files import _CountedUsers


def test_each_user_counted_once_across_batch_boundaries():
    runs = [["a", "a"], ["a"], [], ["a", "b", "b"], ["c"], ["c", "c", "d"], ["e"]]
    batches = [pa.RecordBatch.from_pydict({"user_id": pa.array(ids, pa.string())}) for ids in runs]
    counted = _CountedUsers(iter(batches))
    assert [batch.num_rows for batch in counted] == [len(ids) for ids in runs]  # every batch passed on
    assert counted.users == 5


def test_no_batches_no_users():
    counted = _CountedUsers(iter([]))
    assert list(counted) == [] and counted.users == 0
