"""Linear probes on frozen user embeddings: how much of a downstream label the embeddings already carry.

An embedding_probe task scores a model without retraining it: split the users into train and test,
fit a simple probe on the train users' embeddings, and report its metrics on the test users.

- **Split** (`split_users`): each user id is hashed with the seed (blake2b), so a user's side
  depends only on (user id, seed), never on row order or on the other users. The test share is
  therefore approximately, not exactly, `test_fraction`. For a fixed seed, raising test_fraction
  only moves users from train to test.
- **Features**: standardized with the train split's mean and std (std floored at 1e-6, so a
  constant dimension does not divide by zero), then a bias column of ones is appended. Weights are
  (C + 1, ...) arrays whose last row is the bias; the bias is never penalized.
- **logistic** (`fit_logistic_probe`): multinomial softmax regression, objective
  mean cross-entropy + l2/2 · ||W||² — scikit-learn's LogisticRegression(C=1 / (n · l2)) — fitted by
  full-batch L-BFGS in float64 torch on one CPU thread. With l2 > 0 the problem is strictly convex, so the optimum
  does not depend on the seed; the seed only sets a tiny starting point, and a run is bit-for-bit
  repeatable. Metrics: accuracy, log_loss (probabilities clipped at 1e-7, as in
  lumos.eval.metrics), and for two classes auc_roc, with classes[1] as the positive class. Names match
  lumos.eval.metrics.METRIC_DIRECTIONS.
- **linear** (`fit_linear_probe`): ridge regression in closed form, objective
  mean squared error / 2 + l2/2 · ||w||² — scikit-learn's Ridge(alpha=n · l2). Metrics: rmse, mae,
  r2 (1 - SSE / SST around the test mean; NaN for a constant test target).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from lumos.eval.metrics import auc_roc

MIN_USERS = 10
STD_FLOOR = 1e-6
PROBABILITY_EPS = 1e-7  # log_loss clip, the same as lumos.eval.metrics.log_loss


@dataclass(frozen=True)
class ProbeResult:
    kind: str
    """logistic or linear."""
    train_users: int
    """Users the probe was fitted on."""
    test_users: int
    """Held-out users the metrics are computed on."""
    metrics: dict[str, float]
    """logistic: accuracy, log_loss (and auc_roc for two classes); linear: rmse, mae, r2. On test users."""
    classes: list[str] | None
    """logistic: the label classes in id order (sorted labels, as strings); linear: None."""


# -- split ----------------------------------------------------------------------------------------


def split_users(user_ids: Sequence[str], test_fraction: float, seed: int) -> np.ndarray:
    """(N,) bool mask, True where the user is on the test side.

    A user is on the test side when blake2b("<seed>:<user id>"), read as a number in [0, 1), is below
    test_fraction: deterministic per (user id, seed), whatever the row order.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    unit = np.array([_unit_hash(f"{seed}:{user_id}") for user_id in user_ids], dtype=np.float64)
    return unit < test_fraction


def _unit_hash(text: str) -> float:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


# -- fitting --------------------------------------------------------------------------------------


