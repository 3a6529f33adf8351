"""Linear probes on frozen embeddings: the user split, determinism, signal vs noise, and input errors.

The signal/noise pairs fail in both directions: a probe that learns nothing misses the signal bar,
and one that leaks test labels (or scores the train users) beats chance on pure noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lumos.eval.probe import ProbeResult, fit_linear_probe, fit_logistic_probe, run_probe, split_users


def user_ids(n: int) -> list[str]:
    return [f"user-{i:05d}" for i in range(n)]


def class_data(n: int, classes: int, dim: int = 8, shift: float = 1.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings whose mean depends on the class (plus unit noise), and the class ids."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    means = rng.normal(0.0, shift, (classes, dim))
    return means[labels] + rng.normal(size=(n, dim)), labels


# -- split ----------------------------------------------------------------------------------------


def test_split_depends_on_user_and_seed_only():
    ids = user_ids(1000)
    mask = split_users(ids, 0.3, seed=0)
    assert mask.dtype == bool and 0.25 < mask.mean() < 0.35
    np.testing.assert_array_equal(split_users(ids, 0.3, seed=0), mask)
    assert (split_users(ids, 0.3, seed=1) != mask).sum() > 100

    order = np.random.default_rng(0).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    np.testing.assert_array_equal(split_users(shuffled, 0.3, seed=0), mask[order])
    # A user's side does not depend on who else is in the table.
    np.testing.assert_array_equal(split_users(ids[:17], 0.3, seed=0), mask[:17])
    # Raising the fraction only moves users from train to test.
    assert (split_users(ids, 0.5, seed=0) >= mask).all()


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_a_fraction_outside_zero_one(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        split_users(user_ids(20), fraction, seed=0)


# -- determinism ----------------------------------------------------------------------------------


def test_probe_repeats_with_a_seed_and_another_seed_changes_the_split():
    x, y = class_data(300, 3)
    first = run_probe(x, y, user_ids(300), "logistic", seed=4)
    assert isinstance(first, ProbeResult)
    assert first == run_probe(x, y, user_ids(300), "logistic", seed=4)
    other = run_probe(x, y, user_ids(300), "logistic", seed=5)
    assert other.metrics != first.metrics
    assert first.train_users + first.test_users == other.train_users + other.test_users == 300


@pytest.mark.parametrize("kind", ["logistic", "linear"])
def test_probe_does_not_depend_on_row_order(kind):
    x, y = class_data(400, 2)
    target = y if kind == "logistic" else x @ np.arange(8.0) + y
    ids = user_ids(400)
    order = np.random.default_rng(1).permutation(400)
    result = run_probe(x, target, ids, kind)
    shuffled = run_probe(x[order], target[order], [ids[i] for i in order], kind)
    assert (shuffled.train_users, shuffled.test_users) == (result.train_users, result.test_users)
    assert shuffled.metrics == pytest.approx(result.metrics, rel=1e-6)


# -- logistic: signal vs noise --------------------------------------------------------------------


def test_logistic_probe_finds_a_label_the_embeddings_carry():
    x, y = class_data(600, 3, shift=0.5)
    result = run_probe(x, np.array(["churn", "loyal", "new"])[y], user_ids(600), "logistic")
    assert result.kind == "logistic" and result.classes == ["churn", "loyal", "new"]
    assert set(result.metrics) == {"accuracy", "log_loss"}
    assert result.metrics["accuracy"] > 0.7  # chance is 1/3
    assert result.metrics["log_loss"] < 0.7  # the class prior gives log(3) = 1.10

    x, y = class_data(600, 2, shift=0.5)
    binary = run_probe(x, y.astype(bool), user_ids(600), "logistic")
    assert binary.classes == ["False", "True"]
    assert binary.metrics["auc_roc"] > 0.95 and binary.metrics["accuracy"] > 0.85


def test_logistic_probe_on_noise_is_at_chance():
    # 64 dimensions let the probe overfit its train users (train AUC ≈ 0.63 here): only held-out
    # scoring stays at chance, and its log_loss is worse than the prior's log(K).
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2000, 64)), rng.integers(0, 2, 2000)
    result = run_probe(x, y, user_ids(2000), "logistic")
    assert result.classes == ["0", "1"]
    assert abs(result.metrics["auc_roc"] - 0.5) < 0.06
    assert abs(result.metrics["accuracy"] - 0.5) < 0.06
    assert math.log(2) < result.metrics["log_loss"] < 0.8

    three = run_probe(x, rng.integers(0, 3, 2000), user_ids(2000), "logistic")
    assert abs(three.metrics["accuracy"] - 1 / 3) < 0.06
    assert math.log(3) < three.metrics["log_loss"] < 1.25


def test_auc_is_nan_when_the_test_side_has_one_class():
    x, y = class_data(200, 2)
    ids = user_ids(200)
    is_test = split_users(ids, 0.3, seed=0)
    y[is_test] = 1
    result = run_probe(x, y, ids, "logistic")
    assert math.isnan(result.metrics["auc_roc"])


def test_a_class_missing_from_train_gets_probability_zero():
    x, y = class_data(90, 3, dim=3)
    train_y = np.where(y == 1, 0, y)  # class 1 never seen
    weights = fit_logistic_probe(x, train_y, classes=3)
    assert weights.shape == (4, 3)
    assert np.isneginf(weights[-1, 1]) and (weights[:-1, 1] == 0).all()

    ids = user_ids(90)
    labels = np.where(split_users(ids, 0.3, seed=0) & (y == 1), "rare", np.where(y == 1, "a", "b"))
    result = run_probe(x, labels, ids, "logistic")  # "rare" only on the test side: scored, never predicted
    assert result.classes == ["a", "b", "rare"]
    assert math.isfinite(result.metrics["log_loss"]) and result.metrics["accuracy"] < 1


def test_logistic_probe_matches_sklearn():
    linear_model = pytest.importorskip("sklearn.linear_model")
    x, y = class_data(783, 3, dim=17, shift=0.4, seed=3)
    x = (x - x.mean(0)) / x.std(0)
    l2 = 1e-2
    weights = fit_logistic_probe(x, y, classes=3, l2=l2)
    reference = linear_model.LogisticRegression(C=1 / (len(y) * l2), tol=1e-12, max_iter=10_000).fit(x, y)
    logits = np.c_[x, np.ones(len(x))] @ weights
    probabilities = np.exp(logits - logits.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    np.testing.assert_allclose(probabilities, reference.predict_proba(x), atol=1e-4)

    ids = user_ids(783)
    is_test = split_users(ids, 0.3, seed=0)
    result = run_probe(x, y, ids, "logistic", l2=l2)
    fitted = linear_model.LogisticRegression(C=1 / ((~is_test).sum() * l2), max_iter=10_000).fit(
        x[~is_test], y[~is_test]
    )
    assert result.metrics["accuracy"] == pytest.approx(fitted.score(x[is_test], y[is_test]), abs=0.02)


# -- linear ---------------------------------------------------------------------------------------


def test_linear_probe_recovers_a_linear_signal_and_not_noise():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 8))
    signal = run_probe(x, x @ rng.normal(size=8) + 3.0 + 0.1 * rng.normal(size=500), user_ids(500), "linear")
    assert signal.kind == "linear" and signal.classes is None
    assert set(signal.metrics) == {"rmse", "mae", "r2"}
    assert signal.metrics["r2"] > 0.98 and signal.metrics["rmse"] < 0.2

    constant_column = np.c_[x, np.full(500, 7.0)]  # std 0: the 1e-6 floor keeps it finite
    assert run_probe(constant_column, x[:, 0], user_ids(500), "linear").metrics["r2"] > 0.99

    noise = run_probe(x, rng.normal(size=500), user_ids(500), "linear")
    assert noise.metrics["r2"] < 0.05
    assert noise.metrics["rmse"] == pytest.approx(1.0, abs=0.15)


def test_linear_probe_is_ridge():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(783, 17)), rng.normal(size=783)
    exact = np.linalg.lstsq(np.c_[x, np.ones(783)], y, rcond=None)[0]
    np.testing.assert_allclose(fit_linear_probe(x, y, l2=0.0), exact, atol=1e-10)
    linear_model = pytest.importorskip("sklearn.linear_model")
    reference = linear_model.Ridge(alpha=783 * 0.1).fit(x, y)
    weights = fit_linear_probe(x, y, l2=0.1)
    np.testing.assert_allclose(weights[:-1], reference.coef_, atol=1e-10)
    assert weights[-1] == pytest.approx(reference.intercept_, abs=1e-10)


# -- errors ---------------------------------------------------------------------------------------


def test_one_class_among_train_users_is_an_error():
    x, _ = class_data(100, 2)
    ids = user_ids(100)
    labels = np.where(split_users(ids, 0.3, seed=0), "b", "a")  # "b" only on the test side
    with pytest.raises(ValueError, match="at least 2 classes"):
        run_probe(x, labels, ids, "logistic")
    with pytest.raises(ValueError, match="at least 2 classes"):
        run_probe(x, ["a"] * 100, ids, "logistic")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x, y, ids: (x[:9], y[:9], ids[:9]), "at least 10 users"),
        (lambda x, y, ids: (x, y[:-1], ids), "differ in length"),
        (lambda x, y, ids: (x[:-1], y, ids), "differ in length"),
        (lambda x, y, ids: (np.where(np.arange(40)[:, None] == 7, np.nan, x), y, ids), "NaN.*user-00007"),
        (lambda x, y, ids: (x, y, ids[:-1] + ids[:1]), "unique.*user-00000"),
        (lambda x, y, ids: (x[:, 0], y, ids), r"\(N, C\)"),
        (lambda x, y, ids: (x, [None] + list(y[1:]), ids), "None or NaN"),
        (lambda x, y, ids: (x, ["a"] + list(y[1:]), ids), "cannot be sorted"),
    ],
)
def test_bad_inputs_raise(change, message):
    x, y = class_data(40, 2)
    with pytest.raises(ValueError, match=message):
        run_probe(*change(x, y, user_ids(40)), "logistic")


def test_bad_linear_labels_and_kind_raise():
    x, y = class_data(40, 2)
    with pytest.raises(ValueError, match="numeric labels"):
        run_probe(x, ["a"] * 40, user_ids(40), "linear")
    with pytest.raises(ValueError, match="NaN or inf"):
        run_probe(x, np.r_[np.nan, y[1:]], user_ids(40), "linear")
    with pytest.raises(ValueError, match="kind"):
        run_probe(x, y, user_ids(40), "tree")
    with pytest.raises(ValueError, match="test_fraction"):
        run_probe(x, y, user_ids(40), "logistic", test_fraction=1.0)
