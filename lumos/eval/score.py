"""Scoring: run a trained model (or a "no model" baseline) over a task's rows and compute its metrics.

Retrieval ranks the target among the whole item vocabulary; binary and regression read the head
of the task's horizon; an embedding probe fits a probe on the frozen user embeddings. Baselines:
popularity for retrieval (vocab ids are assigned by descending count, so popularity is the id
order), the training split's positive rate for binary, the training split's mean for regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lumos.core.errors import UsageError
from lumos.data.loader import SequenceLoader, history_length_order, table_batches, unsort
from lumos.data.sequences_version import SequencesVersion
from lumos.eval import metrics as M
from lumos.eval.probe import run_probe
from lumos.eval.tasks import LoadedTask, TaskSpec
from lumos.train import retrieval_metrics
from lumos.train.model import LumosModel, signed_expm1


@dataclass(frozen=True)
class Scores:
    metrics: dict[str, float]
    rows: int
    """Rows of the split that were scored."""


def score_model(model: LumosModel, task: LoadedTask, data: SequencesVersion,
                embeddings: EmbeddingCache | None = None) -> Scores:
    """`embeddings`: user embeddings already computed for this model, reused by probe tasks on the
    same data version and split (`lumos eval --all` shares one across its tasks)."""
    spec = task.spec
    _check_compatible(model, spec, data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # full-corpus ranking is (B, V) work
    model = model.to(device).eval()
    if spec.kind == "embedding_probe":
        return _score_probe(model, task, data, device, embeddings if embeddings is not None else EmbeddingCache())
    ranks, labels, predictions = [], [], []
    horizon = _horizon_index(spec, data)
    with torch.no_grad():
        for batch in _loader(data, spec):
            batch = batch.to(device)
            output = model(batch)
            if spec.kind == "retrieval":
                history = model.history_items(batch)
                scores = model.score_items(batch, output)
                ranks.append(retrieval_metrics.target_ranks(scores, batch.next_item, history, spec.exclude_history).cpu())
            elif spec.kind == "binary":
                labels.append(batch.act[:, horizon].cpu().numpy())
                predictions.append(torch.sigmoid(output.act_logits[:, horizon]).cpu().numpy())
            else:
                labels.append(batch.value[:, horizon].cpu().numpy())
                predictions.append(signed_expm1(output.value_pred[:, horizon]).cpu().numpy())
    return _metrics(spec, ranks, labels, predictions)


def score_baseline(task: LoadedTask, data: SequencesVersion) -> tuple[str, Scores]:
    """The "no model" entry of a task's leaderboard: (baseline name, scores)."""
    spec = task.spec
    horizon = _horizon_index(spec, data)
    ranks, labels, predictions = [], [], []
    if spec.kind == "retrieval":
        popularity = -np.arange(data.spec.item_vocab_size)  # ids go by descending count: id 2 is the most frequent
        for batch in _loader(data, spec):
            history = batch.history_items(data.spec.item_feature)
            scores = retrieval_metrics.popularity_scores(popularity, batch.size)
            ranks.append(retrieval_metrics.target_ranks(scores, batch.next_item, history, spec.exclude_history))
        return "popularity", _metrics(spec, ranks, labels, predictions)
    if spec.kind in ("binary", "regression"):
        train = _loader(data, spec, split="train")
        field = "act" if spec.kind == "binary" else "value"
        prior = float(np.mean(np.concatenate([getattr(batch, field)[:, horizon].numpy() for batch in train])))
        for batch in _loader(data, spec):
            labels.append(getattr(batch, field)[:, horizon].numpy())
            predictions.append(M.prior_rate_probabilities(prior, batch.size) if spec.kind == "binary"
                               else np.full(batch.size, prior))
        return ("prior_rate" if spec.kind == "binary" else "train_mean"), _metrics(spec, ranks, labels, predictions)
    raise UsageError(f"task {spec.name}: embedding probes have no baseline")


def _metrics(spec: TaskSpec, ranks, labels, predictions) -> Scores:
    if spec.kind == "retrieval":
        all_ranks = torch.cat(ranks) if ranks else torch.empty(0)
        values = retrieval_metrics.retrieval_metrics(all_ranks, ks=spec.ks)
        rows = int(values.pop("scored_rows", len(all_ranks)))
    else:
        y, p = np.concatenate(labels), np.concatenate(predictions)
        values = M.binary_metrics(y, p, spec.decision_threshold) if spec.kind == "binary" else M.regression_metrics(y, p)
        rows = len(y)
    return Scores({name: float(values[name]) for name in spec.metric_names if name in values}, rows)


@dataclass(frozen=True)
class UserEmbeddings:
    """A split's user embeddings (N, C) with the (user_id, as_of) of each row, in loader order."""

    matrix: np.ndarray
    users: list[str]
    as_of: list


