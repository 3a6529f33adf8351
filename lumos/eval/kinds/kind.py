"""What an eval task kind is: the `TaskKind` record each kind module builds, the `Scores` it
returns, what a submission of the kind holds (`Prediction`), and the few helpers the kinds share
(the rows loader, the horizon a task reads)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from lumos.core.errors import UsageError
from lumos.data.loader import SequenceLoader
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache
    from lumos.train.model import LumosModel


@dataclass(frozen=True)
class Scores:
    metrics: dict[str, float]
    rows: int
    """Rows of the split that were scored."""
    spread: dict[str, float] = field(default_factory=dict)
    """Kinds that score over folds (user_label): each metric's sample std over the folds, whose
    mean `metrics` holds; a leaderboard entry logs it as <metric>_std."""


ScoreModel = Callable[["LumosModel", LoadedTaskLike, SequencesVersion, torch.device, "EmbeddingCache"], Scores]
"""(model on `device` in eval mode, task, data, device, the run's shared user embeddings) -> scores."""
ScoreBaseline = Callable[[LoadedTaskLike, SequencesVersion], tuple[str, Scores]]
"""(task, data) -> (baseline name, scores) of the task's "no model" leaderboard entry."""


@dataclass(frozen=True)
class Broken:
    """One rule a submission's predictions break, and the rows (positions in the file) that break it."""

    rule: str
    rows: np.ndarray


CheckPredictions = Callable[[TaskSpecLike, SequencesVersion, pa.ChunkedArray], list[Broken]]
"""(task, data, the prediction column as read) -> the rules its values break; empty when none."""
ScorePredictions = Callable[[TaskSpecLike, SequencesVersion, pa.Table, pa.ChunkedArray], Scores]
"""(task, data, the split's rows with their labels, the checked predictions in the rows' order) ->
scores, computed by the same metric code as the kind's model scores."""


@dataclass(frozen=True)
class Prediction:
    """What a submission gives for each user of a task of this kind (beside `user_id`)."""

    column: str
    """The column's name in a submission file."""
    type: str
    """Its type, as the schema states it (list<int64> or double)."""
    description: str
    """What the value means, for the team that writes it."""
    rules: Callable[[TaskSpecLike], list[str]]
    """The column's rules for a task, as the submission schema states them."""
    check: CheckPredictions
    score: ScorePredictions


@dataclass(frozen=True)
class TaskKind:
    """One kind of eval task: the value of a task spec's `kind` key and everything that depends on it."""

    name: str
    """What a task spec writes as its kind."""
    default_metrics: Callable[[TaskSpecLike], tuple[str, ...]]
    """The metrics a task reports when its spec names none."""
    score: ScoreModel
    """Scores a model on the task's rows: reads the labels, runs the model, computes the metrics."""
    baselines: tuple[ScoreBaseline, ...] = ()
    """The "no model" entries every leaderboard shows, the main one first (the one `lumos eval`
    prints beside the model); empty when the kind has none."""
    head: str | None = None
    """The model head the kind reads; a model without it is refused before scoring."""
    takes_labels: bool = False
    """Whether a task of this kind must carry a [labels] table (and others must not)."""
    takes_window: bool = False
    """Whether a task of this kind must carry a [window] (a global cutoff and its events; others must not)."""
    prediction: Prediction | None = None
    """What a leaderboard submission of this kind holds and how it is scored; None when the kind
    takes no submissions (an embedding probe needs a model's embeddings)."""


def picked_scores(spec: TaskSpecLike, values: Mapping[str, float], rows: int) -> Scores:
    """The task's metrics out of everything a metrics function computed."""
    return Scores({name: float(values[name]) for name in spec.metric_names if name in values}, rows)


def task_batches(data: SequencesVersion, spec: TaskSpecLike, split: str | None = None) -> SequenceLoader:
    """Batches of the task's split (or `split`), on `data`'s side of its users. Every row is scored and the metrics do not depend
    on row order, so batches go by history length: a batch is padded to its longest."""
    return SequenceLoader(data.snapshot, data.spec, spec.batch_size, split=split or spec.split, shuffle=False,
                          by_length=True, users=data.users)


def horizon_index(spec: TaskSpecLike, data: SequencesVersion) -> int:
    """Position of the task's horizon among the sequences' horizons (act_<K>d, value_<K>d columns)."""
    if spec.horizon_days not in data.spec.horizons_days:
        raise UsageError(f"task {spec.name}: {data.ref} has no {spec.horizon_days}-day horizon "
                         f"(it has {', '.join(map(str, data.spec.horizons_days)) or 'none'})")
    return data.spec.horizons_days.index(spec.horizon_days)


def labels_and_predictions(model: LumosModel, spec: TaskSpecLike, data: SequencesVersion, device: torch.device,
                           label: Callable, predict: Callable) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per batch of the task's rows, `label(batch)` and `predict(model(batch))`, both as numpy: the
    loop the horizon kinds (binary, regression) score a model with."""
    labels, predictions = [], []
    with torch.no_grad():
        for batch in task_batches(data, spec):
            batch = batch.to(device)
            labels.append(label(batch).cpu().numpy())
            predictions.append(predict(model(batch)).cpu().numpy())
    return labels, predictions


def rows_where(mask: np.ndarray) -> np.ndarray:
    """Positions of the rows a rule flags."""
    return np.flatnonzero(mask)


def float_values(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric prediction column as float64 (nulls as NaN, so the finiteness rule catches them)."""
    import pyarrow.compute as pc

    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
