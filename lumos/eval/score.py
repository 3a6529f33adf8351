"""Scoring: run a trained model (or a "no model" baseline) over a task's rows and compute its metrics.

What a task's labels are, how the model is read, which baseline it has and which metrics it
reports depend on its kind; each kind is a module of lumos/eval/kinds/, and this module dispatches
to it through `KINDS` after the checks every kind shares.
"""

from __future__ import annotations

import torch

from lumos.core.errors import UsageError
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.embeddings import EmbeddingCache
from lumos.eval.kinds import KINDS, Scores, TaskKind
from lumos.eval.tasks import LoadedTask, TaskSpec
from lumos.train.model import LumosModel

__all__ = ["EmbeddingCache", "Scores", "has_baseline", "score_baseline", "score_baselines", "score_model"]


def score_model(model: LumosModel, task: LoadedTask, data: SequencesVersion,
                embeddings: EmbeddingCache | None = None) -> Scores:
    """`embeddings`: user embeddings already computed for this model, reused by probe tasks on the
    same data version and split (`lumos eval --all` shares one across its tasks)."""
    spec = task.spec
    kind = KINDS[spec.kind]
    _check_compatible(model, spec, kind, data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # full-corpus ranking is (B, V) work
    model = model.to(device).eval()
    return kind.score(model, task, data, device, embeddings if embeddings is not None else EmbeddingCache())


def has_baseline(task: LoadedTask) -> bool:
    return bool(KINDS[task.spec.kind].baselines)


def score_baselines(task: LoadedTask, data: SequencesVersion) -> list[tuple[str, Scores]]:
    """Every "no model" entry of a task's leaderboard, the main one first: (baseline name, scores)."""
    return [baseline(task, data) for baseline in _baselines(task)]


def score_baseline(task: LoadedTask, data: SequencesVersion) -> tuple[str, Scores]:
    """The main "no model" entry of a task's leaderboard: (baseline name, scores)."""
    return _baselines(task)[0](task, data)


def _baselines(task: LoadedTask):
    spec = task.spec
    baselines = KINDS[spec.kind].baselines
    if not baselines:
        raise UsageError(f"task {spec.name}: {spec.kind} tasks have no baseline")
    return baselines


def _check_compatible(model: LumosModel, spec: TaskSpec, kind: TaskKind, data: SequencesVersion) -> None:
    if model.features.token_categorical != data.spec.token_categorical:
        raise UsageError(f"task {spec.name}: the model was trained on other vocabularies than {data.ref}; "
                         "evaluate it on the sequences version it was trained on (set the task's data)")
    if kind.head and kind.head not in model.config.heads:
        raise UsageError(f"task {spec.name}: the model has no {kind.head} head")