def fit_logistic_probe(
    train_x: np.ndarray, train_y: np.ndarray, classes: int, l2: float = 1e-3, seed: int = 0, max_iter: int = 500
) -> np.ndarray:
    """(C + 1, classes) softmax weights, bias last; train_x (N, C) features, train_y (N,) ids in [0, classes).

    A class id absent from train_y gets zero weights and bias -inf (probability 0), since the data
    says nothing about it. At least two classes must be present.
    """
    train_y = np.asarray(train_y, dtype=np.int64)
    _check_fit_inputs(train_x, train_y, l2)
    if train_y.size and (train_y.min() < 0 or train_y.max() >= classes):
        raise ValueError(f"train_y holds class ids outside [0, {classes})")
    present = np.unique(train_y)  # sorted ids seen in train
    if present.size < 2:
        raise ValueError(
            f"the logistic probe needs at least 2 classes among the train users, got {present.size}; "
            "check the labels, or use more users or another seed"
        )
    features = torch.from_numpy(_with_bias(train_x))  # (N, C + 1) float64
    targets = torch.from_numpy(np.searchsorted(present, train_y))  # (N,) ids among present classes
    generator = torch.Generator().manual_seed(seed)
    weights = (
        1e-3 * torch.randn(features.shape[1], present.size, generator=generator, dtype=torch.float64)
    ).requires_grad_()
    optimizer = torch.optim.LBFGS(
        [weights],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-10,
        tolerance_change=1e-14,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(features @ weights, targets) + 0.5 * l2 * weights[:-1].pow(2).sum()
        loss.backward()
        return loss

    # One thread: the result no longer depends on the machine's thread count, and at probe sizes
    # threads only add synchronization (10-40x slower on a busy 2-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        optimizer.step(closure)
    finally:
        torch.set_num_threads(threads)
    full = np.zeros((features.shape[1], classes))
    full[-1, :] = -np.inf
    full[:, present] = weights.detach().numpy()
    return full


def fit_linear_probe(train_x: np.ndarray, train_y: np.ndarray, l2: float = 1e-3) -> np.ndarray:
    """(C + 1,) ridge weights, bias last: solves (XᵀX / n + l2 · I′) w = Xᵀy / n, I′ sparing the bias."""
    train_y = np.asarray(train_y, dtype=np.float64)
    _check_fit_inputs(train_x, train_y, l2)
    features = _with_bias(train_x)  # (N, C + 1)
    n = features.shape[0]
    penalty = np.full(features.shape[1], l2)
    penalty[-1] = 0.0
    gram = features.T @ features / n + np.diag(penalty)  # (C + 1, C + 1)
    if l2 > 0:  # positive definite: the bias column is all ones and every other direction is penalized
        return np.linalg.solve(gram, features.T @ train_y / n)
    return np.linalg.lstsq(features, train_y, rcond=None)[0]


def _check_fit_inputs(train_x: np.ndarray, train_y: np.ndarray, l2: float) -> None:
    if np.ndim(train_x) != 2:
        raise ValueError(f"train_x must be (N, C), got shape {np.shape(train_x)}")
    if len(train_x) != len(train_y) or len(train_y) == 0:
        raise ValueError(
            f"train_x and train_y need the same, non-zero number of rows: {len(train_x)} vs {len(train_y)}"
        )
    if not np.isfinite(train_x).all() or not np.isfinite(train_y).all():
        raise ValueError("train_x and train_y must be finite (no NaN or inf)")
    if l2 < 0:
        raise ValueError(f"l2 must be ≥ 0, got {l2}")


def _with_bias(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


def _softmax_probabilities(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    logits = _with_bias(x) @ weights  # (N, K); absent classes are -inf
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


# -- the probe ------------------------------------------------------------------------------------


def run_probe(
    embeddings: np.ndarray,
    labels: Sequence,
    user_ids: Sequence[str],
    kind: Literal["logistic", "linear"],
    test_fraction: float = 0.3,
    seed: int = 0,
    l2: float = 1e-3,
) -> ProbeResult:
    """Fit a probe on the train users' embeddings (N, C) and score it on the test users.

    One row per user: labels and user_ids are (N,) and aligned with the embedding rows; user ids
    must be unique. logistic labels may be strings, bools or ints (classes sorted); linear labels
    are numbers. A class that only test users have gets probability 0, so those users count as
    misses and add -log(1e-7) each to log_loss.
    """
    embeddings = np.asarray(embeddings, dtype=np.float64)
    labels = list(labels)
    user_ids = [str(user_id) for user_id in user_ids]
    _check_probe_inputs(embeddings, labels, user_ids, kind)

    is_test = split_users(user_ids, test_fraction, seed)
    train_count, test_count = int((~is_test).sum()), int(is_test.sum())
    if train_count == 0 or test_count == 0:
        raise ValueError(
            f"the split of {len(user_ids)} users with test_fraction={test_fraction}, seed={seed} left "
            f"{train_count} train and {test_count} test users; use more users or another test_fraction or seed"
        )
    train_x, test_x = _standardize(embeddings[~is_test], embeddings[is_test])

    if kind == "logistic":
        ids, classes = _class_ids(labels)
        weights = fit_logistic_probe(train_x, ids[~is_test], len(classes), l2=l2, seed=seed)
        metrics = _classification_metrics(ids[is_test], _softmax_probabilities(weights, test_x))
    else:
        try:
            target = np.asarray(labels, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"the linear probe needs numeric labels ({error}); use kind='logistic' for classes"
            ) from error
        if not np.isfinite(target).all():
            raise ValueError("labels contain NaN or inf; drop those users or fill their labels")
        weights = fit_linear_probe(train_x, target[~is_test], l2=l2)
        metrics = _regression_metrics(target[is_test], _with_bias(test_x) @ weights)
        classes = None
    return ProbeResult(kind=kind, train_users=train_count, test_users=test_count, metrics=metrics, classes=classes)


def _check_probe_inputs(embeddings: np.ndarray, labels: list, user_ids: list[str], kind: str) -> None:
    if kind not in ("logistic", "linear"):
        raise ValueError(f"kind must be 'logistic' or 'linear', got {kind!r}")
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be (N, C), got shape {embeddings.shape}")
    if not len(embeddings) == len(labels) == len(user_ids):
        raise ValueError(
            f"embeddings, labels and user_ids differ in length: {len(embeddings)}, {len(labels)}, {len(user_ids)}"
        )
    if len(user_ids) < MIN_USERS:
        raise ValueError(f"a probe needs at least {MIN_USERS} users, got {len(user_ids)}")
    if not np.isfinite(embeddings).all():
        bad_rows = np.flatnonzero(~np.isfinite(embeddings).all(axis=1))
        examples = ", ".join(user_ids[i] for i in bad_rows[:3])
        raise ValueError(
            f"embeddings contain NaN or inf for {bad_rows.size} users (e.g. {examples}); check the model's outputs"
        )
    if len(set(user_ids)) != len(user_ids):
        duplicates = sorted(user_id for user_id, count in Counter(user_ids).items() if count > 1)
        raise ValueError(f"user_ids must be unique (one embedding per user); repeated: {', '.join(duplicates[:3])}")


def _standardize(train_x: np.ndarray, test_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = train_x.mean(axis=0)
    std = np.maximum(train_x.std(axis=0), STD_FLOOR)
    return (train_x - mean) / std, (test_x - mean) / std


def _class_ids(labels: list) -> tuple[np.ndarray, list[str]]:
    """(N,) int ids into the sorted distinct labels, and those labels as strings."""
    if any(label is None or label != label for label in labels):  # label != label only for NaN
        raise ValueError("labels contain None or NaN; drop those users or fill their labels")
    try:
        distinct = sorted(set(labels))
    except TypeError as error:
        raise ValueError(f"labels mix types that cannot be sorted into classes ({error}); use one type") from error
    id_of = {label: i for i, label in enumerate(distinct)}
    return np.array([id_of[label] for label in labels], dtype=np.int64), [str(label) for label in distinct]


# -- metrics: multiclass log loss and r2 are probe-specific; the rest comes from lumos.eval.metrics


def _classification_metrics(y: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    """accuracy, log_loss, and for two classes auc_roc (positive class id 1); y (N,) ids, probabilities (N, K)."""
    metrics = {
        "accuracy": float(np.mean(probabilities.argmax(axis=1) == y)),
        "log_loss": float(-np.mean(np.log(np.clip(probabilities[np.arange(y.size), y], PROBABILITY_EPS, 1.0)))),
    }
    if probabilities.shape[1] == 2:
        metrics["auc_roc"] = auc_roc((y == 1).astype(np.float64), probabilities[:, 1])
    return metrics


def _regression_metrics(y: np.ndarray, prediction: np.ndarray) -> dict[str, float]:
    errors = y - prediction
    total = float(np.sum((y - y.mean()) ** 2))
    return {
        "rmse": math.sqrt(float(np.mean(errors**2))),
        "mae": float(np.mean(np.abs(errors))),
        "r2": 1.0 - float(np.sum(errors**2)) / total if total > 0 else math.nan,
    }
