"""Scoring inside Spark: each Python worker loads the model once and scores Arrow batches.

The driver packs the checkpoint's three files (weights, config, feature spec) and the item tokens
into one broadcast, so executors on any cluster need no access to the MLflow store. `mapInArrow`
hands each task its users' tokens as Arrow record batches; `build_and_score` builds their rows
(`lumos.data.time_rows`), the loader's vectorized Arrow → Batch code builds the model's tensors,
and results go back as Arrow with one row per user.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from lumos.data.contract import Batch, FeatureSpec
from lumos.data.time_rows import TimeRowsPlan, build_rows
from lumos.train.checkpoint import load_model
from lumos.train.model import LumosModel, signed_expm1

ENGINES = ("torch", "compiled")


@dataclass(frozen=True)
class ScoringJob:
    """Everything an executor needs to score, shipped once per job as a Spark broadcast."""

    model_key: str
    """The model version (name/version), written to every row."""
    run_id: str
    """The training run behind it: workers cache one loaded model per run. Not the version label,
    which two workspaces scored in one Spark application (or a re-created registry) can share."""
    checkpoint: dict[str, bytes]
    """File name → bytes of the checkpoint's model.safetensors, config.toml and features.json."""
    item_tokens: tuple[str, ...]
    """Item token of each vocabulary id (padding and OOV included), for readable top-k output."""
    as_of: object
    """The as-of date (datetime.date) written to every row."""
    top_k: int
    exclude_history: bool
    batch_size: int
    torch_threads: int
    """Threads per task: Spark already runs one task per core, so more threads oversubscribe."""
    compiled: object | None = None
    """(workspace, run_id) when the compiled engine is used; each worker loads the stored plan."""
    rows_per_sort: int = 10_000
    """Built rows gathered before they are sorted by history length and cut into batches (Spark's
    Arrow batch size, which set it when the rows came from the JVM)."""


