"""embedding_probe: how much of a per-user label the frozen user embeddings already carry.

The labels come from the task's [labels] table (one row per user), not from the sequences. A probe
(lumos.eval.probe: logistic for classes, linear for numbers) is fitted on some users' embeddings and
scored on the others. There is no "no model" baseline: the probe needs a model's embeddings.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch

from lumos.core.errors import UsageError
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.embeddings import EmbeddingCache
from lumos.eval.kinds.kind import Scores, TaskKind
from lumos.eval.probe import run_probe
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike
from lumos.train.model import LumosModel


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    if spec.labels and spec.labels.probe == "logistic":
        return ("accuracy", "log_loss", "auc_roc")
    return ("rmse", "mae", "r2")


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec, labels_spec = task.spec, task.spec.labels
    computed = embeddings.get(model, data, spec, device)
    users, as_of = computed.users, computed.as_of
    label_of = read_labels(task)
    chosen = labelled_rows(spec, users, as_of, label_of)
    matrix = computed.matrix[chosen]
    result = run_probe(matrix, [label_of[users[i]] for i in chosen], [users[i] for i in chosen], labels_spec.probe,
                       test_fraction=labels_spec.test_fraction, seed=labels_spec.seed)
    return Scores({name: float(value) for name, value in result.metrics.items()}, result.test_users)


def read_labels(task: LoadedTaskLike) -> dict[str, object]:
    """The task's labels table as user id -> label."""
    labels_spec = task.spec.labels
    table = _read_labels(task.path.parent, labels_spec.path, [labels_spec.user_id, labels_spec.label])
    return dict(zip(map(str, table[labels_spec.user_id].to_pylist()), table[labels_spec.label].to_pylist(), strict=True))


def labelled_rows(spec: TaskSpecLike, users: list[str], as_of: list, label_of: dict[str, object]) -> list[int]:
    """Positions of the rows scored: one per labelled user, the split's latest row (largest as_of)
    when a user has several; in row order."""
    latest: dict[str, int] = {}
    for index, user in enumerate(users):
        if user not in latest or as_of[index] > as_of[latest[user]]:
            latest[user] = index
    chosen = sorted(index for user, index in latest.items() if label_of.get(user) is not None)
    if not chosen:
        raise UsageError(f"task {spec.name}: no user of split {spec.split!r} has a label in {spec.labels.path}")
    return chosen


def _read_labels(base: Path, location: str, columns: list[str]):
    path = (base / location).resolve()
    if not path.exists():
        raise UsageError(f"labels.path = {location!r}: {path} does not exist")
    if path.suffix == ".csv":
        import pyarrow.csv as pacsv

        table = pacsv.read_csv(path)
    else:
        table = pq.read_table(path)
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise UsageError(f"{path}: no column {', '.join(missing)}; it has {', '.join(table.column_names)}")
    return table.select(columns)


KIND = TaskKind("embedding_probe", default_metrics, score, takes_labels=True)
