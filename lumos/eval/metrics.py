"""Evaluation metrics: small, pure, vectorized functions, one per metric, plus the no-model baselines.

Three task families, matching the model's heads:

- **Retrieval** (next item over the full item corpus): `lumos.train.retrieval_metrics`, one layer
  down, because training validates with the same ranks (`target_ranks`, `retrieval_metrics`,
  `popularity_scores`); their names and directions are here.
- **Binary** (labels y in {0, 1}, predicted probabilities p): `auc_roc`, `pr_auc`, `log_loss`,
  `accuracy`.
- **Classes** (class ids y, (N, K) probabilities): `class_metrics` (accuracy, macro_f1, log_loss,
  auc_roc for two classes); **label sets** ((N, L) indicators): `label_set_metrics` (macro_auc_roc).
- **Regression** (targets y, predictions yhat): `rmse`, `mae`, `mape`.
- **Next items** (each user's top-k list against a set of target items): `next_items_metrics`,
  recall@k and NDCG@k.

Tie rules (the one place where metric code silently differs between libraries):

- A target tied with other items gets its *expected* rank under random tie-breaking:
  rank = 1 + #(competitors scoring strictly higher) + #(competitors scoring exactly equal) / 2.
  A constant scorer therefore ranks every target in the middle, not first (optimistic) or last
  (pessimistic), so a degenerate model cannot look good.
  (`lumos.train.retrieval_metrics.target_ranks` implements it.)
- HR@k, NDCG@k and MRR apply their formulas to that (possibly fractional) rank: HR@k = [rank ≤ k],
  NDCG@k = [rank ≤ k] / log2(rank + 1), MRR = 1 / rank. This is not the exact expectation over tie
  orders (which would need the tie counts, not only the rank), but it coincides with it whenever
  the target is not tied, which is the case for any real-valued model score.
- AUC-ROC uses average ranks for tied probabilities (a tied positive/negative pair counts 1/2);
  PR-AUC treats tied probabilities as one threshold, as scikit-learn's average_precision_score.

Undefined values are NaN, never an exception: an empty input, AUC with a single class, PR-AUC with
no positives, MAPE with no non-zero target. Aggregates over NaN rows drop them first.

Names produced by the `*_metrics` functions, and whether larger is better, are in
`METRIC_DIRECTIONS` / `direction()`; row counts (`COUNT_KEYS`) have no direction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np

from lumos.train.retrieval_metrics import ArrayLike, as_float_array, mean_or_nan

# -- binary ---------------------------------------------------------------------------------------


def auc_roc(y: ArrayLike, p: ArrayLike) -> float:
    """Area under the ROC curve by the rank-sum (Mann–Whitney U) formula, average ranks for ties.

    AUC = (sum of positives' ranks - n_pos (n_pos + 1) / 2) / (n_pos · n_neg): the probability that a
    random positive scores above a random negative, a tie counting 1/2. NaN when y has one class only.
    """
    y, p = _binary_inputs(y, p)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = _average_ranks(p)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of values in ascending order; tied values share the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # rank of each distinct value's last member
    return (ends - (counts - 1) / 2.0)[inverse]


def pr_auc(y: ArrayLike, p: ArrayLike) -> float:
    """Average precision: sum over distinct thresholds of (recall gain) × precision, step-wise.

    Equals scikit-learn's average_precision_score (no interpolation; tied probabilities form one
    threshold). NaN when there is no positive label.
    """
    y, p = _binary_inputs(y, p)
    n_pos = int(y.sum())
    if n_pos == 0:
        return math.nan
    order = np.argsort(-p, kind="stable")
    p_sorted, y_sorted = p[order], y[order]
    last_of_threshold = np.flatnonzero(np.diff(p_sorted) != 0)
    last_of_threshold = np.append(last_of_threshold, p.size - 1)  # one index per distinct threshold
    true_positives = np.cumsum(y_sorted)[last_of_threshold]
    precision = true_positives / (last_of_threshold + 1)
    recall = true_positives / n_pos
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def log_loss(y: ArrayLike, p: ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy, with p clipped to [eps, 1 - eps] so a confident miss costs -log(eps)."""
    y, p = _binary_inputs(y, p)
    p = np.clip(p, eps, 1.0 - eps)
    return mean_or_nan(-(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def accuracy(y: ArrayLike, p: ArrayLike, threshold: float = 0.5) -> float:
    """Share of rows where (p ≥ threshold) equals the label."""
    y, p = _binary_inputs(y, p)
    return mean_or_nan((p >= threshold) == (y == 1))


def binary_metrics(y: ArrayLike, p: ArrayLike, threshold: float = 0.5) -> dict[str, float]:
    """auc_roc, pr_auc, log_loss, accuracy, and rows."""
    y, p = _binary_inputs(y, p)
    return {
        "auc_roc": auc_roc(y, p),
        "pr_auc": pr_auc(y, p),
        "log_loss": log_loss(y, p),
        "accuracy": accuracy(y, p, threshold),
        "rows": y.size,
    }


def prior_rate_probabilities(train_positive_rate: float, n: int) -> np.ndarray:
    """(n,) baseline probabilities: the training positive rate for everyone (AUC 0.5 by the tie rule)."""
    if not 0.0 <= train_positive_rate <= 1.0:
        raise ValueError(f"train_positive_rate must be in [0, 1], got {train_positive_rate}")
    return np.full(n, float(train_positive_rate))


def _binary_inputs(y: ArrayLike, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    y, p = _paired(y, p)
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("binary labels must be 0 or 1")
    if np.isnan(p).any():
        raise ValueError("predicted probabilities contain NaN (check the model's outputs)")
    return y, p


# -- classes: one label among K (multiclass) or a set of labels (multilabel) -----------------------


def macro_f1(y: ArrayLike, predicted: ArrayLike, classes: int) -> float:
    """Mean over the classes 0..classes-1 of F1 = 2 TP / (2 TP + FP + FN), a class with no true and no
    predicted row counting 0 (scikit-learn's f1_score(average="macro", labels=range(classes),
    zero_division=0)). y and predicted are (N,) class ids."""
    y, predicted = _class_ids(y, classes), _class_ids(predicted, classes)
    if y.size != predicted.size:
        raise ValueError(f"labels and predictions differ in length: {y.size} vs {predicted.size}")
    if y.size == 0:
        return math.nan
    true_positive = np.bincount(y[y == predicted], minlength=classes)
    wrong = 2 * true_positive + (np.bincount(predicted, minlength=classes) - true_positive) \
        + (np.bincount(y, minlength=classes) - true_positive)
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(wrong > 0, 2 * true_positive / np.maximum(wrong, 1), 0.0)
    return float(f1.mean())


def class_metrics(y: ArrayLike, probabilities: np.ndarray, eps: float = 1e-7) -> dict[str, float]:
    """accuracy, macro_f1, log_loss (the true class's probability clipped at eps), and for two
    classes auc_roc (class 1 positive); y (N,) class ids, probabilities (N, K) rows summing to 1."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    classes = probabilities.shape[1]
    y = _class_ids(y, classes)
    predicted = probabilities.argmax(axis=1)
    metrics = {
        "accuracy": mean_or_nan(predicted == y),
        "macro_f1": macro_f1(y, predicted, classes),
        "log_loss": mean_or_nan(-np.log(np.clip(probabilities[np.arange(y.size), y], eps, 1.0))),
        "rows": y.size,
    }
    if classes == 2:
        metrics["auc_roc"] = auc_roc((y == 1).astype(np.float64), probabilities[:, 1])
    return metrics


def label_set_metrics(y: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """macro_auc_roc: the mean over labels of each label's AUC-ROC, over the labels that have both a
    positive and a negative row (others have no AUC); y (N, L) in {0, 1}, probabilities (N, L)."""
    y, probabilities = np.asarray(y, dtype=np.float64), np.asarray(probabilities, dtype=np.float64)
    per_label = np.array([auc_roc(y[:, label], probabilities[:, label]) for label in range(y.shape[1])])
    return {"macro_auc_roc": mean_or_nan(per_label[~np.isnan(per_label)]), "rows": y.shape[0]}


def _class_ids(values: ArrayLike, classes: int) -> np.ndarray:
    ids = np.asarray(values)
    if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= classes):
        raise ValueError(f"class ids must be integers in [0, {classes})")
    return ids.astype(np.int64)


# -- regression -----------------------------------------------------------------------------------


def rmse(y: ArrayLike, yhat: ArrayLike) -> float:
    """Root mean squared error."""
    y, yhat = _paired(y, yhat)
    return math.sqrt(mean_or_nan((y - yhat) ** 2))


def mae(y: ArrayLike, yhat: ArrayLike) -> float:
    """Mean absolute error."""
    y, yhat = _paired(y, yhat)
    return mean_or_nan(np.abs(y - yhat))


def mape(y: ArrayLike, yhat: ArrayLike, eps: float = 1e-8) -> float:
    """Mean absolute percentage error as a fraction (0.1 = 10 %), over rows with |y| ≥ eps only.

    Rows with a (near-)zero target have no defined percentage error and are skipped; NaN if none is
    left. Many zero targets (users who spend nothing) make MAPE describe the spenders only: read it
    beside mape_rows in regression_metrics.
    """
    y, yhat = _paired(y, yhat)
    keep = np.abs(y) >= eps
    return mean_or_nan(np.abs(y[keep] - yhat[keep]) / np.abs(y[keep]))


def regression_metrics(y: ArrayLike, yhat: ArrayLike, eps: float = 1e-8) -> dict[str, float]:
    """rmse, mae, mape, rows, and mape_rows (rows with |y| ≥ eps, the ones MAPE averages over)."""
    y, yhat = _paired(y, yhat)
    return {
        "rmse": rmse(y, yhat),
        "mae": mae(y, yhat),
        "mape": mape(y, yhat, eps),
        "rows": y.size,
        "mape_rows": int(np.count_nonzero(np.abs(y) >= eps)),
    }


# -- next items (a set of targets per user) -------------------------------------------------------


def next_items_metrics(top_items: Sequence[np.ndarray], targets: Sequence[np.ndarray], ks: Sequence[int]) -> dict[str, float]:
    """recall@k and ndcg@k of ranked lists against target sets, the mean over users, and `rows`.

    top_items[u]: user u's item ids, best first (at least max(ks) of them when the corpus allows).
    targets[u]: user u's distinct target ids (at least one); an id no list can hold (a negative
    one: an item the vocabulary lacks) still counts in the denominators.
    recall@k = |top k ∩ targets| / |targets|. NDCG@k = DCG@k / ideal DCG@k with binary gains:
    DCG@k = sum of 1 / log2(position + 1) over the hits among positions 1..k, and the ideal puts
    min(|targets|, k) hits first, so a perfect list scores 1 whatever the number of targets.
    """
    if len(top_items) != len(targets):
        raise ValueError(f"top_items has {len(top_items)} users but targets has {len(targets)}")
    discounts = 1.0 / np.log2(np.arange(2, max(ks, default=1) + 2))  # position 1 .. max(ks)
    values: dict[str, list[float]] = {name: [] for k in ks for name in (f"recall@{k}", f"ndcg@{k}")}
    for items, wanted in zip(top_items, targets, strict=True):
        wanted = np.unique(np.asarray(wanted, dtype=np.int64))
        if wanted.size == 0:
            raise ValueError("every user needs at least one target (score only the users who have one)")
        hits = np.isin(np.asarray(items, dtype=np.int64), wanted)
        for k in ks:
            values[f"recall@{k}"].append(hits[:k].sum() / wanted.size)
            values[f"ndcg@{k}"].append(float(discounts[:k][hits[:k]].sum() / discounts[:min(wanted.size, k)].sum()))
    return {name: mean_or_nan(np.array(scores)) for name, scores in values.items()} | {"rows": len(targets)}


# -- shared helpers -------------------------------------------------------------------------------


def _paired(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a, b = as_float_array(a), as_float_array(b)
    if a.shape != b.shape:
        raise ValueError(f"targets and predictions differ in length: {a.size} vs {b.size}")
    return a, b


# -- directions -----------------------------------------------------------------------------------

METRIC_DIRECTIONS: dict[str, Literal["max", "min"]] = {
    "mrr": "max",
    "auc_roc": "max",
    "pr_auc": "max",
    "accuracy": "max",
    "macro_f1": "max",
    "macro_auc_roc": "max",
    "log_loss": "min",
    "rmse": "min",
    "mae": "min",
    "mape": "min",
    "r2": "max",
}
"""Whether larger ("max") or smaller ("min") is better, for each fixed metric name; hr@k, ndcg@k and
recall@k (any k) are "max" via direction()."""

COUNT_KEYS = frozenset({"rows", "scored_rows", "mape_rows"})
"""Row counts in the *_metrics dicts: bookkeeping, not quality, so they have no direction."""

_AT_K = re.compile(r"(hr|ndcg|recall)@\d+")


def direction(metric_name: str) -> Literal["max", "min"]:
    """Whether larger ("max") or smaller ("min") is better for metric_name.

    A prefix before the last "/" is ignored, so "test/hr@10" and "act_7d/auc_roc" work.
    """
    name = metric_name.rsplit("/", 1)[-1]
    if _AT_K.fullmatch(name):
        return "max"
    if name in METRIC_DIRECTIONS:
        return METRIC_DIRECTIONS[name]
    if name in COUNT_KEYS:
        raise ValueError(f"{metric_name!r} is a row count, not a quality metric; skip names in COUNT_KEYS")
    raise ValueError(f"unknown metric {metric_name!r}; known: hr@<k>, ndcg@<k>, recall@<k>, {', '.join(METRIC_DIRECTIONS)}")
