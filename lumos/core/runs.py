"""Lumos runs in MLflow: the tag names every stage agrees on, the "is this a training run" check,
the run behind `--run RUN_ID` or `--model NAME@alias`, and the run's checkpoint as a local folder.

Train writes these tags; eval, promote, infer, trace and compile read them. Keeping their names
here means a reader finds every place that depends on a tag by searching for its constant.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from lumos.core.errors import UsageError
from lumos.core.registry import ModelVersionInfo, resolve_model
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace

TRAIN_STAGE = "train"

# Tags on a training run: its stage and lineage (what data, recipe, config, code and seed made it).
STAGE_TAG = "lumos.stage"
DATA_TAG = "lumos.data"
"""The sequences table version trained on, e.g. quickstart.sequences@0."""
DATA_VERSION_TAG = "lumos.data.version"
CONFIG_HASH_TAG = "lumos.config_hash"
RECIPE_HASH_TAG = "lumos.recipe_hash"
CODE_VERSION_TAG = "lumos.code_version"
SEED_TAG = "lumos.seed"
CHECKPOINT_TAG = "lumos.checkpoint"
"""The artifact path of the run's latest checkpoint; set only once one is saved."""
STEP_TAG = "lumos.step"
"""The step of that checkpoint."""
MODEL_URI_TAG = "lumos.model_uri"
"""models:/<model id>: the final checkpoint logged as an MLflow model (what promote registers)."""
INIT_RUN_TAG = "lumos.init_from.run"
"""The parent training run whose weights this run started from (train.init_from)."""
INIT_DATA_TAG = "lumos.init_from.data"
"""The sequences version the parent trained on, e.g. quickstart.sequences@0."""
INIT_CHECKPOINT_TAG = "lumos.init_from.checkpoint"
"""The parent's checkpoint artifact path the weights were read from."""
INIT_MODEL_TAG = "lumos.init_from.model"
"""NAME/VERSION, when the parent was named by a registered version."""
COMPILE_TAG_PREFIX = "lumos.compile."
"""lumos.compile.<target>: a verified compiled plan is stored on the run for that target."""

# Tags on a model version: the training run's lineage (copied) and the run it was made from.
LINEAGE_TAGS = (DATA_TAG, DATA_VERSION_TAG, CONFIG_HASH_TAG, RECIPE_HASH_TAG, CODE_VERSION_TAG, SEED_TAG, CHECKPOINT_TAG,
                INIT_RUN_TAG, INIT_DATA_TAG)
RUN_TAG = "lumos.run"

# Tags on leaderboard entries (lumos.eval.task, .subject, .primary_metric, ...) and, on a model
# version, its eval scores (lumos.eval.<task>.<metric>).
EVAL_TAG_PREFIX = "lumos.eval."


def training_run_problem(run, finished: bool = False) -> str | None:
    """Why `run` is not a Lumos training run with a checkpoint (and, with `finished`, one that
    finished), or None when it is one."""
    tags = run.data.tags
    if tags.get(STAGE_TAG) != TRAIN_STAGE or CHECKPOINT_TAG not in tags:
        return "not a Lumos training run with a checkpoint"
    if finished and run.info.status != "FINISHED":
        return f"{run.info.status}, not FINISHED"
    return None


def get_run(workspace: Workspace, run_id: str, flag: str):
    """The MLflow run `run_id`; exit 2 naming `flag` when the store has none."""
    import mlflow

    try:
        return tracking_client(workspace).get_run(run_id)
    except mlflow.exceptions.MlflowException:
        raise UsageError(f"{flag} {run_id}: no such run in {workspace.mlflow_tracking_uri}") from None


def training_run(workspace: Workspace, run_id: str, flag: str):
    """The MLflow run `run_id`, checked to be a Lumos training run with a checkpoint."""
    run = get_run(workspace, run_id, flag)
    problem = training_run_problem(run)
    if problem:
        raise UsageError(f"{flag} {run_id}: {problem}")
    return run


@dataclass(frozen=True)
class RunSubject:
    """What a verb was asked to work on: a training run, named directly or through a model version."""

    run: object
    """The MLflow run, checked to be a Lumos training run with a checkpoint."""
    version: ModelVersionInfo | None = None
    """The registered model version, when one was named."""

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def label(self) -> str:
        """The version (NAME/VERSION) when one was named, else the run's name."""
        return self.version.label if self.version else self.run.info.run_name or self.run_id


def resolve_run(workspace: Workspace, run_id: str | None, model: str | None) -> RunSubject:
    """The training run behind --run RUN_ID or --model NAME@alias (or NAME/VERSION)."""
    version = None
    if model is not None:
        version = resolve_model(workspace, model, "--model")
        run_id = version.run_id
    if run_id is None:
        raise UsageError("name a training run: --run RUN_ID or --model NAME@alias")
    return RunSubject(run=training_run(workspace, run_id, "--model" if model is not None else "--run"), version=version)


def init_chain(workspace: Workspace, run) -> list[dict]:
    """The runs `run` started from (train.init_from): its parent first, then the parent's parent.
    Each is {run, name, data, checkpoint, model, exists}; `exists` is False for a run no longer in
    the store (deleted), where the chain stops, since its own parent is unknown."""
    import mlflow

    client = tracking_client(workspace)
    chain: list[dict] = []
    seen = {run.info.run_id}
    tags = run.data.tags
    while INIT_RUN_TAG in tags and tags[INIT_RUN_TAG] not in seen:  # `seen`: a hand-edited tag cannot loop
        parent_id = tags[INIT_RUN_TAG]
        seen.add(parent_id)
        entry = {"run": parent_id, "name": None, "data": tags.get(INIT_DATA_TAG),
                 "checkpoint": tags.get(INIT_CHECKPOINT_TAG), "model": tags.get(INIT_MODEL_TAG), "exists": False}
        chain.append(entry)
        try:
            parent = client.get_run(parent_id)
        except mlflow.exceptions.MlflowException:
            break
        if parent.info.lifecycle_stage != "active":
            break
        entry.update(name=parent.info.run_name, exists=True)
        tags = parent.data.tags
    return chain


def delta_dataset_input(table, location: str, context: str):
    """An MLflow dataset input for Delta table version `table` (a TableRef with its version) at
    `location`, used in `context` (train, eval): MLflow's UI lists it under the run's Datasets,
    with the Delta version as its digest."""
    from mlflow.data.delta_dataset_source import DeltaDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    source = DeltaDatasetSource(path=location, delta_table_version=table.version)
    dataset = MetaDataset(source, name=table.name, digest=str(table.version))
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(DATASET_CONTEXT_TAG, context)])


DATASET_CONTEXT_TAG = "mlflow.data.context"


def download_checkpoint(workspace: Workspace, run_id: str, flag: str) -> Path:
    """A local copy of the run's latest checkpoint folder, inside a new temporary folder."""
    run = training_run(workspace, run_id, flag)
    return download_run_checkpoint(workspace, run, Path(tempfile.mkdtemp(prefix="lumos-checkpoint-")))


def stored_checkpoint(run) -> str:
    """Where the latest checkpoint of `run` is stored (its artifact URI), for messages."""
    return f"{run.info.artifact_uri.rstrip('/')}/{run.data.tags[CHECKPOINT_TAG]}"


def download_run_checkpoint(workspace: Workspace, run, into: Path) -> Path:
    """The latest checkpoint of `run` (a run `training_run` returned), downloaded into folder `into`."""
    import mlflow

    folder = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=run.data.tags[CHECKPOINT_TAG],
                                                 dst_path=str(into), tracking_uri=workspace.mlflow_tracking_uri)
    return Path(folder)
