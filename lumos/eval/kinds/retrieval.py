"""retrieval: rank the next item among the whole item vocabulary (HR@k, NDCG@k, MRR).

The label is the row's next item. The baseline is popularity: vocab ids are assigned by descending
count, so popularity is the id order. A submission gives each user `top_items`, item ids best first;
the target's rank is its position in the list (history items dropped first when the task excludes
them), and a target missing from the list ranks past every cut-off (hit 0, reciprocal rank 0).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lumos.data.contract import FIRST_TOKEN_ID
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.kinds.kind import Broken, Prediction, Scores, TaskKind, picked_scores, rows_where, task_batches
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike
from lumos.train import retrieval_metrics
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    return (*[f"{metric}@{k}" for k in spec.ks for metric in ("hr", "ndcg")], "mrr")


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec = task.spec
    ranks = []
    with torch.no_grad():
        for batch in task_batches(data, spec):
            batch = batch.to(device)
            output = model(batch)
            history = model.history_items(batch)
            scores = model.score_items(batch, output)  # (B, V): the full corpus is ranked
            ranks.append(retrieval_metrics.target_ranks(scores, batch.next_item, history, spec.exclude_history).cpu())
    return _scores(spec, ranks)


def popularity_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    spec = task.spec
    popularity = -np.arange(data.spec.item_vocab_size)  # ids go by descending count: id 2 is the most frequent
    ranks = []
    for batch in task_batches(data, spec):
        history = batch.history_items(data.spec.item_feature)
        scores = retrieval_metrics.popularity_scores(popularity, batch.size)
        ranks.append(retrieval_metrics.target_ranks(scores, batch.next_item, history, spec.exclude_history))
    return "popularity", _scores(spec, ranks)


def _scores(spec: TaskSpecLike, ranks: list[torch.Tensor]) -> Scores:
    all_ranks = torch.cat(ranks) if ranks else torch.empty(0)
    values = retrieval_metrics.retrieval_metrics(all_ranks, ks=spec.ks)
    rows = int(values.pop("scored_rows", len(all_ranks)))
    return picked_scores(spec, values, rows)


def check_top_items(spec: TaskSpecLike, data: SequencesVersion, column: pa.ChunkedArray) -> list[Broken]:
    lists = column.to_pylist()
    shortest = min(max(spec.ks), data.spec.item_vocab_size - FIRST_TOKEN_ID)  # a tiny corpus has fewer items
    missing = np.array([items is None or None in items for items in lists], dtype=bool)
    present = [items if not gap else [] for items, gap in zip(lists, missing, strict=True)]
    too_short = np.array([not gap and len(items) < shortest for items, gap in zip(present, missing, strict=True)], dtype=bool)
    unknown = np.array([any(not FIRST_TOKEN_ID <= item < data.spec.item_vocab_size for item in items) for items in present],
                       dtype=bool)
    repeated = np.array([len(set(items)) != len(items) for items in present], dtype=bool)
    found = [Broken("top_items must be a list of item ids with no null", rows_where(missing)),
             Broken(f"top_items must hold at least {shortest} items (the task's largest k)", rows_where(too_short)),
             Broken(f"unknown item id (item ids run from {FIRST_TOKEN_ID} to {data.spec.item_vocab_size - 1}; "
                    "items.parquet of `lumos eval tasks export` lists them)", rows_where(unknown)),
             Broken("an item appears more than once in one top_items", rows_where(repeated))]
    return [broken for broken in found if broken.rows.size]


def score_top_items(spec: TaskSpecLike, data: SequencesVersion, rows: pa.Table, column: pa.ChunkedArray) -> Scores:
    targets = pc.fill_null(rows["next_item"], 0).to_numpy(zero_copy_only=False)
    histories = rows[data.spec.item_feature].to_pylist()
    ranks = [_list_rank(np.asarray(items, dtype=np.int64), int(target), history, spec.exclude_history)
             for items, target, history in zip(column.to_pylist(), targets, histories, strict=True)]
    return _scores(spec, [torch.tensor(ranks, dtype=torch.float64)])


def _list_rank(items: np.ndarray, target: int, history: list[int], exclude_history: bool) -> float:
    """The target's 1-based position among the listed candidates; NaN when the row has no target
    (as `target_ranks`), infinity when the list misses it."""
    if target < FIRST_TOKEN_ID:
        return math.nan
    if exclude_history:
        items = items[~np.isin(items, history) | (items == target)]  # the target stays a candidate
    hit = np.flatnonzero(items == target)
    return float(hit[0] + 1) if hit.size else math.inf


def top_items_rules(spec: TaskSpecLike) -> list[str]:
    return [f"top_items: at least {max(spec.ks)} distinct item ids of items.parquet, best first",
            "items of the user's history are dropped before ranking" if spec.exclude_history
            else "items of the user's history are ranked like any other"]


PREDICTION = Prediction("top_items", "list<int64>", "item ids, best first, at least the task's largest k of them",
                        top_items_rules, check_top_items, score_top_items)
KIND = TaskKind("retrieval", default_metrics, score, baselines=(popularity_baseline,), head="retrieval",
                prediction=PREDICTION)
