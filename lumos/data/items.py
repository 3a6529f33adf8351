"""The recipe's items table (`[items]`): item attributes, joined to the events as token features.

Each attribute becomes an event column `item_<name>` before anything is counted or built, so the
vocabularies, histories, day tokens, time rows and inference treat it as they treat the events'
own columns (`lumos.data.sequences`). Categorical and multi-valued attributes are strings with a
vocabulary (ids counted over the valid events, as `cat_<name>`'s are), numeric ones floats.

Nothing is dropped: an event whose item the table lacks (or whose item id is null) keeps its
attributes null, which the builders write as OOV ids and 0.0, and ingest counts those events
(`events_item_missing`). An item id listed twice is an error: which row's attributes won would
otherwise depend on the file's order.
"""

from __future__ import annotations

from pathlib import Path

from lumos.core.errors import UsageError
from lumos.core.workspace import Workspace
from lumos.data.recipe import IngestRecipe, ItemsSpec
from lumos.data.sources import quote_column, read_source
from lumos.data.validation import check_columns, strip_whitespace


def read_items(spark, workspace: Workspace, recipe: IngestRecipe, recipe_dir: Path):
    """(item_id, item_<name> …) one row per item, and its LineageInput; (None, None) without [items].
    A missing source, a column it lacks or an item id listed twice is a UsageError."""
    from pyspark.sql import functions as F

    spec = recipe.items
    if spec is None:
        return None, None
    frame, source_input = read_source(spark, workspace, spec.path, spec.format, recipe_dir, "items.path")
    check_columns(frame, [spec.item_id, *spec.attributes], "items", spec.path)
    items = frame.select(
        strip_whitespace(F.col(quote_column(spec.item_id))).alias("item_id"),
        *[F.col(quote_column(name)).cast("string").alias(f"item_{name}") for name in spec.categorical],
        *[multi_valued_token(F.col(quote_column(name)), spec.separator).alias(f"item_{name}")
          for name in spec.multi_valued],
        *[F.col(quote_column(name)).cast("double").alias(f"item_{name}") for name in spec.numeric],
    ).where(F.col("item_id").isNotNull() & (F.col("item_id") != ""))
    duplicated = items.groupBy("item_id").count().where(F.col("count") > 1).limit(3).collect()
    if duplicated:
        names = ", ".join(row["item_id"] for row in duplicated)
        raise UsageError(f"items.path = {spec.path!r}: item ids appear more than once (e.g. {names}); "
                         "keep one row per item")
    return items, source_input


def multi_valued_token(column, separator: str):
    """The set of values in a `separator`-separated string as one token: each value stripped of
    edge whitespace, empty ones and repeats left out, sorted and joined by `separator`; null when
    no value is left. "Comedy|Action|" and "Action | Comedy" both read "Action|Comedy"."""
    from pyspark.sql import functions as F

    literal = "\\Q" + separator + "\\E"  # split takes a Java regex: the separator as literal text
    values = F.transform(F.split(column.cast("string"), literal), strip_whitespace)
    kept = F.array_sort(F.array_distinct(F.filter(values, lambda value: value != "")))
    return F.when(F.size(kept) > 0, F.array_join(kept, separator))


def with_item_attributes(events, items, spec: ItemsSpec | None):
    """`events` with the item_<name> columns of `items` (null for an item the table lacks).

    A broadcast join: the items table is small beside the events, and the events keep the
    partitioning by user that validation gave them (every later step relies on it)."""
    from pyspark.sql import functions as F

    if spec is None:
        return events
    attributes = items.withColumnRenamed("item_id", "_attribute_item_id")
    joined = events.join(F.broadcast(attributes), F.col("item_id") == F.col("_attribute_item_id"), "left")
    return joined.drop("_attribute_item_id")


def count_missing_items(events, items) -> int:
    """How many of `events` have an item (or a null item id) that the items table lacks."""
    from pyspark.sql import functions as F

    known = F.broadcast(items.select(F.col("item_id").alias("_known_item_id")))
    return events.join(known, F.col("item_id") == F.col("_known_item_id"), "left_anti").count()

