"""Walk one prediction back: row → infer commit → model version → training run → config → data
version → the recipe and source versions that made that data."""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from typing import Any

from lumos.core.errors import UsageError
from lumos.core.registry import resolve_model
from lumos.core.runs import CODE_VERSION_TAG, CONFIG_HASH_TAG, DATA_TAG, RECIPE_HASH_TAG, SEED_TAG, training_run
from lumos.core.tables import TableRef, table_location
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace
from lumos.data.delta_snapshot import DeltaSnapshot, open_snapshot
from lumos.data.table_metadata import resolve, table_history, version_lineage
from lumos.infer.predictions import PARTITION


def trace_prediction(workspace: Workspace, table: TableRef, user_id: str, as_of: datetime.date) -> dict[str, Any]:
    """Everything that made one prediction row, read from Delta logs, Parquet footers and MLflow
    (no Spark: delta-rs reads the row from the files of its partition)."""
    table = resolve(workspace, table)
    model = _predicted_by(open_snapshot(table_location(workspace, table), table.version), user_id, as_of)
    if model is None:
        raise UsageError(f"{table} has no prediction for user {user_id!r} as of {as_of}")
    commit = _partition_commit(workspace, table, as_of)
    version = resolve_model(workspace, model, "model")
    run = training_run(workspace, version.run_id, "model")
    config = json.loads(_run_text(workspace, run.info.run_id, "lineage.json"))["config"]
    data = TableRef.parse(run.data.tags[DATA_TAG])
    data_lineage = version_lineage(workspace, data)
    return {
        "prediction": {"table": str(table), "user_id": user_id, "as_of": as_of.isoformat(),
                       "commit": {"version": commit[0], **commit[1]}},
        "model": {"version": version.label, "aliases": list(version.aliases), "tags": version.tags},
        "run": {"id": run.info.run_id, "name": run.info.run_name, "config_hash": run.data.tags.get(CONFIG_HASH_TAG),
                "code_version": run.data.tags.get(CODE_VERSION_TAG), "seed": run.data.tags.get(SEED_TAG),
                "config": config},
        "data": {"table": str(data), "recipe_hash": run.data.tags.get(RECIPE_HASH_TAG),
                 "recipe": data_lineage.config if data_lineage else None,
                 "inputs": [asdict(item) for item in data_lineage.inputs] if data_lineage else [],
                 "stats": data_lineage.stats if data_lineage else {}},
    }


def _predicted_by(version: DeltaSnapshot, user_id: str, as_of: datetime.date) -> str | None:
    """The model named on `user_id`'s row in partition `as_of` of `version`; None without one."""
    # pyarrow.parquet file by file, not pyarrow.dataset: that imports pandas, half a second.
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # Partition values live in the log, not in the files: pick the partition's files there.
    for data_file in version.files:
        if data_file.partition_values.get(PARTITION) == as_of:
            rows = pq.ParquetFile(data_file.path).read(columns=["user_id", "model"])
            models = rows.filter(pc.equal(rows["user_id"], user_id))["model"]
            if len(models):
                return models[0].as_py()
    return None


def _partition_commit(workspace: Workspace, table: TableRef, as_of: datetime.date) -> tuple[int, dict[str, Any]]:
    """The newest commit at or before `table`'s version that wrote partition `as_of`."""
    for entry in table_history(workspace, table):
        lineage = entry.lineage
        if entry.version <= table.version and lineage and lineage.stage == "infer" and lineage.config.get("as_of") == as_of.isoformat():
            return entry.version, {**lineage.config, "inputs": [asdict(item) for item in lineage.inputs],
                                   "stats": lineage.stats, "created_at": lineage.created_at}
    raise UsageError(f"{table}: no lumos infer commit wrote as_of = {as_of}")


def _run_text(workspace: Workspace, run_id: str, path: str) -> str:
    import mlflow

    tracking_client(workspace)  # points mlflow at the workspace's store
    return mlflow.artifacts.load_text(f"runs:/{run_id}/{path}")
