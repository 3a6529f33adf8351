"""`init_from` and `freeze`: start a run from a trained run's weights, and keep parts of them fixed.

The rules, decided once in the parent process (before any MLflow run is opened, so a refusal
leaves nothing behind) and applied by every rank before DDP wraps the model:

- **Parent**: a training run (RUN_ID) or a registered version (NAME@alias, NAME/VERSION); its
  latest checkpoint is read. The resolved config names the run id, so the logged config and
  `lumos reproduce` do not depend on where an alias points later.
- **Vocabularies**: every vocabulary that both the parent's training data and the child's have
  (item, event_type, cat_*, user_*) must number its tokens the same; otherwise exit 2 naming the
  feature. No remapping: an id is a row of an embedding table, and a different numbering would load
  each item's row onto another item. Vocabularies only the child has are new features.
- **Tensors**: a child tensor whose name the parent has with the same shape is loaded; one the parent
  lacks is new (initialised as usual, e.g. a binary head the parent did not train); the same name
  with another shape is an error (exit 2) naming every such tensor with both shapes. Parent tensors
  the child lacks are unused.
- **Freeze**: parameter-name prefixes, matched at a dot (`encoder` is `encoder.0.attn.query.weight`
  and the rest of the encoder blocks, not `encoder_ln`); those parameters keep requires_grad off and
  stay out of the optimizer. A prefix that names no parameter is an error (exit 2).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from lumos.core.config import to_plain
from lumos.core.errors import UsageError
from lumos.core.runs import CHECKPOINT_TAG
from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import Workspace
from lumos.data.delta_snapshot import open_snapshot
from lumos.data.sequences_version import ingest_lineage
from lumos.train.checkpoint import MODEL_FILE
from lumos.train.model import LumosModel
from lumos.train.trained_model import TrainedModel, load_registered_model, load_training_run


@dataclass(frozen=True)
class TensorMatch:
    """How the child's tensors relate to the parent's, by name."""

    loaded: list[str]
    """In both, same shape: the parent's values are loaded."""
    new: list[str]
    """Only in the child: initialised as usual."""
    unused: list[str]
    """Only in the parent: left out."""


@dataclass
class InitSummary:
    """What `init_from` did, for --json, the logs and the run's lineage."""

    run: str
    """The parent training run."""
    model: str | None
    """NAME/VERSION when the parent was named by a registered version."""
    data: str
    """The sequences version the parent trained on, e.g. quickstart.sequences@0."""
    checkpoint: str
    """The parent's checkpoint artifact path the weights came from."""
    loaded: int
    """How many tensors were loaded from the parent."""
    new: list[str] = field(default_factory=list)
    """The child's tensors the parent has not (initialised as usual)."""
    unused: list[str] = field(default_factory=list)
    """The parent's tensors the child has not."""


@dataclass(frozen=True)
class InitSource:
    """The parent, resolved and checked against the child; `weights_file` is what the ranks load."""

    summary: InitSummary
    weights_file: Path


def is_model_ref(ref: str) -> bool:
    """NAME@alias or NAME/VERSION (a registered version); a run id has neither character."""
    return "@" in ref or "/" in ref


def resolve_parent(workspace: Workspace, ref: str) -> TrainedModel:
    """The trained model `init_from` names: a run id, NAME@alias or NAME/VERSION."""
    if is_model_ref(ref):
        return load_registered_model(workspace, ref)
    return load_training_run(workspace, ref)


def prepare_init(workspace: Workspace, ref: str, child: LumosModel, child_data: TableRef) -> InitSource:
    """Resolve parent `ref`, check its vocabularies and tensors against `child` (exit 2 on a
    mismatch) and write its weights where the ranks read them (a new temporary folder)."""
    parent = resolve_parent(workspace, ref)
    problems = vocabulary_mismatches(workspace, parent.training_data, child_data)
    if problems:
        raise UsageError(f"init_from {ref}: run {parent.run_id} trained on {parent.training_data}, whose "
                         f"vocabularies number tokens differently from {child_data}'s:\n  " + "\n  ".join(problems)
                         + "\nTrain the child on data ingested with the same vocabularies (the same events), "
                         "or train it from scratch.")
    try:
        match = match_tensors(parent.model.state_dict(), child.state_dict())
    except UsageError as error:
        hint = _model_config_hint(parent.model, child)
        raise UsageError(f"init_from {ref} (run {parent.run_id}): {error}{hint}") from None
    folder = Path(tempfile.mkdtemp(prefix="lumos-init-"))
    (folder / MODEL_FILE).write_bytes(parent.checkpoint[MODEL_FILE])
    summary = InitSummary(run=parent.run_id, model=parent.version.label if parent.version else None,
                          data=str(parent.training_data), checkpoint=parent.run.data.tags[CHECKPOINT_TAG],
                          loaded=len(match.loaded), new=match.new, unused=match.unused)
    return InitSource(summary, folder / MODEL_FILE)