class EmbeddingCache:
    """User embeddings of one model by (data version, split, batch size): a probe task reads the
    embeddings another task on the same rows already computed, instead of running the model again."""

    def __init__(self) -> None:
        self._computed: dict[tuple[str, str, int], UserEmbeddings] = {}

    def get(self, model: LumosModel, data: SequencesVersion, spec: TaskSpec, device: torch.device) -> UserEmbeddings:
        key = (str(data.ref), spec.split, spec.batch_size)
        if key not in self._computed:
            # One read: each embedding comes from the row that names its user, so nothing rests on
            # two reads returning rows in the same order.
            rows = split_rows(data, spec.split)
            # Batched shortest history first (a batch is padded to its longest), then put back
            # in the rows' order, so the probes see exactly what they saw before.
            order = history_length_order(rows, data.spec)
            matrix = []
            with torch.no_grad():
                for batch in table_batches(rows.take(order), data.spec, spec.batch_size,
                                           f"split {spec.split} of {data.ref}"):
                    matrix.append(model.embed_users(batch.to(device)).cpu().numpy())
            self._computed[key] = UserEmbeddings(unsort(np.concatenate(matrix), order), rows["user_id"].to_pylist(),
                                                 rows["as_of"].to_pylist())
        return self._computed[key]


def _score_probe(model: LumosModel, task: LoadedTask, data: SequencesVersion, device: torch.device,
                 embeddings: EmbeddingCache) -> Scores:
    spec, labels_spec = task.spec, task.spec.labels
    computed = embeddings.get(model, data, spec, device)
    users, as_of = computed.users, computed.as_of
    table = _read_labels(task.path.parent, labels_spec.path, [labels_spec.user_id, labels_spec.label])
    label_of = dict(zip(map(str, table[labels_spec.user_id].to_pylist()), table[labels_spec.label].to_pylist(), strict=True))
    # One embedding per user: the split's latest row (largest as_of) when a user has several.
    latest: dict[str, int] = {}
    for index, user in enumerate(users):
        if user not in latest or as_of[index] > as_of[latest[user]]:
            latest[user] = index
    chosen = sorted(index for user, index in latest.items() if label_of.get(user) is not None)
    if not chosen:
        raise UsageError(f"task {spec.name}: no user of split {spec.split!r} has a label in {labels_spec.path}")
    matrix = computed.matrix[chosen]
    result = run_probe(matrix, [label_of[users[i]] for i in chosen], [users[i] for i in chosen], labels_spec.probe,
                       test_fraction=labels_spec.test_fraction, seed=labels_spec.seed)
    return Scores({name: float(value) for name, value in result.metrics.items()}, result.test_users)


def split_rows(data: SequencesVersion, split: str):
    """Every column of a split's rows, as one Arrow table."""
    table = pq.read_table([data_file.path for data_file in data.snapshot.files])
    return table.filter(pc.equal(table["split"], split))


def _read_labels(base: Path, location: str, columns: list[str]):
    path = (base / location).resolve()
    if not path.exists():
        raise UsageError(f"labels.path = {location!r}: {path} does not exist")
    if path.suffix == ".csv":
        import pyarrow.csv as pacsv

        table = pacsv.read_csv(path)
    else:
        table = pq.read_table(path)
    missing = [name for name in columns if name not in table.column_names]
    if missing:
        raise UsageError(f"{path}: no column {', '.join(missing)}; it has {', '.join(table.column_names)}")
    return table.select(columns)


def _loader(data: SequencesVersion, spec: TaskSpec, split: str | None = None) -> SequenceLoader:
    # Every row is scored and the metrics do not depend on row order, so batches go by history
    # length: a batch is padded to its longest.
    return SequenceLoader(data.snapshot, data.spec, spec.batch_size, split=split or spec.split, shuffle=False,
                          by_length=True)


def _horizon_index(spec: TaskSpec, data: SequencesVersion) -> int:
    if spec.kind not in ("binary", "regression"):
        return 0
    if spec.horizon_days not in data.spec.horizons_days:
        raise UsageError(f"task {spec.name}: {data.ref} has no {spec.horizon_days}-day horizon "
                         f"(it has {', '.join(map(str, data.spec.horizons_days)) or 'none'})")
    return data.spec.horizons_days.index(spec.horizon_days)


def _check_compatible(model: LumosModel, spec: TaskSpec, data: SequencesVersion) -> None:
    if model.features.token_categorical != data.spec.token_categorical:
        raise UsageError(f"task {spec.name}: the model was trained on other vocabularies than {data.ref}; "
                         "evaluate it on the sequences version it was trained on (set the task's data)")
    needs = {"retrieval": "retrieval", "binary": "binary", "regression": "regression"}.get(spec.kind)
    if needs and needs not in model.config.heads:
        raise UsageError(f"task {spec.name}: the model has no {needs} head")
