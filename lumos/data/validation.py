"""Validation: map source columns to canonical ones and give every failing row a reason.

Nothing is dropped silently: a row either becomes a canonical event or a reject with the rule it
broke, a readable reason and the original row as JSON (a line that does not parse keeps its raw
text). Rules are checked in a fixed order and a row is rejected for the first one it breaks:

malformed_line → missing_user_id → bad_timestamp → unknown_event_type → bad_number → non_finite →
negative_value → timestamp_out_of_range → duplicate (an exact copy, on every mapped column, of an earlier valid row).
"""

from __future__ import annotations

from dataclasses import dataclass

from lumos.core.errors import UsageError
from lumos.data.recipe import IngestRecipe
from lumos.data.sources import MALFORMED, quote_column

RULES = (
    "malformed_line",
    "missing_user_id",
    "bad_timestamp",
    "unknown_event_type",
    "bad_number",
    "non_finite",
    "negative_value",
    "timestamp_out_of_range",
    "duplicate",
)


@dataclass(frozen=True)
class EventColumn:
    source: str
    """Column name in the source."""
    canonical: str
    """Column name in the canonical events frame (see lumos.data.sequences)."""
    kind: str
    """string, timestamp or double."""


def event_columns(recipe: IngestRecipe) -> list[EventColumn]:
    """The recipe's column mapping as (source, canonical, kind), in canonical order."""
    columns = recipe.columns
    mapped = [
        EventColumn(columns.user_id, "user_id", "string"),
        EventColumn(columns.timestamp, "ts", "timestamp"),
        EventColumn(columns.event_type, "event_type", "string"),
    ]
    if columns.item_id:
        mapped.append(EventColumn(columns.item_id, "item_id", "string"))
    if columns.value:
        mapped.append(EventColumn(columns.value, "value", "double"))
    mapped += [EventColumn(name, f"cat_{name}", "string") for name in columns.categorical]
    mapped += [EventColumn(name, f"num_{name}", "double") for name in columns.numeric]
    return mapped


def check_columns(frame, wanted: list[str], key: str, location: str) -> None:
    """Fail with every missing source column named, and what the source does have."""
    columns = [name for name in frame.columns if name != MALFORMED]
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise UsageError(
            f"{location}: no column {', '.join(repr(m) for m in missing)} (named in {key}); "
            f"the source has: {', '.join(columns)}"
        )


