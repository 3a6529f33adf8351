"""The next_items kind (one global cutoff, the items of the days after it as targets): the cut
holds no target before the cutoff and no history after it, the popularity baselines equal an
independent computation (by hand and by scikit-learn's NDCG), a model is scored through the same
path, and the MovieLens time-split recipes and task name one cutoff."""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lumos.core.config import from_dict, load_config
from lumos.core.errors import ConfigError, UsageError
from lumos.core.tables import TableRef
from lumos.data.contract import FeatureSpec
from lumos.data.delta_snapshot import DataFile, DeltaSnapshot
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import SequencesVersion
from lumos.eval.kinds.next_items import (
    MICROS_PER_DAY,
    cutoff_micros,
    recency_prior,
    split_events,
    top_items,
    window_events,
)
from lumos.eval.metrics import next_items_metrics
from lumos.eval.score import score_baselines, score_model
from lumos.eval.tasks import LoadedTask, TaskSpec, TimeWindow, load_tasks
from lumos.train.model import LumosModel, ModelConfig

CUTOFF = datetime.date(2024, 3, 1)
ITEMS = [f"m{number}" for number in range(13)]  # vocab ids 2..14
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "movielens"


def _events(seed: int = 5, users: int = 17) -> pa.Table:
    """Ratings from 40 days before the cutoff to 40 days after it; m12 is rated only after it."""
    rng = np.random.default_rng(seed)
    rows = []
    start = cutoff_micros(CUTOFF) - 40 * MICROS_PER_DAY
    for user in range(users):
        for _ in range(int(rng.integers(3, 12))):
            micros = int(start + rng.integers(0, 80 * MICROS_PER_DAY))
            item = ITEMS[int(rng.integers(0, 12 if micros < cutoff_micros(CUTOFF) else 13))]
            rows.append({"user_id": f"u{user}", "item_id": item, "ts": micros})
    table = pa.Table.from_pylist(rows)
    return table.set_column(2, "ts", table["ts"].cast(pa.timestamp("us")))


@pytest.fixture
def workspace(tmp_path) -> tuple[SequencesVersion, LoadedTask, pa.Table]:
    """A vocabulary (ids by count before the cutoff; m12 is not in it), the events file, and one
    test row per user with ratings before the cutoff, cut there."""
    events = _events()
    pq.write_table(events, tmp_path / "events.parquet")
    before = [row for row in events.to_pylist() if row["ts"] < datetime.datetime(2024, 3, 1)]
    counts = Counter(row["item_id"] for row in before)
    ranked = sorted(counts, key=lambda item: (-counts[item], item))
    vocab = pa.table({"feature": ["item"] * len(ranked), "token": ranked, "id": list(range(2, 2 + len(ranked)))})
    pq.write_table(vocab, tmp_path / "vocab.parquet")
    item_id = dict(zip(ranked, range(2, 2 + len(ranked)), strict=True))
    rows = []
    for user in sorted({row["user_id"] for row in before}):
        history = sorted((row for row in before if row["user_id"] == user), key=lambda row: row["ts"])[-8:]
        rows.append({"user_id": user, "split": "test", "as_of": datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC),
                     "item": [item_id[row["item_id"]] for row in history], "hour": [0] * len(history), "next_item": None})
    table = pa.Table.from_pylist(rows)
    table = table.set_column(table.column_names.index("next_item"), "next_item", pa.nulls(len(rows), pa.int32()))
    pq.write_table(table, tmp_path / "part-0.parquet")
    snapshot = lambda name: DeltaSnapshot(str(tmp_path), 0, (DataFile(str(tmp_path / name), 1),))  # noqa: E731
    data = SequencesVersion(TableRef.parse("tiny.sequences@0"), snapshot("part-0.parquet"), {},
                            FeatureSpec(token_categorical={"item": len(ranked) + 2, "hour": 24}, token_numeric=(), max_len=8),
                            snapshot("vocab.parquet"))
    spec = from_dict(TaskSpec, {"name": "tiny_time_split", "kind": "next_items", "primary_metric": "ndcg@10",
                                "data": "tiny.sequences", "ks": [3, 10], "batch_size": 4,
                                "window": {"events": "events.parquet", "cutoff": CUTOFF, "days": 30, "recent_days": 7}})
    return data, LoadedTask(spec, tmp_path / "tiny_time_split.toml"), events


