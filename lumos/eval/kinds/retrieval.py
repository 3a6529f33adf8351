"""retrieval: rank the next item among the whole item vocabulary (HR@k, NDCG@k, MRR).

The label is the row's next item. The baseline is popularity: vocab ids are assigned by descending
count, so popularity is the id order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from lumos.data.sequences_version import SequencesVersion
from lumos.eval.kinds.kind import Scores, TaskKind, picked_scores, task_batches
from lumos.train import retrieval_metrics
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache
    from lumos.eval.tasks import LoadedTask, TaskSpec


def default_metrics(spec: TaskSpec) -> tuple[str, ...]:
    return (*[f"{metric}@{k}" for k in spec.ks for metric in ("hr", "ndcg")], "mrr")


def score(model: LumosModel, task: LoadedTask, data: SequencesVersion, device: torch.device,
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


def popularity_baseline(task: LoadedTask, data: SequencesVersion) -> tuple[str, Scores]:
    spec = task.spec
    popularity = -np.arange(data.spec.item_vocab_size)  # ids go by descending count: id 2 is the most frequent
    ranks = []
    for batch in task_batches(data, spec):
        history = batch.history_items(data.spec.item_feature)
        scores = retrieval_metrics.popularity_scores(popularity, batch.size)
        ranks.append(retrieval_metrics.target_ranks(scores, batch.next_item, history, spec.exclude_history))
    return "popularity", _scores(spec, ranks)


def _scores(spec: TaskSpec, ranks: list[torch.Tensor]) -> Scores:
    all_ranks = torch.cat(ranks) if ranks else torch.empty(0)
    values = retrieval_metrics.retrieval_metrics(all_ranks, ks=spec.ks)
    rows = int(values.pop("scored_rows", len(all_ranks)))
    return picked_scores(spec, values, rows)


KIND = TaskKind("retrieval", default_metrics, score, baseline=popularity_baseline, head="retrieval")