def check_events(raw, recipe: IngestRecipe):
    """The raw frame with canonical columns plus `_rule`, `_reason`, `_row` (the raw row as JSON) and
    `_copy_of` (a duplicate's raw row hash, which `rejected_rows` quotes it by), all null on valid
    rows. Partitioned by user_id (see below)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    mapped = event_columns(recipe)
    has_malformed = MALFORMED in raw.columns
    casted = raw.select(
        *[_cast(F.col(quote_column(c.source)), c.kind).alias(c.canonical) for c in mapped],
        *[F.col(quote_column(c.source)).isNotNull().alias(f"_given_{c.canonical}") for c in mapped if c.kind == "double"],
        _raw_row(raw).alias("_source"),
        (F.col(MALFORMED) if has_malformed else F.lit(None).cast("string")).alias("_malformed_text"),
        (F.col(MALFORMED).isNotNull() if has_malformed else F.lit(False)).alias("_malformed"),
    )
    by_role = {c.canonical: c for c in mapped}
    rules = [
        ("malformed_line", F.col("_malformed"),
         F.lit("the line does not parse (an unterminated quote, a wrong number of fields, or not a JSON object); "
               "row holds its raw text")),
        ("missing_user_id", F.col("user_id").isNull() | (F.col("user_id") == ""),
         F.lit(f"user id column {recipe.columns.user_id!r} is null, empty or only whitespace")),
        ("bad_timestamp", F.col("ts").isNull(),
         F.lit(f"timestamp column {recipe.columns.timestamp!r} is null or not a parseable time")),
        ("unknown_event_type", F.col("event_type").isNull() | ~F.col("event_type").isin(*recipe.cleaning.event_types),
         F.concat(F.lit("event type '"), F.coalesce(F.col("event_type"), F.lit("null")),
                  F.lit("' is not in cleaning.event_types"))),
    ]
    for c in mapped:
        if c.kind == "double":
            rules.append(("bad_number", F.col(f"_given_{c.canonical}") & F.col(c.canonical).isNull(),
                          F.lit(f"column {c.source!r} is not a number")))
    # NaN and ±Infinity (also what 1e999 overflows to) parse as doubles but poison a loss: one
    # in a batch makes every parameter NaN after a step. `NaN < 0` is false, so non_negative
    # alone would let NaN through.
    for c in mapped:
        if c.kind == "double":
            rules.append(("non_finite", F.isnan(c.canonical) | F.col(c.canonical).isin(float("inf"), float("-inf")),
                          F.concat(F.lit(f"column {c.source!r} is not a finite number ("),
                                   F.col(c.canonical).cast("string"), F.lit(")"))))
    for role in recipe.cleaning.non_negative:
        canonical = "value" if role == "value" else f"num_{role}"
        rules.append(("negative_value", F.col(canonical) < 0,
                      F.concat(F.lit(f"column {by_role[canonical].source!r} is negative ("),
                               F.col(canonical).cast("string"), F.lit(")"))))
    window = _window_condition(recipe)
    if window is not None:
        rules.append(("timestamp_out_of_range", window, F.lit(
            f"timestamp is outside [{recipe.cleaning.min_timestamp or '-inf'}, {recipe.cleaning.max_timestamp or '+inf'})"
        )))
    rule = F.lit(None).cast("string")
    reason = F.lit(None).cast("string")
    for name, condition, message in reversed(rules):
        rule = F.when(condition, F.lit(name)).otherwise(rule)
        reason = F.when(condition, message).otherwise(reason)
    # The reason is built only for a rejected row: its conditions are the rule's again, which for
    # a valid row would all be evaluated twice (the check of 4M events: 9.3 → 9.0 s of JVM CPU).
    checked = casted.withColumn("_rule", rule).withColumn("_reason", F.when(F.col("_rule").isNotNull(), reason))
    # Every rule but the duplicate one reads a single row, so a rejected row is quoted here, while
    # its raw row is at hand: as JSON, and only where the rejects table quotes it (serialising
    # every valid row too cost as much as the rules themselves). The shuffle below then carries a
    # hash of the raw row instead of the row: half the bytes (the check took 8.6 s instead of
    # 10.3 at 4M events).
    row_json = F.coalesce(F.col("_malformed_text"), F.to_json("_source"))
    checked = checked.withColumns({"_row": F.when(F.col("_rule").isNotNull(), row_json),
                                   "_raw_hash": F.xxhash64("_source")})
    checked = checked.drop("_source", "_malformed_text", "_malformed",
                           *[name for name in checked.columns if name.startswith("_given_")])
    # One shuffle by user here serves every later step: the duplicate check below and the per-user
    # windows, aggregations and joins of sequences all find the events already partitioned by user.
    checked = checked.repartition("user_id")
    copy = F.lit(False)
    if recipe.cleaning.reject_duplicates:
        canonical = [c.canonical for c in mapped]
        # Which of two copies is "earlier" only shows in which raw row the rejects table quotes
        # (their mapped columns are equal), so a hash of the raw row orders them: stable across
        # runs, and far cheaper than ordering by the row's JSON (a collision between two different
        # raw rows only swaps which of them is quoted).
        copies = Window.partitionBy(*canonical, "_rule").orderBy("_raw_hash")
        copy = F.col("_rule").isNull() & (F.row_number().over(copies) > 1)
    checked = checked.withColumn("_copy_of", F.when(copy, F.col("_raw_hash")))
    return checked.withColumns({
        "_reason": F.when(F.col("_copy_of").isNotNull(), F.lit("exact duplicate of an earlier row")).otherwise(F.col("_reason")),
        "_rule": F.when(F.col("_copy_of").isNotNull(), F.lit("duplicate")).otherwise(F.col("_rule")),
    }).drop("_raw_hash")


def valid_events(checked):
    return checked.where(checked["_rule"].isNull()).drop("_rule", "_reason", "_row", "_copy_of")


def rejected_rows(checked, raw, by_rule: dict[str, int]):
    """rule, reason and row (the raw row as JSON) of every rejected event in `checked`, the check
    of `raw`; `by_rule` counts them (ingest.count_rejects). A duplicate's raw row did not travel
    with it (see check_events): it is read from `raw` again, by its hash, when there are any."""
    from pyspark.sql import functions as F

    # With nothing rejected the frame is empty by a constant condition: Spark writes it without
    # scanning the events.
    rejected = checked.where(F.col("_rule").isNotNull() & F.lit(sum(by_rule.values()) > 0))
    row = F.col("_row")
    if by_rule.get("duplicate"):
        copies = rejected.where(F.col("_copy_of").isNotNull()).select("_copy_of").distinct()
        if _fits_broadcast(checked.sparkSession, by_rule["duplicate"]):
            # Left to its estimate of the copies' size, Spark shuffled every raw row for a
            # sort-merge join: 1.3 GB and 29 s of a million users' 41M events at inference. The
            # copies are counted, so when their hashes fit Spark's broadcast budget each task
            # matches its raw rows against them in place.
            copies = F.broadcast(copies)
        # Copies of one raw row share its hash and its JSON: one quote per hash.
        quotes = (raw.select(_raw_row(raw).alias("_source")).withColumn("_copy_of", F.xxhash64("_source"))
                  .join(copies, "_copy_of", "left_semi").dropDuplicates(["_copy_of"])
                  .select("_copy_of", F.to_json("_source").alias("_copy_row")))
        rejected = rejected.join(quotes, "_copy_of", "left")
        row = F.coalesce(row, F.col("_copy_row"))
    return rejected.select(F.col("_rule").alias("rule"), F.col("_reason").alias("reason"), row.alias("row"))


HASH_ROW_BYTES = 16
"""An UnsafeRow of one long: its null bits and the value."""


def _fits_broadcast(spark, hashes: int) -> bool:
    """Whether `hashes` raw row hashes fit `spark.sql.autoBroadcastJoinThreshold` (-1: never)."""
    threshold = spark._jsparkSession.sessionState().conf().autoBroadcastJoinThreshold()
    return 0 <= hashes * HASH_ROW_BYTES <= threshold


def _raw_row(raw):
    """A raw row as one struct of its source columns: what a reject quotes, and a copy's hash."""
    from pyspark.sql import functions as F

    return F.struct(*[F.col(quote_column(name)) for name in raw.columns if name != MALFORMED])