def test_the_cut_has_no_target_before_the_cutoff_and_no_history_after_it():
    events = _events(seed=11, users=40)
    micros = events["ts"].cast(pa.int64()).to_numpy()
    users = np.array(events["user_id"].to_pylist(), dtype=object)
    items = np.array(events["item_id"].to_pylist(), dtype=object)
    window = TimeWindow(events="unused", cutoff=CUTOFF, days=30, recent_days=7)
    item_ids = {item: index + 2 for index, item in enumerate(ITEMS[:12])}
    cut = split_events(users, items, micros, window, item_ids, len(ITEMS) + 2)
    token_of = {index: item for item, index in item_ids.items()}
    start, end = cutoff_micros(CUTOFF), cutoff_micros(CUTOFF) + 30 * MICROS_PER_DAY
    assert cut.targets and cut.history
    for user, targets in cut.targets.items():
        for target in targets:
            rated = micros[(users == user) & (items == token_of.get(int(target), "m12"))]
            assert rated.min() >= start  # first rated from the cutoff on ...
            assert ((rated >= start) & (rated < end)).any()  # ... within the window
            assert target not in cut.history.get(user, ())
        assert len(set(targets.tolist())) == len(targets)
    for user, history in cut.history.items():  # exactly the items rated before the cutoff
        assert set(history.tolist()) == {item_ids[item] for item in items[(users == user) & (micros < start)]}
    # m12 is rated only after the cutoff: it is in no count and is a target no list can hold.
    assert cut.popularity.sum() == (micros < start).sum() and cut.popularity[1] == 0
    recent = (micros >= start - 7 * MICROS_PER_DAY) & (micros < start)
    assert cut.recent.sum() == recent.sum()
    if "m12" in items[(micros >= start) & (micros < end)]:
        assert any((targets < 0).any() for targets in cut.targets.values())


def _hand_metrics(ranking: list[int], history: set[int], targets: set[int], unknown: int, k: int) -> tuple[float, float]:
    top = [item for item in ranking if item not in history][:k]
    hits = [1.0 if item in targets else 0.0 for item in top]
    ideal = sum(1 / math.log2(position + 2) for position in range(min(len(targets) + unknown, k)))
    dcg = sum(hit / math.log2(position + 2) for position, hit in enumerate(hits))
    return sum(hits) / (len(targets) + unknown), dcg / ideal


def test_the_popularity_baselines_equal_an_independent_computation(workspace):
    data, task, events = workspace
    rows = events.to_pylist()
    cutoff = datetime.datetime(2024, 3, 1)
    before = [row for row in rows if row["ts"] < cutoff]
    vocab = pq.read_table(data.vocab.files[0].path).to_pylist()
    item_id = {row["token"]: row["id"] for row in vocab}
    everything = Counter(item_id[row["item_id"]] for row in before)
    last_week = Counter(item_id[row["item_id"]] for row in before if row["ts"] >= cutoff - datetime.timedelta(days=7))
    ids = sorted(item_id.values())
    rankings = {"popularity": sorted(ids, key=lambda item: (-everything[item], item)),
                "popularity_last_7d": sorted(ids, key=lambda item: (-last_week[item], -everything[item], item))}
    history, targets, unknown = {}, {}, {}
    for row in sorted(rows, key=lambda row: row["ts"]):
        user, item = row["user_id"], row["item_id"]
        if row["ts"] < cutoff:
            history.setdefault(user, set()).add(item_id[item])
        elif row["ts"] < cutoff + datetime.timedelta(days=30) and item_id.get(item) not in history.get(user, set()):
            if item in item_id:
                targets.setdefault(user, set()).add(item_id[item])
            else:
                unknown.setdefault(user, set()).add(item)
    active = sorted(user for user in history if user in targets or user in unknown)

    scored = dict(score_baselines(task, data))
    assert list(scored) == ["popularity_last_7d", "popularity"]  # the one to beat first
    for name, ranking in rankings.items():
        assert scored[name].rows == len(active)
        for k in (3, 10):
            hand = [_hand_metrics(ranking, history[user], targets.get(user, set()), len(unknown.get(user, ())), k)
                    for user in active]
            assert scored[name].metrics[f"recall@{k}"] == pytest.approx(np.mean([recall for recall, _ in hand]), abs=1e-12)
            assert scored[name].metrics[f"ndcg@{k}"] == pytest.approx(np.mean([ndcg for _, ndcg in hand]), abs=1e-12)


def test_next_items_ndcg_equals_scikit_learns():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    for _ in range(20):
        scores = rng.permutation(40).astype(float)  # distinct: sklearn averages over ties, topk does not
        targets = rng.choice(40, size=int(rng.integers(1, 15)), replace=False)
        relevance = np.isin(np.arange(40), targets).astype(float)
        top = np.argsort(-scores)
        for k in (1, 5, 10):
            ours = next_items_metrics([top[:10]], [targets], [k])
            assert ours[f"ndcg@{k}"] == pytest.approx(sklearn_metrics.ndcg_score([relevance], [scores], k=k), abs=1e-12)
            assert ours[f"recall@{k}"] == pytest.approx(relevance[top[:k]].sum() / len(targets))


