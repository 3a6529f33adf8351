"""A trained model, found by name and loaded in one call.

Verbs name a model as NAME@alias or NAME/VERSION (`lumos infer`, and `--model` elsewhere) or as
its training run (`--run RUN_ID`). Either way they want the same few facts: the registered version,
the training run, the data version it learned from, and the model rebuilt from its checkpoint.
Finding them took four calls (registry → run → download → load); here it is one.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumos.core.registry import ModelVersionInfo
from lumos.core.runs import DATA_TAG, download_run_checkpoint, resolve_run, stored_checkpoint
from lumos.core.tables import TableRef
from lumos.core.workspace import Workspace
from lumos.data.contract import FeatureSpec
from lumos.train.checkpoint import load_model, read_model_files
from lumos.train.model import LumosModel


@dataclass(frozen=True)
class TrainedModel:
    version: ModelVersionInfo | None
    """The registered version, when the model was named by one; None for a run named directly."""
    run: Any
    """The MLflow training run, checked to be a Lumos training run with a checkpoint."""
    training_data: TableRef
    """The sequences table version the run trained on, e.g. quickstart.sequences@0."""
    checkpoint: dict[str, bytes]
    """The checkpoint's model files by name (weights, config, feature spec), read into memory.
    The download is deleted once read, so no caller has a temporary folder to clean up, and a
    caller that ships the model elsewhere (Spark's workers) sends these bytes."""
    model: LumosModel
    """Rebuilt from the checkpoint, on the CPU. Every caller wants it, and loading it here keeps
    the download's lifetime inside this module."""

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    @property
    def features(self) -> FeatureSpec:
        """The feature spec of the data the model trained on."""
        return self.model.features


def load_registered_model(workspace: Workspace, ref: str) -> TrainedModel:
    """The model behind `NAME@alias` or `NAME/VERSION` (what `--model` names)."""
    return _load(workspace, run_id=None, model=ref)


def load_training_run(workspace: Workspace, run_id: str) -> TrainedModel:
    """The model of training run `run_id` (its latest checkpoint), registered or not."""
    return _load(workspace, run_id=run_id, model=None)


def _load(workspace: Workspace, run_id: str | None, model: str | None) -> TrainedModel:
    found = resolve_run(workspace, run_id, model)
    with tempfile.TemporaryDirectory(prefix="lumos-checkpoint-") as download:
        folder = download_run_checkpoint(workspace, found.run, Path(download))
        loaded, _ = load_model(folder, source=stored_checkpoint(found.run))
        checkpoint = read_model_files(folder)
    return TrainedModel(found.version, found.run, TableRef.parse(found.run.data.tags[DATA_TAG]), checkpoint, loaded)
