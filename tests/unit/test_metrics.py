"""Evaluation metrics: hand-computed values, tie rules, undefined cases, and cross-checks against a
naive loop (retrieval) and scikit-learn (binary, when installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lumos.eval.metrics import (
    METRIC_DIRECTIONS,
    accuracy,
    auc_roc,
    binary_metrics,
    direction,
    log_loss,
    mae,
    mape,
    pr_auc,
    prior_rate_probabilities,
    regression_metrics,
    rmse,
)
from lumos.train.retrieval_metrics import (
    hit_rate_at_k,
    mrr,
    ndcg_at_k,
    popularity_scores,
    retrieval_metrics,
    target_ranks,
)

# -- retrieval: target_ranks ----------------------------------------------------------------------

# Ids 0 and 1 score highest on purpose: they must never count.
TIED_SCORES = torch.tensor([[9.0, 9.0, 0.5, 0.9, 0.5, 0.1]] * 3)  # (3, 6)


def test_ranks_ties_take_the_expected_rank():
    ranks = target_ranks(TIED_SCORES, torch.tensor([2, 3, 5]))
    # target 2 (0.5): item 3 higher, item 4 tied → 1 + 1 + 1/2; target 3 is top; target 5 is last of 4.
    assert ranks.tolist() == [2.5, 1.0, 4.0]
    assert ranks.dtype == torch.float64


def test_constant_scores_rank_in_the_middle():
    ranks = target_ranks(torch.zeros(1, 12), torch.tensor([7]))
    assert ranks.item() == 1 + 9 / 2  # 10 recommendable items: 9 others tied


def test_padding_and_oov_targets_get_nan_and_are_skipped():
    ranks = target_ranks(TIED_SCORES, torch.tensor([0, 3, 1]))
    assert math.isnan(ranks[0]) and math.isnan(ranks[2]) and ranks[1] == 1.0
    metrics = retrieval_metrics(ranks, ks=(1,))
    assert metrics == {"hr@1": 1.0, "ndcg@1": 1.0, "mrr": 1.0, "rows": 3, "scored_rows": 1}


def test_no_scored_rows_gives_nan_metrics():
    metrics = retrieval_metrics(target_ranks(TIED_SCORES, torch.tensor([0, 1, 0])), ks=(10,))
    assert metrics["scored_rows"] == 0 and math.isnan(metrics["hr@10"]) and math.isnan(metrics["mrr"])


SCORES = torch.tensor([[0.0, 0.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 4)  # (4, 7): item i scores 7 - i


def test_history_is_excluded_from_the_competition():
    targets = torch.tensor([5, 5])
    history = torch.tensor([[3, 2, 0, 0], [0, 0, 0, 0]])  # row 1: a user with an empty history
    assert target_ranks(SCORES[:2], targets, history).tolist() == [2.0, 4.0]
    assert target_ranks(SCORES[:2], targets, history, exclude_history=False).tolist() == [4.0, 4.0]
    assert target_ranks(SCORES[:2], targets).tolist() == [4.0, 4.0]


def test_target_in_history_stays_rankable():
    history = torch.tensor([[5, 2, 5, 1], [4, 4, 4, 4]])  # repeat purchases; OOV in history is fine
    assert target_ranks(SCORES[:2], torch.tensor([5, 4]), history).tolist() == [3.0, 3.0]


def test_history_with_no_columns():
    ranks = target_ranks(SCORES, torch.tensor([2, 3, 4, 6]), torch.zeros(4, 0, dtype=torch.long))
    assert ranks.tolist() == [1.0, 2.0, 3.0, 5.0]


def test_ids_outside_the_vocabulary_raise():
    with pytest.raises(ValueError, match="same item vocabulary"):
        target_ranks(SCORES[:1], torch.tensor([7]))
    with pytest.raises(ValueError, match="history"):
        target_ranks(SCORES[:1], torch.tensor([2]), torch.tensor([[9]]))
    with pytest.raises(ValueError, match="NaN"):
        target_ranks(torch.full((1, 4), math.nan), torch.tensor([2]))


def naive_rank(scores: list[float], target: int, history: set[int]) -> float:
    if target < 2:
        return math.nan
    others = [i for i in range(2, len(scores)) if i != target and i not in history]
    higher = sum(scores[i] > scores[target] for i in others)
    equal = sum(scores[i] == scores[target] for i in others)
    return 1 + higher + equal / 2


@pytest.mark.parametrize("exclude_history", [True, False])
def test_batched_ranks_equal_a_naive_loop(exclude_history):
    generator = torch.Generator().manual_seed(0)
    B, V, T = 17, 783, 29
    scores = torch.randint(0, 40, (B, V), generator=generator).float()  # few distinct values: many ties
    targets = torch.randint(0, V, (B,), generator=generator)
    targets[:3] = torch.tensor([0, 1, 2])
    history = torch.randint(0, V, (B, T), generator=generator)
    history[:, T // 2 :] = 0  # padding
    history[3, 0] = targets[3]  # the target in its own history
    history[4] = 0  # an empty history
    ranks = target_ranks(scores, targets, history, exclude_history)
    expected = [
        naive_rank(scores[b].tolist(), int(targets[b]), set(history[b].tolist()) if exclude_history else set())
        for b in range(B)
    ]
    np.testing.assert_array_equal(ranks.numpy(), np.array(expected))


# -- retrieval: rank metrics ----------------------------------------------------------------------


def test_rank_metrics_by_hand():
    ranks = torch.tensor([1.0, 2.5, 4.0, math.nan])
    assert hit_rate_at_k(ranks, 3) == pytest.approx(2 / 3)
    assert ndcg_at_k(ranks, 3) == pytest.approx((1 + 1 / math.log2(3.5)) / 3)
    assert mrr(ranks) == pytest.approx((1 + 1 / 2.5 + 1 / 4) / 3)


def test_k_larger_than_the_corpus():
    ranks = target_ranks(TIED_SCORES, torch.tensor([2, 3, 5]))  # 4 recommendable items
    assert hit_rate_at_k(ranks, 1000) == 1.0
    assert ndcg_at_k(ranks, 1000) == pytest.approx((1 / math.log2(3.5) + 1 + 1 / math.log2(5)) / 3)


def test_retrieval_metrics_keys_and_directions():
    metrics = retrieval_metrics(np.array([1.0, 20.0]), ks=(10, 50))
    assert list(metrics) == ["hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr", "rows", "scored_rows"]
    assert metrics["hr@10"] == 0.5 and metrics["hr@50"] == 1.0
    assert all(direction(name) == "max" for name in ["hr@10", "ndcg@50", "mrr", "val/hr@200"])


def test_popularity_baseline():
    counts = np.array([100, 50, 3, 7, 7, 0])
    scores = popularity_scores(counts, batch=3)
    assert scores.shape == (3, 6) and torch.isinf(scores[:, :2]).all()
    # 3 and 4 tie at the top; 5 was never bought and is last.
    assert target_ranks(scores, torch.tensor([3, 2, 5])).tolist() == [1.5, 3.0, 4.0]


# -- binary ---------------------------------------------------------------------------------------


def test_auc_by_hand_with_ties():
    assert auc_roc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    # pairs (positive, negative): (.5, .5) tie → 1/2, the other three are ordered right → 3.5 / 4.
    assert auc_roc([0, 1, 0, 1], [0.5, 0.5, 0.2, 0.9]) == 0.875
    assert auc_roc([1, 0, 1, 0], [0.3] * 4) == 0.5


def test_auc_with_one_class_is_nan():
    assert math.isnan(auc_roc([1, 1, 1], [0.2, 0.5, 0.9]))
    assert math.isnan(auc_roc([0, 0], [0.2, 0.5]))
    assert math.isnan(auc_roc([], []))


def test_pr_auc_by_hand():
    # Descending: .8 (+), .4 (-), .35 (+), .1 (-): recall steps 1/2 at precision 1 and 1/2 at 2/3.
    assert pr_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    # Tied .5s are one threshold: precision 1/2 at recall 1/2, then 2/3 at recall 1.
    assert pr_auc([1, 0, 1], [0.5, 0.5, 0.2]) == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    assert math.isnan(pr_auc([0, 0], [0.3, 0.6]))
    assert pr_auc([1, 1], [0.3, 0.6]) == 1.0


def test_log_loss_clips():
    assert log_loss([1, 0], [0.0, 1.0]) == pytest.approx(-math.log(1e-7))
    assert log_loss([1, 0], [1.0, 0.0]) == pytest.approx(1e-7, rel=1e-3)
    assert log_loss([1, 0], [0.0, 1.0], eps=1e-3) == pytest.approx(-math.log(1e-3))
    assert log_loss([1, 0], [0.8, 0.4]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)


def test_accuracy_threshold_is_inclusive():
    assert accuracy([1, 0, 1, 0], [0.5, 0.49, 0.2, 0.9]) == 0.5
    assert accuracy([1, 0], [0.7, 0.2], threshold=0.8) == 0.5


def test_binary_inputs_are_validated():
    with pytest.raises(ValueError, match="0 or 1"):
        auc_roc([0, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="differ in length"):
        log_loss([0, 1], [0.1])


def test_prior_rate_baseline():
    y = np.array([0, 1, 0, 0])
    metrics = binary_metrics(y, prior_rate_probabilities(0.25, y.size))
    assert metrics["auc_roc"] == 0.5 and metrics["accuracy"] == 0.75 and metrics["rows"] == 4
    assert metrics["pr_auc"] == 0.25  # one threshold: precision = the positive rate
    assert direction("act_7d/auc_roc") == "max" and direction("log_loss") == "min"


def test_binary_metrics_match_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 783)
    p = np.round(np.clip(0.3 * y + rng.uniform(0.01, 0.7, 783), 0.01, 0.99), 2)  # rounded: ties
    assert auc_roc(y, p) == pytest.approx(sklearn_metrics.roc_auc_score(y, p), abs=1e-12)
    assert pr_auc(y, p) == pytest.approx(sklearn_metrics.average_precision_score(y, p), abs=1e-12)
    assert log_loss(y, p) == pytest.approx(sklearn_metrics.log_loss(y, p), abs=1e-12)
    assert accuracy(y, p) == pytest.approx(sklearn_metrics.accuracy_score(y, p >= 0.5))


# -- regression -----------------------------------------------------------------------------------


def test_regression_by_hand():
    y, yhat = np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 1.0])
    assert rmse(y, yhat) == pytest.approx(math.sqrt(10 / 3))
    assert mae(y, yhat) == pytest.approx(4 / 3)
    assert mape(y, yhat) == pytest.approx((1 + 0 + 0.75) / 3)


def test_mape_skips_zero_targets():
    y, yhat = [0.0, 2.0, -4.0], [5.0, 3.0, -2.0]
    assert mape(y, yhat) == 0.5
    assert math.isnan(mape([0.0, 0.0], [1.0, 2.0]))
    metrics = regression_metrics(y, yhat)
    assert metrics["rows"] == 3 and metrics["mape_rows"] == 2 and metrics["mape"] == 0.5
    assert all(direction(name) == "min" for name in ["rmse", "mae", "mape"])


def test_empty_regression_is_nan():
    assert math.isnan(rmse([], [])) and math.isnan(mae([], []))


# -- directions -----------------------------------------------------------------------------------


def test_every_metric_produced_has_a_direction_and_counts_do_not():
    names = [
        *retrieval_metrics([1.0], ks=(5,)),
        *binary_metrics([0, 1], [0.2, 0.7]),
        *regression_metrics([1.0], [1.0]),
    ]
    for name in names:
        if name in {"rows", "scored_rows", "mape_rows"}:
            with pytest.raises(ValueError, match="row count"):
                direction(name)
        else:
            assert direction(name) in {"max", "min"}
    assert set(METRIC_DIRECTIONS.values()) == {"max", "min"}
    with pytest.raises(ValueError, match="unknown metric"):
        direction("hr@")


# -- device ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_ranks_on_gpu_equal_cpu():
    generator = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 40, (17, 783), generator=generator).float()
    targets = torch.randint(0, 783, (17,), generator=generator)
    history = torch.randint(0, 783, (17, 29), generator=generator)
    cpu = target_ranks(scores, targets, history)
    gpu = target_ranks(scores.cuda(), targets.cuda(), history.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, equal_nan=True)
