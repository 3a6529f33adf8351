"""binary: the probability of acting within the task's horizon (AUC-ROC, PR-AUC, log loss, accuracy).

The label is the row's act_<K>d; the model's is the sigmoid of its binary head at that horizon.
The baseline predicts the training split's positive rate for everyone. A submission gives each
user a `probability` in [0, 1].
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
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    return ("auc_roc", "pr_auc", "log_loss", "accuracy")


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec = task.spec
    horizon = horizon_index(spec, data)
    labels, probabilities = labels_and_predictions(model, spec, data, device, lambda batch: batch.act[:, horizon],
                                                   lambda output: torch.sigmoid(output.act_logits[:, horizon]))
    return _scores(spec, labels, probabilities)


def prior_rate_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    spec = task.spec
    horizon = horizon_index(spec, data)
    train = task_batches(data, spec, split="train")
    rate = float(np.mean(np.concatenate([batch.act[:, horizon].numpy() for batch in train])))
    labels, probabilities = [], []
    for batch in task_batches(data, spec):
        labels.append(batch.act[:, horizon].numpy())
        probabilities.append(M.prior_rate_probabilities(rate, batch.size))
    return "prior_rate", _scores(spec, labels, probabilities)


def _scores(spec: TaskSpecLike, labels: list[np.ndarray], probabilities: list[np.ndarray]) -> Scores:
    y, p = np.concatenate(labels), np.concatenate(probabilities)
    return picked_scores(spec, M.binary_metrics(y, p, spec.decision_threshold), len(y))


def check_probabilities(spec: TaskSpecLike, data: SequencesVersion, column: pa.ChunkedArray) -> list[Broken]:
    values = float_values(column)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        outside = finite & ((values < 0) | (values > 1))
    return [broken for broken in (Broken("probability must be a finite number (no null, NaN or infinity)", rows_where(~finite)),
                                  Broken("probability must lie in [0, 1]", rows_where(outside))) if broken.rows.size]


def score_probabilities(spec: TaskSpecLike, data: SequencesVersion, rows: pa.Table, column: pa.ChunkedArray) -> Scores:
    labels = rows[f"act_{data.spec.horizons_days[horizon_index(spec, data)]}d"].to_numpy(zero_copy_only=False)
    return _scores(spec, [labels], [float_values(column)])


PREDICTION = Prediction("probability", "double", "probability that the user acts within the task's horizon",
                        lambda spec: ["probability: a finite number in [0, 1]"], check_probabilities, score_probabilities)
KIND = TaskKind("binary", default_metrics, score, baselines=(prior_rate_baseline,), head="binary", prediction=PREDICTION)
