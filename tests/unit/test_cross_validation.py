"""The user_label protocol (lumos.eval.cross_validation): folds of users, a probe that finds a label
the features carry and none in shuffled labels, and metrics equal to scikit-learn's own."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score

from lumos.eval.cross_validation import cross_validate, encode_targets, fit_and_predict, logistic_estimator, user_folds
from lumos.eval.metrics import class_metrics, label_set_metrics, macro_f1

USERS = [f"u{i}" for i in range(203)]  # an awkward count: folds of 41 and 40


def separable(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(N, 6) embeddings whose first dimension carries a binary label, and the label."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, len(USERS))
    x = rng.normal(size=(len(USERS), 6))
    x[:, 0] += 4.0 * (2 * label - 1)
    return x, label


def test_folds_are_balanced_seeded_and_independent_of_row_order():
    folds = user_folds(USERS, 5, seed=0)
    assert sorted(np.bincount(folds)) == [40, 40, 41, 41, 41]
    reversed_folds = user_folds(USERS[::-1], 5, seed=0)[::-1]
    assert np.array_equal(folds, reversed_folds)
    assert not np.array_equal(folds, user_folds(USERS, 5, seed=1))


def test_a_probe_finds_a_label_the_embedding_separates_and_nothing_in_shuffled_labels():
    x, label = separable()
    make = lambda: logistic_estimator("dense", "classes", seed=0)  # noqa: E731
    found = cross_validate(x, label.tolist(), USERS, "classes", folds=5, seed=0, make_estimator=make)
    assert found.metrics["auc_roc"] > 0.99 and found.metrics["accuracy"] > 0.95
    assert len(found.per_fold) == 5 and found.users == len(USERS)
    shuffled = np.random.default_rng(1).permutation(label)
    chance = cross_validate(x, shuffled.tolist(), USERS, "classes", folds=5, seed=0, make_estimator=make)
    assert abs(chance.metrics["auc_roc"] - 0.5) < 0.1
    assert chance.metrics["auc_roc_std"] > 0


def test_bag_of_items_metrics_equal_an_independent_sklearn_computation():
    """A small case, three classes: the bag-of-items pipeline's fold predictions, scored by
    lumos.eval.metrics, equal scikit-learn's metrics of the same predictions."""
    rng = np.random.default_rng(2)
    classes = rng.integers(0, 3, 60)
    bags = [[f"i{c}"] * 2 + [f"i{j}" for j in rng.integers(3, 12, 4)] for c in classes]
    estimator = logistic_estimator("bag", "classes", seed=0)
    probabilities = fit_and_predict(estimator, bags[:40], classes[:40], bags[40:], "classes", 3)
    ours = class_metrics(classes[40:], probabilities)
    predicted = probabilities.argmax(axis=1)
    assert ours["accuracy"] == pytest.approx(accuracy_score(classes[40:], predicted))
    assert ours["macro_f1"] == pytest.approx(f1_score(classes[40:], predicted, average="macro", labels=[0, 1, 2],
                                                      zero_division=0))
    assert ours["log_loss"] == pytest.approx(log_loss(classes[40:], probabilities, labels=[0, 1, 2]), rel=1e-6)


def test_class_and_label_set_metrics_match_sklearn_at_awkward_sizes():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 17)
    y[:4] = [0, 1, 2, 3]
    predicted = rng.integers(0, 4, 17)
    assert macro_f1(y, predicted, 5) == pytest.approx(f1_score(y, predicted, average="macro", labels=range(5),
                                                               zero_division=0))
    binary = (rng.random(17) < 0.4).astype(int)
    binary[:2] = [0, 1]
    p = rng.random(17)
    two = class_metrics(binary, np.stack([1 - p, p], axis=1))
    assert two["auc_roc"] == pytest.approx(roc_auc_score(binary, p))
    sets = (rng.random((17, 3)) < 0.5).astype(int)
    sets[:2] = [[0, 0, 0], [1, 1, 1]]
    scores = rng.random((17, 3))
    assert label_set_metrics(sets, scores)["macro_auc_roc"] == pytest.approx(roc_auc_score(sets, scores, average="macro"))


def test_label_sets_keep_labels_held_by_enough_users():
    labels = ["Drama|Comedy"] * 25 + ["Drama"] * 5 + [["Western"]] * 3
    y, names = encode_targets(labels, "label_sets")
    assert names == ["Comedy", "Drama"]
    assert y.shape == (33, 2) and y[:, 1].sum() == 30 and y[:, 0].sum() == 25
