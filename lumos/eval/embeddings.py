"""User embeddings of one model, computed once per (data version, split, batch size) and shared by
every task of an eval run that reads them (`lumos eval --all` scores all its probe tasks off one)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import torch

from lumos.data.loader import history_length_order, selected_rows, table_batches, unsort
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.task_spec import TaskSpecLike
from lumos.train.model import LumosModel


@dataclass(frozen=True)
class UserEmbeddings:
    """A split's user embeddings (N, C) with the (user_id, as_of) of each row, in loader order."""

    matrix: np.ndarray
    users: list[str]
    as_of: list


class EmbeddingCache:
    """User embeddings of one model by (data version, split, batch size, user side): a probe task reads the
    embeddings another task on the same rows already computed, instead of running the model again."""

    def __init__(self) -> None:
        self._computed: dict[tuple[str, str, int], UserEmbeddings] = {}

    def get(self, model: LumosModel, data: SequencesVersion, spec: TaskSpecLike, device: torch.device) -> UserEmbeddings:
        key = (str(data.ref), spec.split, spec.batch_size, data.users)
        if key not in self._computed:
            # One read: each embedding comes from the row that names its user, so nothing rests on
            # two reads returning rows in the same order.
            rows = split_rows(data, spec.split)
            # Batched shortest history first (a batch is padded to its longest), then put back
            # in the rows' order, so the probes see exactly what they saw before.
            order = history_length_order(rows, data.spec)
            matrix = []
            with torch.no_grad():
                for batch in table_batches(rows.take(order), data.spec, spec.batch_size,
                                           f"split {spec.split} of {data.ref}"):
                    matrix.append(model.embed_users(batch.to(device)).cpu().numpy())
            self._computed[key] = UserEmbeddings(unsort(np.concatenate(matrix), order), rows["user_id"].to_pylist(),
                                                 rows["as_of"].to_pylist())
        return self._computed[key]


def split_rows(data: SequencesVersion, split: str):
    """Every column of a split's rows (on `data`'s side of its users), as one Arrow table."""
    table = pq.read_table([data_file.path for data_file in data.snapshot.files])
    return table.filter(selected_rows(table, split, data.users))
