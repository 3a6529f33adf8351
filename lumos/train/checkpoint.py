"""Checkpoints: everything needed to rebuild the model, and to resume training exactly, without pickle.

A checkpoint is a folder. Its files are written into a uniquely named hidden sibling
(`.best-1a2b3c4d`) and the checkpoint's name is a symbolic link to it, put in place by one rename:
replacing a checkpoint (the run's "best") swaps the link, so at every instant the name opens a whole
checkpoint, the old one or the new one, even when the process is killed mid-replace.

    model.safetensors   the weights
    config.toml         the resolved TrainConfig (the model rebuilds from this and features.json)
    features.json       the FeatureSpec of the data it was trained on
    state.pt            optimizer, scheduler, loader position, step and RNG states; tensors and
                        plain containers only, read back with torch.load(weights_only=True)
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from lumos.core.config import from_dict, read_toml, to_toml
from lumos.core.disk import writing_to
from lumos.core.errors import LumosError, UsageError
from lumos.core.faults import fault_point
from lumos.data.contract import FeatureSpec
from lumos.train.config import TrainConfig
from lumos.train.model import LumosModel

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.toml"
FEATURES_FILE = "features.json"
STATE_FILE = "state.pt"
MODEL_FILES = (MODEL_FILE, CONFIG_FILE, FEATURES_FILE)
"""The files `load_model` rebuilds the model from."""


@dataclass
class TrainingState:
    step: int
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    loader: dict[str, Any]
    rng: list[dict[str, Any]]
    """RNG states by rank, so that every rank resumes its own dropout and sampling stream."""
    best: dict[str, Any] | None = None
    """The best-evaluation tracker (value, step, checkpoint, evaluations since), so that a resumed
    run keeps its best and its patience; None in checkpoints written before it was kept."""


def save_checkpoint(folder: Path, model: LumosModel, config: TrainConfig, state: TrainingState) -> Path:
    """Write checkpoint `folder` (a link to its files, see above); an existing one is replaced."""
    folder = Path(folder)
    tag = uuid.uuid4().hex[:8]
    files = folder.with_name(f".{folder.name}-{tag}")
    link = folder.with_name(f".{folder.name}.link-{tag}")
    staging = folder.with_name(f".{folder.name}.tmp-{tag}")
    try:
        with writing_to(str(folder)):  # a full disk: the name still opens the previous checkpoint, if any
            staging.mkdir(parents=True)
            save_model(staging, model, config)
            torch.save(dataclasses.asdict(state), staging / STATE_FILE)
        os.replace(staging, files)
        os.symlink(files.name, link)  # relative: the run's folder may move
        if folder.exists() or folder.is_symlink():
            fault_point("checkpoint.replace")
        if folder.is_dir() and not folder.is_symlink():
            # A checkpoint written before links were used: a real folder cannot be swapped in one rename.
            os.replace(folder, folder.with_name(f".{folder.name}-old-{tag}"))
        os.replace(link, folder)  # atomic: the name opens the old checkpoint, then the new one
    finally:
        link.unlink(missing_ok=True)
        if staging.exists():
            shutil.rmtree(staging)
    _remove_unlinked(folder)
    return folder


def _remove_unlinked(folder: Path) -> None:
    """Delete the hidden file folders of `folder` that its link no longer points at (the replaced
    checkpoint, or leftovers of a process killed mid-write)."""
    current = os.readlink(folder)
    for candidate in folder.parent.glob(f".{glob.escape(folder.name)}-*"):
        if candidate.name != current:
            shutil.rmtree(candidate, ignore_errors=True)


def save_model(folder: Path, model: LumosModel, config: TrainConfig) -> None:
    """The rebuildable part of a checkpoint: weights, config and feature spec."""
    weights = {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()}
    save_file(weights, str(folder / MODEL_FILE))
    (folder / CONFIG_FILE).write_text(to_toml(config), encoding="utf-8")
    (folder / FEATURES_FILE).write_text(json.dumps(dataclasses.asdict(model.features), indent=2), encoding="utf-8")


class CorruptCheckpoint(LumosError):
    """A checkpoint file is truncated or garbled: the model cannot be rebuilt from it."""


def load_model(
    folder: Path, map_location: str | torch.device = "cpu", source: str | None = None
) -> tuple[LumosModel, TrainConfig]:
    """Rebuild a model from a checkpoint folder alone.

    `source` names where the folder came from when it is a temporary download, so that an error
    names the stored file rather than a copy that is gone by the time the user reads it.
    """
    folder = Path(folder)
    where = (source or str(folder)).rstrip("/")
    missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"{where} is not a Lumos checkpoint: missing {', '.join(missing)}")
    config = from_dict(TrainConfig, read_toml(folder / CONFIG_FILE), source=f"{where}/{CONFIG_FILE}")
    try:
        features = load_features(folder / FEATURES_FILE)
    except (ValueError, TypeError) as error:
        raise CorruptCheckpoint(_corrupt(f"{where}/{FEATURES_FILE}", error)) from error
    model = LumosModel(config.model, features)
    try:
        # safetensors checks the header and the file's length, not the bytes of the tensors: a
        # truncated or garbled file fails here, and weights of another shape fail in load_state_dict.
        model.load_state_dict(load_file(str(folder / MODEL_FILE), device=str(map_location)))
    except (SafetensorError, RuntimeError) as error:
        raise CorruptCheckpoint(_corrupt(f"{where}/{MODEL_FILE}", error)) from error
    return model, config


def _corrupt(path: str, error: Exception) -> str:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (f"{path} cannot be read: it is truncated or corrupt ({reason}). "
            f"Restore it from a copy, or retrain and promote another run")


def read_model_files(folder: Path) -> dict[str, bytes]:
    """File name → bytes of the checkpoint's MODEL_FILES: the model, in memory, to ship elsewhere."""
    return {name: (Path(folder) / name).read_bytes() for name in MODEL_FILES}


def load_features(path: Path) -> FeatureSpec:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    tuples = {"token_numeric", "static_numeric", "future_flags", "horizons_days"}
    return FeatureSpec(**{key: tuple(value) if key in tuples else value for key, value in data.items()})


def load_training_state(folder: Path) -> TrainingState:
    raw = torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)
    return TrainingState(**raw)


def capture_rng() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
