"""MLflow helpers: the workspace's tracking store, experiments with workspace artifact roots, params,
and the tags MLflow's own UI reads (source, commit, user, description)."""

from __future__ import annotations

import getpass
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
    _create_local_store(workspace)
    mlflow.set_tracking_uri(workspace.mlflow_tracking_uri)
    return mlflow.MlflowClient(tracking_uri=workspace.mlflow_tracking_uri)


def _create_local_store(workspace: Workspace) -> None:
    """Create a new SQLite store with the workspace's artifact root: MLflow would otherwise give the
    `Default` experiment it creates with the store an `mlruns/0` under the current directory."""
    uri = workspace.mlflow_tracking_uri
    if not uri.startswith("sqlite:///") or os.path.exists(uri.removeprefix("sqlite:///")):
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(uri, workspace.mlflow_artifact_root).engine.dispose()


def locked_store_message(error: BaseException) -> str | None:
    """What to tell the user when `error` is the SQLite tracking store still locked by another
    writer once MLflow stopped waiting (it sets SQLite's busy timeout, up to 20 s, during which SQLite
    retries); None for other errors."""
    if "database is locked" not in str(error):
        return None
    import mlflow

    return (f"the MLflow store {mlflow.get_tracking_uri()} stayed locked by another writer longer than MLflow "
            f"waits (a sweep or training run writing to it, or a tool holding it open); this "
            f"command stopped there. Rerun it once that writer is done; for many parallel writers, set "
            f"[mlflow] tracking_uri in lumos.toml to an MLflow server")


def ensure_experiment(client, workspace: Workspace, name: str, description: str | None = None) -> str:
    """The id of experiment `name`, created with its artifacts under the workspace when new;
    `description` (Markdown) is what MLflow's UI shows at the top of the experiment."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if description and experiment.tags.get(NOTE_TAG) != description:
            client.set_experiment_tag(experiment.experiment_id, NOTE_TAG, description)
        return experiment.experiment_id
    safe = "".join(char if char.isalnum() or char in "-_" else "_" for char in name)
    # Tells MLflow's UI these are model-training experiments (its runs table), not GenAI (traces).
    tags = {EXPERIMENT_KIND_TAG: "custom_model_development"} | ({NOTE_TAG: description} if description else {})
    return client.create_experiment(name, artifact_location=f"{workspace.mlflow_artifact_root}/{safe}", tags=tags)


# Tags MLflow's UI shows on a run page: Source, Git commit, Created by and the Description box.
SOURCE_NAME_TAG = "mlflow.source.name"
SOURCE_TYPE_TAG = "mlflow.source.type"
GIT_COMMIT_TAG = "mlflow.source.git.commit"
USER_TAG = "mlflow.user"
NOTE_TAG = "mlflow.note.content"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"


def source_tags(command: str, code_version: str) -> dict[str, str]:
    """MLflow's standard source tags for a run made by `lumos <command>` from `code_version`
    (a git commit, with +dirty when the checkout had changes, or the package version)."""
    tags = {SOURCE_NAME_TAG: f"lumos {command}", SOURCE_TYPE_TAG: "LOCAL", USER_TAG: _user()}
    commit = code_version.removesuffix("+dirty")
    if len(commit) == 40 and all(char in "0123456789abcdef" for char in commit):
        tags[GIT_COMMIT_TAG] = commit
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for the uid, as in some containers
        return str(os.getuid())


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
