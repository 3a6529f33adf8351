"""What an eval task kind is: the `TaskKind` record each kind module builds, the `Scores` it
returns, and the few helpers the kinds share (the rows loader, the horizon a task reads)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lumos.core.errors import UsageError
from lumos.data.loader import SequenceLoader
from lumos.data.sequences_version import SequencesVersion

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache
    from lumos.eval.tasks import LoadedTask, TaskSpec
    from lumos.train.model import LumosModel


@dataclass(frozen=True)
class Scores:
    metrics: dict[str, float]
    rows: int
    """Rows of the split that were scored."""


ScoreModel = Callable[["LumosModel", "LoadedTask", SequencesVersion, torch.device, "EmbeddingCache"], Scores]
"""(model on `device` in eval mode, task, data, device, the run's shared user embeddings) -> scores."""
ScoreBaseline = Callable[["LoadedTask", SequencesVersion], tuple[str, Scores]]
"""(task, data) -> (baseline name, scores) of the task's "no model" leaderboard entry."""


@dataclass(frozen=True)
class TaskKind:
    """One kind of eval task: the value of a task spec's `kind` key and everything that depends on it."""

    name: str
    """What a task spec writes as its kind."""
    default_metrics: Callable[[TaskSpec], tuple[str, ...]]
    """The metrics a task reports when its spec names none."""
    score: ScoreModel
    """Scores a model on the task's rows: reads the labels, runs the model, computes the metrics."""
    baseline: ScoreBaseline | None = None
    """The "no model" entry every leaderboard shows; None when the kind has none."""
    head: str | None = None
    """The model head the kind reads; a model without it is refused before scoring."""
    takes_labels: bool = False
    """Whether a task of this kind must carry a [labels] table (and others must not)."""


def picked_scores(spec: TaskSpec, values: Mapping[str, float], rows: int) -> Scores:
    """The task's metrics out of everything a metrics function computed."""
    return Scores({name: float(values[name]) for name in spec.metric_names if name in values}, rows)


def task_batches(data: SequencesVersion, spec: TaskSpec, split: str | None = None) -> SequenceLoader:
    """Batches of the task's split (or `split`). Every row is scored and the metrics do not depend
    on row order, so batches go by history length: a batch is padded to its longest."""
    return SequenceLoader(data.snapshot, data.spec, spec.batch_size, split=split or spec.split, shuffle=False,
                          by_length=True)


def horizon_index(spec: TaskSpec, data: SequencesVersion) -> int:
    """Position of the task's horizon among the sequences' horizons (act_<K>d, value_<K>d columns)."""
    if spec.horizon_days not in data.spec.horizons_days:
        raise UsageError(f"task {spec.name}: {data.ref} has no {spec.horizon_days}-day horizon "
                         f"(it has {', '.join(map(str, data.spec.horizons_days)) or 'none'})")
    return data.spec.horizons_days.index(spec.horizon_days)
