"""Per-user labels predicted from per-user features, over k seeded folds of users: mean ± std.

The protocol a `user_label` task scores every entry with, a model's frozen user embeddings and the
bag-of-items baseline alike, so the two differ only in their features:

- **Folds** (`user_folds`): users are ordered by blake2b("<seed>:<user id>") and dealt round-robin
  into k folds, so the folds differ in size by at most one and a user's fold depends only on the
  seed and the set of users, never on row order. Each fold is the test side once.
- **Fit** (`fit_and_predict`): an estimator built fresh for each fold (scikit-learn: features,
  then a logistic regression) is fitted on the other folds' users only. Its regularization C is
  chosen by an inner, stratified 3-fold cross-validation on those training users (log loss, a
  proper score defined for every target), then refitted on all of them: the test fold is never
  seen by any choice. A label set is one such regression per label.
- **Score**: each fold's test predictions go through lumos.eval.metrics (`class_metrics`,
  `label_set_metrics`), the code that scores every other entry; the task reports the mean over
  folds and, as `<metric>_std`, the sample standard deviation (ddof = 1).

Targets: `classes` (one label per user, two or more classes; two add auc_roc) or `label_sets`
(a set of labels per user; labels with fewer than MIN_POSITIVES users are left out, since their
inner folds would hold no positive).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lumos.eval.metrics import class_metrics, label_set_metrics

Target = Literal["classes", "label_sets"]
C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
"""Inverse regularization strengths the inner cross-validation chooses among."""
INNER_FOLDS = 3
MIN_POSITIVES = 20
MIN_USERS = 10


@dataclass(frozen=True)
class CrossValidated:
    metrics: dict[str, float]
    """Mean over folds of each metric, and <metric>_std, the sample std over folds."""
    per_fold: list[dict[str, float]]
    users: int
    labels: list[str]
    """The classes (classes) or the labels scored (label_sets), in column order."""


def user_folds(user_ids: Sequence[str], folds: int, seed: int) -> np.ndarray:
    """(N,) fold of each user in [0, folds): users sorted by a seeded hash of their id, dealt round-robin."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2, got {folds}")
    keys = [hashlib.blake2b(f"{seed}:{user}".encode(), digest_size=8).digest() for user in user_ids]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    fold = np.empty(len(keys), dtype=np.int64)
    fold[order] = np.arange(len(keys)) % folds
    return fold


def encode_targets(labels: Sequence, target: Target) -> tuple[np.ndarray, list[str]]:
    """classes: (N,) ids into the sorted distinct labels; label_sets: (N, L) indicators of the labels
    with at least MIN_POSITIVES users. A label set is a list of strings or one "|"-separated string."""
    if target == "classes":
        names = sorted({str(label) for label in labels})
        if len(names) < 2:
            raise ValueError(f"a class target needs at least 2 classes, got {names}")
        index = {name: i for i, name in enumerate(names)}
        return np.array([index[str(label)] for label in labels], dtype=np.int64), names
    sets = [set(label.split("|")) if isinstance(label, str) else set(map(str, label)) for label in labels]
    counts: dict[str, int] = {}
    for labels_of_user in sets:
        for name in labels_of_user:
            counts[name] = counts.get(name, 0) + 1
    names = sorted(name for name, count in counts.items() if count >= MIN_POSITIVES and name)
    if not names:
        raise ValueError(f"no label is held by {MIN_POSITIVES} users or more")
    return np.array([[name in labels_of_user for name in names] for labels_of_user in sets], dtype=np.int64), names


def logistic_estimator(features: Literal["dense", "bag"], target: Target, seed: int) -> Any:
    """A fresh scikit-learn pipeline: dense features standardized, or a bag of tokens as TF-IDF (the
    inverse document frequencies learnt from the training users only), then a logistic regression
    whose C an inner stratified cross-validation on the training users chooses."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    inner = StratifiedKFold(INNER_FOLDS, shuffle=True, random_state=seed)
    classifier = LogisticRegressionCV(Cs=list(C_GRID), cv=inner, scoring="neg_log_loss", max_iter=2000)
    if target == "label_sets":
        classifier = OneVsRestClassifier(classifier)
    first = StandardScaler() if features == "dense" else TfidfVectorizer(analyzer=_tokens, sublinear_tf=True)
    return make_pipeline(first, classifier)


def _tokens(document: Sequence[str]) -> Sequence[str]:
    """A user's bag is already a list of tokens (item ids): TF-IDF reads it as is."""
    return document


def cross_validate(features: Any, labels: Sequence, user_ids: Sequence[str], target: Target, folds: int, seed: int,
                   make_estimator: Callable[[], Any]) -> CrossValidated:
    """Fit `make_estimator()` on k - 1 folds, score it on the k-th, for each fold; `features` holds
    one row per user (an (N, C) array or a list of N token lists), aligned with labels and user_ids."""
    user_ids = [str(user) for user in user_ids]
    if not len(features) == len(labels) == len(user_ids):
        raise ValueError(f"features, labels and user_ids differ in length: {len(features)}, {len(labels)}, {len(user_ids)}")
    if len(user_ids) < MIN_USERS or len(set(user_ids)) != len(user_ids):
        raise ValueError(f"need at least {MIN_USERS} distinct users, one row each; got {len(user_ids)} rows "
                         f"of {len(set(user_ids))} users")
    y, names = encode_targets(labels, target)
    fold = user_folds(user_ids, folds, seed)
    per_fold = []
    for k in range(folds):
        train, test = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        probabilities = fit_and_predict(make_estimator(), _rows(features, train), y[train], _rows(features, test),
                                        target, len(names))
        per_fold.append(fold_metrics(y[test], probabilities, target))
    return CrossValidated(mean_and_std(per_fold), per_fold, len(user_ids), names)


def fit_and_predict(estimator: Any, train_x: Any, train_y: np.ndarray, test_x: Any, target: Target,
                    width: int) -> np.ndarray:
    """(N_test, width) probabilities: of each class (a class absent from train gets 0) or of each label."""
    with warnings.catch_warnings():
        # A rare class may hold fewer users than the inner folds: scikit-learn warns and still folds.
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        # 1.9 announces changes of LogisticRegressionCV's defaults and attributes that do not touch an l2 fit.
        warnings.filterwarnings("ignore", category=FutureWarning, module="sklearn")
        estimator.fit(train_x, train_y)
    scores = estimator.predict_proba(test_x)
    if target == "label_sets":
        return scores
    probabilities = np.zeros((scores.shape[0], width))
    probabilities[:, estimator.classes_] = scores
    return probabilities


def fold_metrics(y: np.ndarray, probabilities: np.ndarray, target: Target) -> dict[str, float]:
    metrics = class_metrics(y, probabilities) if target == "classes" else label_set_metrics(y, probabilities)
    return {name: float(value) for name, value in metrics.items() if name != "rows"}


def mean_and_std(per_fold: list[dict[str, float]]) -> dict[str, float]:
    result = {}
    for name in per_fold[0]:
        values = np.array([fold[name] for fold in per_fold])
        result[name] = float(values.mean())
        result[f"{name}_std"] = float(values.std(ddof=1))
    return result


def _rows(features: Any, index: np.ndarray) -> Any:
    if isinstance(features, np.ndarray):
        return features[index]
    return [features[i] for i in index]
