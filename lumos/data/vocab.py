"""Reads of a vocabulary table (`<dataset>.vocab`: feature, token, id), as its consumers need them."""

from __future__ import annotations

from lumos.core.tables import TableRef, read_table
from lumos.core.workspace import Workspace
from lumos.data.contract import FeatureSpec


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
