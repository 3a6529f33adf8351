"""user_label: a per-user label (a class, or a set of labels) predicted from what is known of the
user before the split's target, over k seeded folds of users (lumos.eval.cross_validation).

The labels come from the task's [labels] table, one row per user; each labelled user of the split
counts once (their latest row). A model entry's features are its frozen user embeddings; the
baseline, `bag_of_items`, reads the same rows' history items as TF-IDF. Both go through the same
folds, the same logistic regression with C chosen by inner cross-validation on the training users,
and the same metric code, so they differ only in their features. Scores are the mean over folds,
with each metric's std as the spread.
"""

from __future__ import annotations

import torch

from lumos.data.sequences_version import SequencesVersion
from lumos.eval.cross_validation import CrossValidated, cross_validate, logistic_estimator
from lumos.eval.embeddings import EmbeddingCache, split_rows
from lumos.eval.kinds.embedding_probe import labelled_rows, read_labels
from lumos.eval.kinds.kind import Scores, TaskKind
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike
from lumos.train.model import LumosModel


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    if spec.labels and spec.labels.target == "label_sets":
        return ("macro_auc_roc",)
    return ("accuracy", "macro_f1", "log_loss")


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    computed = embeddings.get(model, data, task.spec, device)
    label_of = read_labels(task)
    chosen = labelled_rows(task.spec, computed.users, computed.as_of, label_of)
    users = [computed.users[i] for i in chosen]
    return _scores(task.spec, cross_validate(computed.matrix[chosen], [label_of[user] for user in users], users,
                                             task.spec.labels.target, task.spec.labels.folds, task.spec.labels.seed,
                                             lambda: logistic_estimator("dense", task.spec.labels.target, task.spec.labels.seed)))


def bag_of_items_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    """TF-IDF of the items in each user's history (what the model reads: the split row's history,
    before its target) and a logistic regression, over the same folds as a model entry."""
    spec = task.spec
    rows = split_rows(data, spec.split)
    label_of = read_labels(task)
    users_of_rows = rows["user_id"].to_pylist()
    chosen = labelled_rows(spec, users_of_rows, rows["as_of"].to_pylist(), label_of)
    histories = rows[data.spec.item_feature].take(chosen).to_pylist()
    bags = [[str(item) for item in history if item is not None] for history in histories]
    users = [users_of_rows[i] for i in chosen]
    return "bag_of_items", _scores(spec, cross_validate(bags, [label_of[user] for user in users], users,
                                                        spec.labels.target, spec.labels.folds, spec.labels.seed,
                                                        lambda: logistic_estimator("bag", spec.labels.target, spec.labels.seed)))


def _scores(spec: TaskSpecLike, result: CrossValidated) -> Scores:
    names = [name for name in spec.metric_names if name in result.metrics]
    return Scores({name: result.metrics[name] for name in names}, result.users,
                  spread={name: result.metrics[f"{name}_std"] for name in names})


KIND = TaskKind("user_label", default_metrics, score, baselines=(bag_of_items_baseline,), takes_labels=True)
