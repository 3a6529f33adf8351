"""Retrieval metrics: the next-item ranks that training validates with and eval reports.

`target_ranks` turns a (B, V) score matrix into the 1-based rank of each row's target, batched in
torch so it runs on the scores' device; the rank metrics (`hit_rate_at_k`, `ndcg_at_k`, `mrr`) then
work on ranks alone. Ids 0 (padding) and 1 (OOV) are never recommended: they never compete, and a
row whose target is 0 or 1 gets rank NaN and is skipped by every aggregate (`scored_rows` says how
many rows counted). A target tied with other items gets its expected rank under random
tie-breaking (see `lumos.eval.metrics` for the tie rules and the metrics' directions). It sits in
train/, not eval/, so that the training loop imports it downward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from lumos.data.contract import FIRST_TOKEN_ID

ArrayLike = np.ndarray | Tensor | Sequence[float]

# -- retrieval ------------------------------------------------------------------------------------


def target_ranks(
    scores: Tensor, targets: Tensor, history: Tensor | None = None, exclude_history: bool = True
) -> Tensor:
    """(B,) float64 1-based rank of each row's target among all recommendable items; NaN when unscored.

    scores: (B, V) item scores (higher is better), any float dtype, on any device.
    targets: (B,) item ids; rows whose target is 0 (no next item) or 1 (OOV) get NaN.
    history: (B, T) item ids the user already interacted with (0-padded), or None.
    exclude_history: remove history items (ids ≥ 2) from the competition, the usual protocol when
        already-seen items are filtered out before recommending. The target itself is never removed:
        a repeat purchase of the target stays rankable.

    Competitors are items 2 .. V-1 other than the target (and, with exclude_history, not in the
    row's history); rank = 1 + #(competitors scoring higher) + #(competitors scoring equal) / 2, the
    expected rank under random tie-breaking. Memory is O(B·V) booleans: chunk B for huge corpora.
    """
    if scores.ndim != 2:
        raise ValueError(f"scores must be (B, V), got shape {tuple(scores.shape)}")
    B, V = scores.shape
    device = scores.device
    targets = targets.to(device=device, dtype=torch.long).reshape(-1)  # (B,)
    if targets.shape[0] != B:
        raise ValueError(f"targets has {targets.shape[0]} rows but scores has {B}")
    _check_ids(targets, V, "targets")
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN; a NaN score cannot be ranked (check the model's outputs)")

    scored = targets >= FIRST_TOKEN_ID  # (B,)
    safe_targets = torch.where(scored, targets, FIRST_TOKEN_ID)[:, None]  # (B, 1); gather needs valid ids
    competes = (torch.arange(V, device=device) >= FIRST_TOKEN_ID).expand(B, V).clone()  # (B, V)
    if history is not None and exclude_history:
        history = history.to(device=device, dtype=torch.long)
        if history.ndim != 2 or history.shape[0] != B:
            raise ValueError(f"history must be (B={B}, T), got shape {tuple(history.shape)}")
        _check_ids(history, V, "history")
        competes.scatter_(1, history, False)  # padding and OOV are already out
    competes.scatter_(1, safe_targets, False)  # the target never competes with itself

    target_score = scores.gather(1, safe_targets)  # (B, 1)
    higher = ((scores > target_score) & competes).sum(dim=1)  # (B,)
    equal = ((scores == target_score) & competes).sum(dim=1)  # (B,)
    ranks = 1.0 + higher.to(torch.float64) + equal.to(torch.float64) / 2
    return ranks.masked_fill(~scored, math.nan)


def _check_ids(ids: Tensor, V: int, name: str) -> None:
    if ids.numel() and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(
            f"{name} holds ids outside [0, {V}) (min {int(ids.min())}, max {int(ids.max())}); "
            "scores and ids must come from the same item vocabulary"
        )


def hit_rate_at_k(ranks: ArrayLike, k: int) -> float:
    """Share of scored rows whose target ranks within the top k (k may exceed the corpus: then 1)."""
    ranks = _scored_ranks(ranks, k)
    return mean_or_nan(ranks <= k)


def ndcg_at_k(ranks: ArrayLike, k: int) -> float:
    """Mean NDCG@k with one relevant item: 1 / log2(rank + 1) if rank ≤ k, else 0 (ideal DCG is 1)."""
    ranks = _scored_ranks(ranks, k)
    return mean_or_nan(np.where(ranks <= k, 1.0 / np.log2(ranks + 1.0), 0.0))


def mrr(ranks: ArrayLike) -> float:
    """Mean reciprocal rank over scored rows (no cut-off)."""
    return mean_or_nan(1.0 / _scored_ranks(ranks))


def retrieval_metrics(ranks: ArrayLike, ks: Sequence[int] = (10, 50)) -> dict[str, float]:
    """hr@k and ndcg@k for each k, mrr, and the row counts: rows (all) and scored_rows (non-NaN ranks)."""
    all_ranks = as_float_array(ranks)
    metrics: dict[str, float] = {}
    for k in ks:
        metrics[f"hr@{k}"] = hit_rate_at_k(all_ranks, k)
        metrics[f"ndcg@{k}"] = ndcg_at_k(all_ranks, k)
    metrics["mrr"] = mrr(all_ranks)
    metrics["rows"] = all_ranks.size
    metrics["scored_rows"] = int(np.count_nonzero(~np.isnan(all_ranks)))
    return metrics


def popularity_scores(train_item_counts: np.ndarray, batch: int, device: torch.device | str | None = None) -> Tensor:
    """(batch, V) float64 scores of the "no model" baseline: every user gets the training counts.

    Ids 0 and 1 score -inf, as in the model's score_items. The result is a broadcast view of one
    (V,) row: clone it before writing to it. float64 keeps counts above 2^24 exact, so no false ties.
    """
    counts = torch.as_tensor(np.asarray(train_item_counts, dtype=np.float64), device=device)  # (V,)
    if counts.ndim != 1:
        raise ValueError(f"train_item_counts must be (V,), got shape {tuple(counts.shape)}")
    counts = counts.clone()
    counts[:FIRST_TOKEN_ID] = -math.inf
    return counts.expand(batch, -1)  # (batch, V)


def _scored_ranks(ranks: ArrayLike, k: int | None = None) -> np.ndarray:
    if k is not None and k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    ranks = as_float_array(ranks)
    return ranks[~np.isnan(ranks)]


def as_float_array(values: ArrayLike) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def mean_or_nan(values: np.ndarray) -> float:
    """Mean as a Python float; NaN (without numpy's empty-slice warning) when there are no values."""
    return float(values.mean()) if values.size else math.nan
