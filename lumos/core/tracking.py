"""MLflow helpers: the workspace's tracking store, experiments with workspace artifact roots, params."""

from __future__ import annotations

import os
from typing import Any

from lumos.core.workspace import Workspace

# MLflow phones home unless told not to; Lumos runs on clusters and in CI where that is unwanted.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# MLflow logs its database migrations at INFO on first use of a store; users need only warnings.
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")


def tracking_client(workspace: Workspace):
    """An MlflowClient on the workspace's store (SQLite in the workspace unless configured)."""
    import mlflow

    workspace.ensure_root()
    mlflow.set_tracking_uri(workspace.mlflow_tracking_uri)
    return mlflow.MlflowClient(tracking_uri=workspace.mlflow_tracking_uri)


def ensure_experiment(client, workspace: Workspace, name: str) -> str:
    """The id of experiment `name`, created with its artifacts under the workspace when new."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    safe = "".join(char if char.isalnum() or char in "-_" else "_" for char in name)
    return client.create_experiment(name, artifact_location=f"{workspace.mlflow_artifact_root}/{safe}")


def flatten_params(plain: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"}: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in plain.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = str(value)[:6000]  # MLflow's limit on a param value
    return flat