def output_schema(features: FeatureSpec, has_retrieval: bool, has_binary: bool, has_regression: bool) -> pa.Schema:
    """One row per user: keys, the model, the user embedding, then one column per head's task."""
    fields = [
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("as_of", pa.date32(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("user_embedding", pa.list_(pa.float32()), nullable=False),
    ]
    if has_retrieval:
        fields += [pa.field("top_items", pa.list_(pa.string())), pa.field("top_scores", pa.list_(pa.float32()))]
    for days in features.horizons_days:
        if has_binary:
            fields.append(pa.field(f"p_act_{days}d", pa.float32()))
        if has_regression:
            fields.append(pa.field(f"value_{days}d", pa.float32()))
    return pa.schema(fields)


def schema_for(model: LumosModel) -> pa.Schema:
    heads = model.config.heads
    return output_schema(model.features, "retrieval" in heads, "binary" in heads, "regression" in heads)


# The loaded model of a Python worker (Spark reuses workers across tasks), keyed by the training
# run and the engine, so a compiled job never reuses a torch-only load or the other way round.
_LOADED: dict[tuple[str, bool], tuple[LumosModel, object | None]] = {}


def _load(job: ScoringJob) -> tuple[LumosModel, object | None]:
    key = (job.run_id, job.compiled is not None)
    if key not in _LOADED:
        with tempfile.TemporaryDirectory(prefix="lumos-infer-") as folder:
            for name, content in job.checkpoint.items():
                (Path(folder) / name).write_bytes(content)
            model, _ = load_model(Path(folder))
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = model.to(device).eval()
        compiled = None
        if job.compiled is not None:
            from lumos.compile.engine import load_compiled

            workspace, run_id = job.compiled
            compiled = load_compiled(workspace, run_id, model)
        _LOADED.clear()  # one model per worker: a new job's model replaces the last one
        _LOADED[key] = (model, compiled)
    return _LOADED[key]


def score_arrow(job: ScoringJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Sequences rows in (Arrow batches, each sorted by history length before it is cut into
    batches of `job.batch_size`), prediction rows out."""
    from lumos.data.loader import by_history_length, table_batches

    torch.set_num_threads(job.torch_threads)
    model, compiled = _load(job)
    schema = schema_for(model)
    device = next(model.parameters()).device
    item_tokens = np.asarray(job.item_tokens, dtype=object)
    for record_batch in batches:
        table = by_history_length(pa.Table.from_batches([record_batch]), model.features)
        users = table.column("user_id").to_pylist()
        start = 0
        for batch in table_batches(table, model.features, job.batch_size, "inference rows"):
            columns = score_batch(model, compiled, batch.to(device), job.top_k, job.exclude_history)
            rows = batch.size
            columns = {
                "user_id": users[start:start + rows],
                "as_of": [job.as_of] * rows,
                "model": [job.model_key] * rows,
                **columns,
            }
            if "top_ids" in columns:
                columns["top_items"], columns["top_scores"] = _recommendable(
                    item_tokens[columns.pop("top_ids")], columns["top_scores"])
            start += rows
            yield pa.RecordBatch.from_pydict(columns, schema=schema)


def score_tokens(spark, tokens, plan: TimeRowsPlan, future: dict[str, list[int]], job: ScoringJob, model: LumosModel):
    """The predictions frame: `tokens` (`time_rows_input`) built into rows and scored per partition
    by `build_and_score`, with `job` broadcast once; the rows never reach the JVM."""
    from pyspark.sql.pandas.types import from_arrow_schema

    broadcast = spark.sparkContext.broadcast(job)
    schema = from_arrow_schema(schema_for(model))
    return tokens.mapInArrow(lambda batches: build_and_score(broadcast.value, plan, future, batches), schema)


def build_and_score(job: ScoringJob, plan: TimeRowsPlan, future: dict[str, list[int]],
                    batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function of `lumos infer`: each partition's tokens (`time_rows_input`) are
    built into rows and scored in this one Python worker, so the rows never go back to the JVM.

    `future`: flag → its value on each decoder slot from the as-of date, the same for every row."""
    yield from score_arrow(job, _gathered(build_rows(plan, batches), future, job.rows_per_sort))


def _gathered(rows: Iterator[pa.RecordBatch], future: dict[str, list[int]], size: int) -> Iterator[pa.RecordBatch]:
    """The built rows in batches of at least `size` (the last one less), with future_<flag> added."""
    pending: list[pa.RecordBatch] = []
    for batch in rows:
        pending.append(batch)
        if sum(part.num_rows for part in pending) >= size:
            yield _with_future(pending, future)
            pending = []
    if pending:
        yield _with_future(pending, future)


def _with_future(batches: list[pa.RecordBatch], future: dict[str, list[int]]) -> pa.RecordBatch:
    table = pa.Table.from_batches(batches).combine_chunks()
    for flag, values in future.items():
        table = table.append_column(f"future_{flag}", pa.array([values] * table.num_rows, pa.list_(pa.int32())))
    return table.to_batches()[0]


def _recommendable(items: np.ndarray, scores: np.ndarray) -> tuple[list, list]:
    """Per-row lists without the -inf entries: when a user's history leaves fewer than k
    recommendable items, the top-k would otherwise pad with padding/OOV ids."""
    finite = np.isfinite(scores)  # (B, k)
    if finite.all():
        return list(items), list(scores)
    return [row[keep] for row, keep in zip(items, finite, strict=True)], [row[keep] for row, keep in zip(scores, finite, strict=True)]


@torch.no_grad()
def score_batch(model: LumosModel, compiled, batch: Batch, top_k: int, exclude_history: bool) -> dict[str, object]:
    """Column name → values for one batch (top_ids: (B, k) vocabulary ids of the best items)."""
    output = compiled(batch) if compiled is not None else model(batch)
    columns: dict[str, object] = {"user_embedding": list(output.user_embedding.float().cpu().numpy())}
    if output.item_query is not None:
        scores = model.score_items(batch, output)  # (B, V), padding and OOV at -inf
        if exclude_history:
            history = model.history_items(batch)  # (B, T)
            scores = scores.scatter(1, history, float("-inf"))
        k = min(top_k, scores.shape[1])
        top = torch.topk(scores, k, dim=1)
        columns["top_ids"] = top.indices.cpu().numpy()
        columns["top_scores"] = top.values.float().cpu().numpy()
    for index, days in enumerate(model.features.horizons_days):
        if output.act_logits is not None:
            columns[f"p_act_{days}d"] = torch.sigmoid(output.act_logits[:, index]).float().cpu().numpy()
        if output.value_pred is not None:
            columns[f"value_{days}d"] = signed_expm1(output.value_pred[:, index]).float().cpu().numpy()
    return columns
