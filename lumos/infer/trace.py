"""Walk one prediction back: row → infer commit → model version → training run → config → data
version → the recipe and source versions that made that data; and from the run, the runs it
started from (train.init_from), each with its data version.

The infer commit's lineage is the trace's source. Besides the model version, run id and data
version it holds a snapshot of what MLflow said about them when infer ran (`model_snapshot`: the
version's aliases and tags, the run's name, code version, seed and training config), so a trace
reads only Delta logs and Parquet footers and never imports MLflow, which alone takes 1.5-3 s.
MLflow is read instead for commits written before the snapshot was recorded, and when asked for
the registry as it is now (`live=True`): an alias moved, or eval tags added, since infer ran.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from typing import Any

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageRecord
from lumos.core.registry import ModelVersionInfo, resolve_model
from lumos.core.runs import (
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATA_TAG,
    RECIPE_HASH_TAG,
    SEED_TAG,
    init_chain,
    training_run,
)
from lumos.core.tables import TableRef, table_location
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace
from lumos.data.delta_snapshot import DeltaSnapshot, open_snapshot
from lumos.data.predictions import PARTITION
from lumos.data.table_metadata import resolve, table_history, version_lineage

MODEL_SNAPSHOT = "model_snapshot"
"""The key of `model_snapshot` in an infer commit's lineage stats."""


def trace_prediction(workspace: Workspace, table: TableRef, user_id: str, as_of: datetime.date,
                     live: bool = False) -> dict[str, Any]:
    """Everything that made one prediction row, read from Delta logs and Parquet footers (no Spark:
    delta-rs reads the row from the files of its partition). The model version and its run are
    as infer recorded them; with `live`, or when the commit predates that record, as MLflow has
    them now."""
    table = resolve(workspace, table)
    model = _predicted_by(open_snapshot(table_location(workspace, table), table.version), user_id, as_of)
    if model is None:
        raise UsageError(f"{table} has no prediction for user {user_id!r} as of {as_of}")
    version, lineage = _partition_commit(workspace, table, as_of)
    recorded = lineage.stats.get(MODEL_SNAPSHOT)
    if live or recorded is None or recorded["model"]["version"] != model:
        recorded = _live_snapshot(workspace, model)
    data = TableRef.parse(recorded["data"]["table"])
    data_lineage = version_lineage(workspace, data)
    stats = {key: value for key, value in lineage.stats.items() if key != MODEL_SNAPSHOT}  # printed as model and run
    return {
        "prediction": {"table": str(table), "user_id": user_id, "as_of": as_of.isoformat(),
                       "commit": {"version": version, **lineage.config, "inputs": [asdict(item) for item in lineage.inputs],
                                  "stats": stats, "created_at": lineage.created_at}},
        "model": recorded["model"],
        "run": recorded["run"],
        "data": {**recorded["data"],
                 "recipe": data_lineage.config if data_lineage else None,
                 "inputs": [asdict(item) for item in data_lineage.inputs] if data_lineage else [],
                 "stats": data_lineage.stats if data_lineage else {}},
    }


def model_snapshot(workspace: Workspace, version: ModelVersionInfo, run) -> dict[str, Any]:
    """What a trace shows of model `version` and its training `run` (an MLflow run), as MLflow has
    them now: infer records it in its commit's lineage, so the trace need not open MLflow."""
    tags = run.data.tags
    return {
        "model": {"version": version.label, "aliases": list(version.aliases), "tags": version.tags},
        "run": {"id": run.info.run_id, "name": run.info.run_name, "config_hash": tags.get(CONFIG_HASH_TAG),
                "code_version": tags.get(CODE_VERSION_TAG), "seed": tags.get(SEED_TAG),
                "config": json.loads(_run_text(workspace, run.info.run_id, "lineage.json"))["config"],
                "init_from": init_chain(workspace, run)},
        "data": {"table": tags[DATA_TAG], "recipe_hash": tags.get(RECIPE_HASH_TAG)},
    }


def _live_snapshot(workspace: Workspace, model: str) -> dict[str, Any]:
    """`model_snapshot` of model version `model` (NAME/VERSION), read from MLflow now."""
    version = resolve_model(workspace, model, "model")
    return model_snapshot(workspace, version, training_run(workspace, version.run_id, "model"))


def _predicted_by(version: DeltaSnapshot, user_id: str, as_of: datetime.date) -> str | None:
    """The model named on `user_id`'s row in partition `as_of` of `version`; None without one."""
    # pyarrow.parquet file by file, and the user found in a Python list: pyarrow.dataset and
    # pyarrow.compute's filters import pandas (with pyarrow.compute itself, 0.8 s of a 1 s trace).
    import pyarrow.parquet as pq

    # Partition values live in the log, not in the files: pick the partition's files there.
    for data_file in version.files:
        if data_file.partition_values.get(PARTITION) == as_of:
            rows = pq.ParquetFile(data_file.path).read(columns=["user_id", "model"])
            users = rows["user_id"].to_pylist()
            if user_id in users:
                return rows["model"][users.index(user_id)].as_py()
    return None


def _partition_commit(workspace: Workspace, table: TableRef, as_of: datetime.date) -> tuple[int, LineageRecord]:
    """The newest commit at or before `table`'s version that wrote partition `as_of`, with its lineage."""
    for entry in table_history(workspace, table):
        lineage = entry.lineage
        if entry.version <= table.version and lineage and lineage.stage == "infer" and lineage.config.get("as_of") == as_of.isoformat():
            return entry.version, lineage
    raise UsageError(f"{table}: no lumos infer commit wrote as_of = {as_of}")


def _run_text(workspace: Workspace, run_id: str, path: str) -> str:
    import mlflow

    tracking_client(workspace)  # points mlflow at the workspace's store
    return mlflow.artifacts.load_text(f"runs:/{run_id}/{path}")
