"""Features for one as-of date, rebuilt with the recipe and vocabulary a model was trained on.

The model's training data version names (in its Delta commit's lineage) the ingest recipe, the
exact vocab version and the sources it read. Inference reuses all three: the same validation
rules, the same tokenization and the same ids, so a user's features mean what they meant in
training. Users and items the vocabulary has never seen get the out-of-vocabulary id, like rare
tokens did in training; users with history before the date get one row each.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from pathlib import Path

from lumos.core.config import from_dict
from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput
from lumos.core.tables import TABLE_REF, TableRef, read_table, table_location
from lumos.core.workspace import Workspace, is_uri
from lumos.data.ingest import read_calendar, read_users
from lumos.data.recipe import Cutoff, IngestRecipe, SplitSpec
from lumos.data.sequences import build_sequences
from lumos.data.sequences_version import ingest_lineage
from lumos.data.sources import read_source
from lumos.data.validation import check_columns, check_events, event_columns, valid_events

INFER_SPLIT = "infer"
ROOT = Path("/")  # recorded source locations are absolute


@dataclass(frozen=True)
class TrainingData:
    """What a model's training data version says about how to rebuild its features."""

    sequences: TableRef
    recipe: IngestRecipe
    vocab: TableRef
    sources: dict[str, LineageInput]
    """Role (events, users, calendar) → the input the ingest read."""


def training_data(workspace: Workspace, sequences: TableRef) -> TrainingData:
    """Read the recipe, vocab version and sources from the ingest lineage of `sequences` (pinned)."""
    lineage, vocab = ingest_lineage(workspace, sequences)
    recipe = from_dict(IngestRecipe, lineage.config, source=f"the recipe recorded in {sequences}")
    # The ingest lists its inputs as events, then users, then calendar, each only when the recipe has it.
    roles = ["events"] + (["users"] if recipe.users else []) + (["calendar"] if recipe.calendar else [])
    return TrainingData(sequences, recipe, vocab, dict(zip(roles, lineage.inputs, strict=True)))


def inference_rows(spark, workspace: Workspace, data: TrainingData, as_of: datetime.date, events_source: str | None = None):
    """(rows DataFrame with the sequences columns, the inputs read) for users with history before `as_of`.

    Events come from the recorded source unless `events_source` (a path or URI) replaces it; users
    and calendar always from the recorded ones. A missing source is a UsageError naming it.
    """
    recipe = _as_of_recipe(data, as_of, events_source)
    _require_exists(recipe.source.path, "--source" if events_source else "the events source")
    raw, events_input = read_source(spark, workspace, recipe.source.path, recipe.source.format, ROOT, "--source")
    check_columns(raw, [c.source for c in event_columns(recipe)], "columns", recipe.source.path)
    for role, spec in (("users", recipe.users), ("calendar", recipe.calendar)):
        if spec is not None:
            _require_exists(spec.path, f"the {role} source")
    users, users_input = read_users(spark, workspace, recipe, ROOT)
    calendar, calendar_input = read_calendar(spark, workspace, recipe, ROOT)
    vocab = read_table(spark, workspace, data.vocab)
    vocab_input = LineageInput("delta", table_location(workspace, data.vocab), data.vocab.version)
    inputs = [item for item in (events_input, users_input, calendar_input, vocab_input) if item is not None]
    events = valid_events(check_events(raw, recipe))
    return build_sequences(events, vocab, users, calendar, recipe), inputs


def _as_of_recipe(data: TrainingData, as_of: datetime.date, events_source: str | None) -> IngestRecipe:
    """The training recipe reading the recorded sources (or `events_source`), with one time cutoff
    at `as_of`: history is every token before that day."""
    recipe = data.recipe
    changes = {
        "source": replace(recipe.source, path=events_source or data.sources["events"].uri),
        "splits": SplitSpec(mode="time", cutoffs=(Cutoff(INFER_SPLIT, as_of),), min_history=recipe.splits.min_history),
    }
    if recipe.users is not None:
        changes["users"] = replace(recipe.users, path=data.sources["users"].uri)
    if recipe.calendar is not None:
        changes["calendar"] = replace(recipe.calendar, path=data.sources["calendar"].uri)
    return replace(recipe, **changes)


def _require_exists(location: str, what: str) -> None:
    if is_uri(location) or TABLE_REF.match(location) or Path(location).exists():
        return
    if what == "--source":
        raise UsageError(f"--source {location} does not exist; nothing was written")
    hint = ("pass --source PATH to read the events from where they are now" if what == "the events source"
            else "restore it, or re-ingest and retrain with a recipe that names where it is now")
    raise UsageError(f"{what} recorded in the model's data lineage, {location}, does not exist; {hint}; nothing was written")
