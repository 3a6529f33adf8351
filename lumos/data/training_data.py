"""How a model's training data was made: the recipe, vocabulary version and sources of a sequences
version, read from the ingest lineage in its Delta commit; and that vocabulary's item tokens.

Inference rebuilds features with all three: the same validation rules, the same tokenization and
the same ids, so a user's features mean what they meant in training (`as_of_recipe`: the recipe
reading the recorded sources up to a date). It names its recommendations with the same vocabulary.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from pathlib import Path

from lumos.core.config import from_dict
from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput
from lumos.core.tables import TABLE_REF, TableRef, read_table
from lumos.core.workspace import Workspace, is_uri
from lumos.data.contract import FeatureSpec
from lumos.data.recipe import Cutoff, IngestRecipe, SplitSpec
from lumos.data.sequences_version import ingest_lineage

INFER_SPLIT = "infer"


@dataclass(frozen=True)
class TrainingData:
    """What a model's training data version says about how to rebuild its features."""

    sequences: TableRef
    recipe: IngestRecipe
    vocab: TableRef
    sources: dict[str, LineageInput]
    """Role (events, users, calendar, items) → the input the ingest read."""


def training_data(workspace: Workspace, sequences: TableRef) -> TrainingData:
    """Read the recipe, vocab version and sources from the ingest lineage of `sequences` (pinned)."""
    lineage, vocab = ingest_lineage(workspace, sequences)
    recipe = from_dict(IngestRecipe, lineage.config, source=f"the recipe recorded in {sequences}")
    roles = [role for role, _ in recipe.source_sections()]  # the order ingest lists its inputs in
    return TrainingData(sequences, recipe, vocab, dict(zip(roles, lineage.inputs, strict=True)))


def item_tokens(spark, workspace: Workspace, vocab: TableRef, features: FeatureSpec) -> tuple[str, ...]:
    """Vocabulary id → item token ("" for padding and OOV, which are never recommended)."""
    from pyspark.sql import functions as F

    size = features.item_vocab_size
    tokens = [""] * size
    item_rows = read_table(spark, workspace, vocab).where(F.col("feature") == features.item_feature)
    for row in item_rows.select("id", "token").collect():
        if row["id"] < size:
            tokens[row["id"]] = row["token"]
    return tuple(tokens)


def as_of_recipe(data: TrainingData, as_of: datetime.date, events_source: str | None) -> IngestRecipe:
    """The training recipe reading the recorded sources (or `events_source`), with one time cutoff
    at `as_of`: history is every token before that day."""
    recipe = data.recipe
    changes = {
        "source": replace(recipe.source, path=events_source or data.sources["events"].uri),
        "splits": SplitSpec(mode="time", cutoffs=(Cutoff(INFER_SPLIT, as_of),), min_history=recipe.splits.min_history),
        # The training window bounded what the model learned from; a date's history is every event
        # before it, so the window would silently drop every event after max_timestamp.
        "cleaning": replace(recipe.cleaning, min_timestamp=None, max_timestamp=None),
    }
    for role, section in recipe.source_sections()[1:]:  # users, calendar, items: where ingest read them
        changes[section] = replace(getattr(recipe, section), path=data.sources[role].uri)
    return replace(recipe, **changes)


def require_exists(location: str, what: str) -> None:
    if is_uri(location) or TABLE_REF.match(location) or Path(location).exists():
        return
    if what == "--source":
        raise UsageError(f"--source {location} does not exist; nothing was written")
    hint = ("pass --source PATH to read the events from where they are now" if what == "the events source"
            else "restore it, or re-ingest and retrain with a recipe that names where it is now")
    raise UsageError(f"{what} recorded in the model's data lineage, {location}, does not exist; {hint}; nothing was written")
