"""next_items: from one global cutoff date, rank the items each user rates in the days after it
(recall@k, NDCG@k).

Every user is cut at the same moment (the task's [window] cutoff), so nothing after it reaches a
model's input or a baseline's counts, and leave-one-out's flattery of sequence models (each user
cut at their own last event, whenever it happened) is gone. The rows scored are the task's split
rows (an ingest with splits.mode = "time" and that cutoff: history before it) of the active users:
those who rate at least one item in the `days` days from the cutoff. Their targets are the
distinct items they rate then that they had not rated before (rated items are never recommended
again); a target the vocabulary lacks (first rated after the cutoff) stays a target nobody can
rank, so every entry is scored against the same sets.

The targets and the baselines' counts come from the events file the window names, item tokens
mapped to ids through the data's vocabulary. The model and both baselines (leaderboard kind
baseline) give one score per item; one path ranks them (`top_items`) and one metric function
(`metrics.next_items_metrics`) scores every entry:
- popularity_last_<N>d (the main one, printed beside the model): counts in the N days before the
  cutoff (the window's recent_days), ties by popularity. Under a global split it is the baseline to
  beat (arXiv 2508.06450 finds it ahead of tuned SASRec variants on MovieLens-20M);
- popularity: counts of every event before the cutoff.
Both are deterministic (ties left after the counts go to the smaller id): nothing to seed.

The window's `recency_prior` weights those recent counts into the model's own scores (a product of
experts, `recency_prior()`), chosen on an earlier cutoff: the model ranks the user's taste, the
counts say what is being watched now.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lumos.core.errors import UsageError
from lumos.data.contract import FIRST_TOKEN_ID, OOV_ID
from lumos.data.loader import history_length_order, table_batches
from lumos.data.sequences_version import SequencesVersion
from lumos.eval import metrics as M
from lumos.eval.embeddings import split_rows
from lumos.eval.kinds.kind import Scores, TaskKind, picked_scores
from lumos.eval.task_spec import LoadedTaskLike, TaskSpecLike, TimeWindow
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.eval.embeddings import EmbeddingCache

MICROS_PER_DAY = 86_400_000_000
EPOCH = datetime.date(1970, 1, 1)


def default_metrics(spec: TaskSpecLike) -> tuple[str, ...]:
    return tuple(f"{metric}@{k}" for metric in ("recall", "ndcg") for k in spec.ks)


@dataclass(frozen=True)
class WindowEvents:
    """What the events say about one cutoff, per user and per item id (ids of the data's vocabulary)."""

    history: dict[str, np.ndarray]
    """User → the item ids rated before the cutoff (never recommended to them)."""
    targets: dict[str, np.ndarray]
    """User → the distinct items first rated in [cutoff, cutoff + days): their ids, and a distinct
    negative id for each item the vocabulary lacks. Only users with at least one are keys."""
    popularity: np.ndarray
    """(V,) events per item before the cutoff."""
    recent: np.ndarray
    """(V,) events per item in [cutoff - recent_days, cutoff)."""


def cutoff_micros(day: datetime.date) -> int:
    """The cutoff date at 00:00 UTC, in epoch microseconds (the ingest's as_of of a time cutoff)."""
    return (day - EPOCH).days * MICROS_PER_DAY


def split_events(users: np.ndarray, items: np.ndarray, micros: np.ndarray, window: TimeWindow,
                 item_ids: dict[str, int], vocab_size: int) -> WindowEvents:
    """Cut one event log at the window's cutoff. users/items: tokens (strings), micros: epoch µs."""
    cutoff = cutoff_micros(window.cutoff)
    ids = np.array([item_ids.get(item, OOV_ID) for item in items], dtype=np.int64)
    before = micros < cutoff
    after = (micros >= cutoff) & (micros < cutoff + window.days * MICROS_PER_DAY)
    recent = before & (micros >= cutoff - window.recent_days * MICROS_PER_DAY)
    history: dict[str, set[str]] = {}
    for user, item in zip(users[before], items[before], strict=True):
        history.setdefault(user, set()).add(item)
    new_items: dict[str, list[str]] = {}
    for user, item in zip(users[after], items[after], strict=True):
        if item not in history.get(user, ()) and item not in new_items.setdefault(user, []):
            new_items[user].append(item)
    unknown = {item: -(number + 1) for number, item in enumerate(sorted({i for items in new_items.values() for i in items
                                                                          if i not in item_ids}))}
    return WindowEvents(
        history={user: np.array(sorted(item_ids.get(item, OOV_ID) for item in seen), dtype=np.int64)
                 for user, seen in history.items()},
        targets={user: np.array([item_ids.get(item, unknown.get(item)) for item in found], dtype=np.int64)
                 for user, found in new_items.items() if found},
        popularity=np.bincount(ids[before], minlength=vocab_size),
        recent=np.bincount(ids[recent], minlength=vocab_size),
    )


def top_items(scores: torch.Tensor, history: list[np.ndarray], k: int) -> np.ndarray:
    """(B, min(k, items)) the k best-scored item ids of each row, best first; padding, OOV and the
    row's history never appear. scores: (B, V), higher is better."""
    scores = scores.detach().to("cpu", torch.float64).clone()
    scores[:, :FIRST_TOKEN_ID] = float("-inf")
    for row, items in enumerate(history):
        scores[row, torch.as_tensor(items, dtype=torch.long)] = float("-inf")
    keep = min(k, scores.shape[1] - FIRST_TOKEN_ID)
    return torch.topk(scores, keep, dim=1).indices.numpy()


def score(model: LumosModel, task: LoadedTaskLike, data: SequencesVersion, device: torch.device,
          embeddings: EmbeddingCache) -> Scores:
    spec = task.spec
    events = window_events(task, data)
    rows = active_rows(task, data, events)
    rows = rows.take(history_length_order(rows, data.spec))  # a batch is padded to its longest history
    users = rows["user_id"].to_pylist()
    prior = recency_prior(events, spec.window.recency_prior).to(device)
    lists = []
    with torch.no_grad():
        for start, batch in zip(range(0, len(users), spec.batch_size),
                                table_batches(rows, data.spec, spec.batch_size, f"split {spec.split} of {data.ref}"),
                                strict=True):
            batch = batch.to(device)
            scores = model.score_items(batch, model(batch)) + prior  # (B, V)
            batch_users = users[start:start + spec.batch_size]
            lists.extend(top_items(scores, [events.history.get(user, np.empty(0)) for user in batch_users], max(spec.ks)))
    return _scores(spec, lists, [events.targets[user] for user in users])


def recency_prior(events: WindowEvents, weight: float) -> torch.Tensor:
    """(V,) weight × log(1 + recent events) per item. The model's scores are log-probabilities up
    to a per-row constant, so adding this ranks by p_model × (1 + recent)^weight."""
    return weight * torch.log1p(torch.from_numpy(events.recent).to(torch.float32))


def popularity_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    events = window_events(task, data)
    return "popularity", _count_baseline(task, data, events, events.popularity, np.zeros_like(events.popularity))


def recent_popularity_baseline(task: LoadedTaskLike, data: SequencesVersion) -> tuple[str, Scores]:
    events = window_events(task, data)
    name = f"popularity_last_{task.spec.window.recent_days}d"
    return name, _count_baseline(task, data, events, events.recent, events.popularity)


def _count_baseline(task: LoadedTaskLike, data: SequencesVersion, events: WindowEvents, counts: np.ndarray,
                    tie_break: np.ndarray) -> Scores:
    """Everyone gets the same ranking: by `counts`, then `tie_break`, then the smaller id."""
    spec = task.spec
    users = active_rows(task, data, events)["user_id"].to_pylist()
    order = np.lexsort((np.arange(len(counts)), -tie_break, -counts))  # the last key sorts first
    item_scores = np.empty(len(counts))
    item_scores[order] = -np.arange(len(counts), dtype=np.float64)  # distinct: no tie left to topk
    scores = torch.from_numpy(item_scores).expand(len(users), -1)
    lists = top_items(scores, [events.history.get(user, np.empty(0)) for user in users], max(spec.ks))
    return _scores(spec, list(lists), [events.targets[user] for user in users])


def _scores(spec: TaskSpecLike, lists: list[np.ndarray], targets: list[np.ndarray]) -> Scores:
    values = M.next_items_metrics(lists, targets, spec.ks)
    return picked_scores(spec, values, int(values["rows"]))


def window_events(task: LoadedTaskLike, data: SequencesVersion) -> WindowEvents:
    """The window's events file, cut at its cutoff, item tokens mapped through the data's vocabulary."""
    window = task.spec.window
    path = (task.path.parent / window.events).resolve()
    if not path.exists():
        raise UsageError(f"task {task.spec.name}: window.events = {window.events!r}: {path} does not exist")
    columns = [window.user_id, window.item_id, window.timestamp]
    table = pq.read_table(path)
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise UsageError(f"{path}: no column {', '.join(missing)}; it has {', '.join(table.column_names)}")
    micros = pc.cast(pc.cast(table[window.timestamp], pa.timestamp("us")), pa.int64()).to_numpy(zero_copy_only=False)
    return split_events(_strings(table[window.user_id]), _strings(table[window.item_id]), micros, window,
                        item_vocabulary(data), data.spec.item_vocab_size)


def active_rows(task: LoadedTaskLike, data: SequencesVersion, events: WindowEvents) -> pa.Table:
    """The task split's rows of the users with targets. Each row must be cut at the window's cutoff:
    a row cut later would show the model events of the target window."""
    spec = task.spec
    rows = split_rows(data, spec.split)
    as_of = pc.cast(pc.cast(rows["as_of"], pa.timestamp("us")), pa.int64()).to_numpy(zero_copy_only=False)
    if rows.num_rows and not np.all(as_of == cutoff_micros(spec.window.cutoff)):
        raise UsageError(f"task {spec.name}: rows of split {spec.split!r} of {data.ref} are not all cut at the "
                         f"window's cutoff {spec.window.cutoff} (ingest them with splits.mode = 'time' and that cutoff)")
    active = pc.is_in(rows["user_id"], pa.array(sorted(events.targets), pa.string()))
    rows = rows.filter(active)
    if rows.num_rows == 0:
        raise UsageError(f"task {spec.name}: no user of split {spec.split!r} rates an item in the {spec.window.days} "
                         f"days from {spec.window.cutoff}")
    return rows


def item_vocabulary(data: SequencesVersion) -> dict[str, int]:
    """Item token → id, from the vocab version the sequences were made with."""
    if data.vocab is None:
        raise UsageError(f"{data.ref}: its vocabulary is not known (open it with open_sequences)")
    table = pq.read_table([data_file.path for data_file in data.vocab.files], columns=["feature", "token", "id"])
    table = table.filter(pc.equal(table["feature"], data.spec.item_feature))
    return dict(zip(table["token"].to_pylist(), table["id"].to_pylist(), strict=True))


def _strings(column: pa.ChunkedArray) -> np.ndarray:
    return np.array(pc.cast(column, pa.string()).to_pylist(), dtype=object)


KIND = TaskKind("next_items", default_metrics, score, baselines=(recent_popularity_baseline, popularity_baseline),
                head="retrieval", takes_window=True)