def test_a_model_is_scored_on_the_active_users_through_the_same_path(workspace):
    data, task, _ = workspace
    torch.manual_seed(0)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8,
                         heads=("retrieval",))
    model = LumosModel(config, data.spec).eval()
    scores = score_model(model, task, data)
    assert set(scores.metrics) == set(task.spec.metric_names) == {"recall@3", "recall@10", "ndcg@3", "ndcg@10"}
    assert all(0 <= value <= 1 for value in scores.metrics.values())
    assert scores.rows == dict(score_baselines(task, data))["popularity"].rows


def test_the_recency_prior_moves_the_model_towards_the_last_days_popularity(workspace):
    """Weight 0 is the model alone; a weight that swamps the model ranks the recently rated items
    first, as the 7-day baseline does, among those it counts; the model's own order comes back when
    the counts tie."""
    data, task, _ = workspace
    torch.manual_seed(0)
    config = ModelConfig(d_model=8, n_heads=2, encoder_layers=1, decoder_layers=1, d_ff=16, dropout=0.0, max_len=8,
                         heads=("retrieval",))
    model = LumosModel(config, data.spec).eval()
    with_prior = lambda weight: LoadedTask(dataclasses.replace(  # noqa: E731
        task.spec, window=dataclasses.replace(task.spec.window, recency_prior=weight)), task.path)
    alone = score_model(model, task, data).metrics
    assert score_model(model, with_prior(0.0), data).metrics == alone
    assert score_model(model, with_prior(1e6), data).metrics != alone
    events = window_events(task, data)
    assert torch.equal(recency_prior(events, 2.0), 2.0 * torch.log1p(torch.from_numpy(events.recent).float()))
    model_scores = torch.randn(3, len(events.recent), generator=torch.Generator().manual_seed(1))
    lists = top_items(model_scores + recency_prior(events, 1e3), [np.empty(0)] * 3, 10)
    for row, items in enumerate(lists):  # by recent count first, then by the model's score
        keys = [(int(events.recent[item]), float(model_scores[row, item])) for item in items]
        assert keys == sorted(keys, reverse=True)


@pytest.mark.parametrize("weight", [-0.5, float("nan"), float("inf")])
def test_a_recency_prior_must_be_finite_and_not_negative(weight):
    window = {"events": "events.parquet", "cutoff": CUTOFF, "recency_prior": weight}
    with pytest.raises(ConfigError, match="recency_prior"):
        from_dict(TaskSpec, {"name": "t", "kind": "next_items", "primary_metric": "ndcg@10", "window": window})


def test_rows_cut_at_another_date_are_refused(workspace, tmp_path):
    data, task, _ = workspace
    rows = pq.read_table(data.snapshot.files[0].path)
    later = pa.array([datetime.datetime(2024, 3, 2, tzinfo=datetime.UTC)] * rows.num_rows, rows["as_of"].type)
    pq.write_table(rows.set_column(rows.column_names.index("as_of"), "as_of", later), tmp_path / "part-0.parquet")
    with pytest.raises(UsageError, match="not all cut at the window's cutoff 2024-03-01"):
        score_baselines(task, data)


def test_only_next_items_tasks_take_a_window(tmp_path):
    window = {"events": "events.parquet", "cutoff": CUTOFF}
    with pytest.raises(ConfigError, match="only next_items tasks take a window, not retrieval"):
        from_dict(TaskSpec, {"name": "t", "kind": "retrieval", "primary_metric": "mrr", "window": window})
    with pytest.raises(ConfigError, match="a next_items task needs a \\[window\\]"):
        from_dict(TaskSpec, {"name": "t", "kind": "next_items", "primary_metric": "ndcg@10"})
    with pytest.raises(ConfigError, match="days"):
        from_dict(TaskSpec, {"name": "t", "kind": "next_items", "primary_metric": "ndcg@10", "window": window | {"days": 0}})


def test_the_movielens_time_split_names_one_cutoff():
    """The task's cutoff is the date the training table stops at and the scored rows are cut at."""
    task = load_tasks([EXAMPLE / "tasks"])["movielens_time_split"].spec
    before = load_config(IngestRecipe, EXAMPLE / "ingest_before.toml")
    cutoff = load_config(IngestRecipe, EXAMPLE / "ingest_cutoff.toml")
    midnight = datetime.datetime.combine(task.window.cutoff, datetime.time())
    assert before.cleaning.max_timestamp == cutoff.cleaning.max_timestamp == midnight
    assert before.splits.mode == "leave_last_out" and cutoff.splits.mode == "time"
    assert [(c.split, c.as_of) for c in cutoff.splits.cutoffs] == [(task.split, task.window.cutoff)]
    assert task.data == f"{cutoff.dataset}.sequences"
    # Both tables tokenize the same ratings alike, so their vocabularies (and the model's) agree.
    assert (before.source, before.columns, before.cleaning, before.vocab, before.tokens) == (
        cutoff.source, cutoff.columns, cutoff.cleaning, cutoff.vocab, cutoff.tokens)
