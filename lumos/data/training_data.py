"""How a model's training data was made: the recipe, vocabulary version and sources of a sequences
version, read from the ingest lineage in its Delta commit; and that vocabulary's item tokens.

Inference rebuilds features with all three: the same validation rules, the same tokenization and
the same ids, so a user's features mean what they meant in training. It names its recommendations
with the same vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from lumos.core.config import from_dict
from lumos.core.lineage import LineageInput
from lumos.core.tables import TableRef, read_table
from lumos.core.workspace import Workspace
from lumos.data.contract import FeatureSpec
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import ingest_lineage


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
