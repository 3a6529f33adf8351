"""regression: the value a user brings within the task's horizon (RMSE, MAE, MAPE).

The label is the row's value_<K>d; the model's is its regression head at that horizon, mapped back
from the signed log scale it is trained on. The baseline predicts the training split's mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from lumos.data.sequences_version import SequencesVersion
from lumos.eval import metrics as M
from lumos.eval.kinds.kind import Scores, TaskKind, horizon_index, picked_scores, task_batches
from lumos.train.model import LumosModel, signed_expm1

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache
    from lumos.eval.tasks import LoadedTask, TaskSpec


def default_metrics(spec: TaskSpec) -> tuple[str, ...]:
    return ("rmse", "mae", "mape")


def score(model: LumosModel, task: LoadedTask, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec = task.spec
    horizon = horizon_index(spec, data)
    labels, predictions = [], []
    with torch.no_grad():
        for batch in task_batches(data, spec):
            batch = batch.to(device)
            output = model(batch)
            labels.append(batch.value[:, horizon].cpu().numpy())
            predictions.append(signed_expm1(output.value_pred[:, horizon]).cpu().numpy())
    return _scores(spec, labels, predictions)


def train_mean_baseline(task: LoadedTask, data: SequencesVersion) -> tuple[str, Scores]:
    spec = task.spec
    horizon = horizon_index(spec, data)
    train = task_batches(data, spec, split="train")
    mean = float(np.mean(np.concatenate([batch.value[:, horizon].numpy() for batch in train])))
    labels, predictions = [], []
    for batch in task_batches(data, spec):
        labels.append(batch.value[:, horizon].numpy())
        predictions.append(np.full(batch.size, mean))
    return "train_mean", _scores(spec, labels, predictions)


def _scores(spec: TaskSpec, labels: list[np.ndarray], predictions: list[np.ndarray]) -> Scores:
    y, p = np.concatenate(labels), np.concatenate(predictions)
    return picked_scores(spec, M.regression_metrics(y, p), len(y))


KIND = TaskKind("regression", default_metrics, score, baseline=train_mean_baseline, head="regression")