def _window_condition(recipe: IngestRecipe):
    from pyspark.sql import functions as F

    conditions = []
    if recipe.cleaning.min_timestamp is not None:
        conditions.append(F.col("ts") < _utc_literal(recipe.cleaning.min_timestamp))
    if recipe.cleaning.max_timestamp is not None:
        conditions.append(F.col("ts") >= _utc_literal(recipe.cleaning.max_timestamp))
    if not conditions:
        return None
    combined = conditions[0]
    for condition in conditions[1:]:
        combined = combined | condition
    return combined


def _utc_literal(moment):
    """A timestamp literal read in the session's UTC zone (F.lit of a datetime uses local time)."""
    from pyspark.sql import functions as F

    return F.lit(moment.isoformat(sep=" ")).cast("timestamp")


def _cast(column, kind: str):
    if kind == "string":
        return strip_whitespace(column)
    return column.cast(kind)


# Java regex: (?U) makes \s every Unicode White_Space character (tab, no-break space U+00A0, em
# space, ideographic space U+3000, …); zero-width space and the byte-order mark are added by hand.
_EDGE_WHITESPACE = r"(?U)^[\s\x{200B}\x{FEFF}]+|[\s\x{200B}\x{FEFF}]+$"


def strip_whitespace(column):
    """`column` as a string without leading or trailing Unicode whitespace.

    Ids go through this in ingest and infer alike (both validate with check_events), so ids that
    differ only in such whitespace are one id, and an id of only whitespace is empty: missing.
    """
    from pyspark.sql import functions as F

    text = column.cast("string")
    # The regex runs only on values that start or end with a space, a control character or a
    # non-ASCII character (where every Unicode space lies): plain ids skip it, and it was the
    # costliest part of validation. The tests compare bytes: a string sorts below "!" or from
    # "\x7f" on exactly when its first byte is ≤ 0x20 or ≥ 0x7f, and in UTF-8 the last byte of a
    # non-ASCII character is ≥ 0x80. (`ascii` and a character `substring` built two strings per
    # value, one a Java String: a fifth of the check's JVM samples. The check of 4M events: 10.6 →
    # 9.3 s of JVM CPU, medians of 4.)
    last_byte = F.substring(text.cast("binary"), -1, 1)
    suspect = ((text < F.lit("!")) | (text >= F.lit("\x7f"))
               | (last_byte < F.lit(bytearray(b"!"))) | (last_byte >= F.lit(bytearray(b"\x7f"))))
    return F.when(suspect, F.regexp_replace(text, _EDGE_WHITESPACE, "")).otherwise(text)
