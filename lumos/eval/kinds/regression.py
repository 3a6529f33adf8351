"""regression: the value a user brings within the task's horizon (RMSE, MAE, MAPE).

The label is the row's value_<K>d; the model's is its regression head at that horizon, mapped back
from the signed log scale it is trained on. The baseline predicts the training split's mean. A submission gives each user a `value`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from lumos.data.sequences_version import SequencesVersion
from lumos.eval import metrics as M
from lumos.eval.kinds.kind import (
    Broken,
    Prediction,
    Scores,
    TaskKind,
    float_values,
    horizon_index,
    labels_and_predictions,
    picked_scores,
    rows_where,
    task_batches,
)
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike
from lumos.train.model import LumosModel, signed_expm1

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    return ("rmse", "mae", "mape")


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec = task.spec
    horizon = horizon_index(spec, data)
    labels, predictions = labels_and_predictions(model, spec, data, device, lambda batch: batch.value[:, horizon],
                                                 lambda output: signed_expm1(output.value_pred[:, horizon]))
    return _scores(spec, labels, predictions)


def train_mean_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    spec = task.spec
    horizon = horizon_index(spec, data)
    train = task_batches(data, spec, split="train")
    mean = float(np.mean(np.concatenate([batch.value[:, horizon].numpy() for batch in train])))
    labels, predictions = [], []
    for batch in task_batches(data, spec):
        labels.append(batch.value[:, horizon].numpy())
        predictions.append(np.full(batch.size, mean))
    return "train_mean", _scores(spec, labels, predictions)


def _scores(spec: TaskSpecLike, labels: list[np.ndarray], predictions: list[np.ndarray]) -> Scores:
    y, p = np.concatenate(labels), np.concatenate(predictions)
    return picked_scores(spec, M.regression_metrics(y, p), len(y))


def check_values(spec: TaskSpecLike, data: SequencesVersion, column: pa.ChunkedArray) -> list[Broken]:
    finite = np.isfinite(float_values(column))
    return [Broken("value must be a finite number (no null, NaN or infinity)", rows_where(~finite))] if not finite.all() else []


def score_values(spec: TaskSpecLike, data: SequencesVersion, rows: pa.Table, column: pa.ChunkedArray) -> Scores:
    labels = rows[f"value_{data.spec.horizons_days[horizon_index(spec, data)]}d"].to_numpy(zero_copy_only=False)
    return _scores(spec, [labels], [float_values(column)])


PREDICTION = Prediction("value", "double", "the value the user brings within the task's horizon",
                        lambda spec: ["value: a finite number"], check_values, score_values)
KIND = TaskKind("regression", default_metrics, score, baselines=(train_mean_baseline,), head="regression",
                prediction=PREDICTION)