def match_tensors(parent: dict[str, torch.Tensor], child: dict[str, torch.Tensor]) -> TensorMatch:
    """Sort the child's tensors into loaded and new; UsageError naming every shape mismatch."""
    mismatched = [f"{name}: the parent's is {tuple(parent[name].shape)}, the child's {tuple(tensor.shape)}"
                  for name, tensor in child.items() if name in parent and parent[name].shape != tensor.shape]
    if mismatched:
        raise UsageError("tensor shapes differ:\n  " + "\n  ".join(mismatched))
    return TensorMatch(loaded=[name for name in child if name in parent],
                       new=[name for name in child if name not in parent],
                       unused=[name for name in parent if name not in child])


def load_matching(model: LumosModel, weights_file: str | Path) -> TensorMatch:
    """Copy the parent's tensors of `weights_file` into `model` where the names match (the shapes
    were checked by `prepare_init`; checked again here, so a rank never loads a mismatch)."""
    parent = load_file(str(weights_file))
    child = model.state_dict()
    match = match_tensors(parent, child)
    model.load_state_dict({name: parent[name] for name in match.loaded}, strict=False)
    return match


def _model_config_hint(parent: LumosModel, child: LumosModel) -> str:
    """The model.* keys whose values differ, the likely cause of a shape mismatch."""
    theirs, ours = to_plain(parent.config), to_plain(child.config)
    differing = [f"model.{key} = {theirs[key]!r} in the parent, {ours[key]!r} here"
                 for key in sorted(ours) if key in theirs and theirs[key] != ours[key]]
    if not differing:
        return ""
    return "\nThe model configs differ:\n  " + "\n  ".join(differing)


# ---------------------------------------------------------------------------------------------
# Vocabularies


def vocabulary_mismatches(workspace: Workspace, parent_data: TableRef, child_data: TableRef) -> list[str]:
    """One line per vocabulary both data versions have that numbers its tokens differently."""
    _, parent_vocab = ingest_lineage(workspace, parent_data)
    _, child_vocab = ingest_lineage(workspace, child_data)
    if parent_vocab == child_vocab:
        return []
    theirs, ours = _vocabularies(workspace, parent_vocab), _vocabularies(workspace, child_vocab)
    problems = []
    for feature in sorted(theirs.keys() & ours.keys()):
        if theirs[feature] != ours[feature]:
            problems.append(f"{feature}: {_first_difference(theirs[feature], ours[feature])} "
                            f"({len(theirs[feature])} tokens in {parent_vocab}, {len(ours[feature])} in {child_vocab})")
    return problems


def _vocabularies(workspace: Workspace, vocab: TableRef) -> dict[str, dict[str, int]]:
    """Feature → token → id of vocab table version `vocab`."""
    import pyarrow.parquet as pq

    snapshot = open_snapshot(table_location(workspace, vocab), vocab.version)
    if not snapshot.files:
        return {}
    rows = pq.read_table([data_file.path for data_file in snapshot.files], columns=["feature", "token", "id"])
    numbered: dict[str, dict[str, int]] = {}
    for feature, token, token_id in zip(*(rows[name].to_pylist() for name in ("feature", "token", "id")), strict=True):
        numbered.setdefault(feature, {})[token] = token_id
    return numbered


def _first_difference(theirs: dict[str, int], ours: dict[str, int]) -> str:
    for token in sorted(theirs.keys() | ours.keys()):
        if theirs.get(token) != ours.get(token):
            return f"token {token!r} is id {theirs.get(token, 'absent')} in the parent's, {ours.get(token, 'absent')} in the child's"
    return "the numbering differs"


# ---------------------------------------------------------------------------------------------
# Freeze


def frozen_parameters(model: LumosModel, prefixes: tuple[str, ...] | list[str]) -> list[str]:
    """Names of the parameters `prefixes` select; UsageError for a prefix that selects none, or
    when they select every parameter (nothing would train)."""
    names = [name for name, _ in model.named_parameters()]
    unknown = [prefix for prefix in prefixes if not any(_under(name, prefix) for name in names)]
    if unknown:
        top = sorted({name.split(".")[0] for name in names})
        raise UsageError(f"freeze: {', '.join(repr(prefix) for prefix in unknown)} names no parameter of the model; "
                         f"prefixes are matched at a dot, e.g. one of {', '.join(top)}")
    frozen = [name for name in names if any(_under(name, prefix) for prefix in prefixes)]
    if frozen and len(frozen) == len(names):
        raise UsageError(f"freeze = {list(prefixes)} names every parameter of the model; nothing would train")
    return frozen


def freeze(model: LumosModel, prefixes: tuple[str, ...] | list[str]) -> list[str]:
    """Turn requires_grad off for the parameters under `prefixes`; returns their names."""
    frozen = set(frozen_parameters(model, prefixes))
    for name, parameter in model.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)
    return sorted(frozen)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix.rstrip(".") + ".")
