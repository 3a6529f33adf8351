"""Recipe → training data: the vocabulary table and the sequences table, as pure DataFrame transforms.

Both functions take validated, renamed frames (see `build_sequences`) and return DataFrames; the
caller writes them. Per-user data never leaves the executors. Time splits (the quickstart's, and
every inference) are built by `lumos.data.time_rows`: one shuffle puts each user's tokens together
in token order, and each partition's rows are computed from them in Arrow and NumPy. Leave-last-out
rows are joins, aggregations, windows and higher-order array functions; their per-user arrays hold
only the tokens some row reads (at most max_len + 3), so one very active user does not make a huge
array; only leave_last_out with every token a train target keeps whole sequences.

Semantics (the contract the training loader and the model rely on):

- **Vocabulary ids.** 0 is padding and 1 is out-of-vocabulary (OOV); neither is a row of the vocab
  table. Tokens seen at least `vocab.min_count` times get ids 2, 3, … by descending count, then
  ascending token. Event features (`item`, `event_type`, `cat_<name>`) are counted over all valid
  events (not over day tokens, not per split); `user_<name>` over the rows of the users table.
  Null, rare and unknown tokens all map to 1. Item attributes (`item_<name>`, from the recipe's
  `[items]`: `lumos.data.items`) are event features too: counted over the valid events, and an
  event whose item the items table lacks reads 1 (and 0.0 for a numeric attribute).
- **Token order.** A user's events are sorted by `ts`, then the event type's position in
  `cleaning.event_types` (funnel order: a view before a purchase at the same instant: a real
  order), then `xxhash64(tokens.tie_seed, user_id, item_id, ts)`: events still tied have no order
  in the data, and sorting them by item id would invent one that a model can learn (the next
  item's id sorting after the last one's), so a seeded hash orders them instead. Hash ties (the
  same item at the same instant) fall to `item_id`, `value`, the extra categorical columns and the
  extra numeric columns in recipe order, each ascending with nulls first. Events equal on all of
  these are identical tokens, so the result does not depend on which of them comes first.
- **Day tokens** (`tokens.unit = "day"`): one token per user and UTC date, carrying the day's last
  event (in the order above): its categorical and numeric features and its `ts`. `value` is the
  day's value sum and `count` its number of events.
- **Time features** are in UTC whatever the session's time zone: `hour` 0–23, `weekday` 0 = Monday
  … 6 = Sunday, `gap_bucket` = 0 for a user's first token, else min(15, 1 + floor(log2(1 + whole
  minutes since the previous token))), computed over the full token sequence before any cut or
  truncation, and `age_days` = days from the token to `as_of` (unless `tokens.age_days = false`).
- **Cuts.** A row is (user, split, as_of) with a cut position c: its history is tokens[0:c], keeping
  the most recent `tokens.max_len` (oldest first), and its target token is tokens[c]. Rows whose
  history before truncation has fewer than `splits.min_history` tokens are not written.
  leave_last_out: with n tokens, test cuts at n-1, valid at n-2, train at n-3 (with
  `splits.train_targets = "every"`, at every c ≤ n-3; with "windows", at c = n-3 - k·(max_len + 1)
  for k = 0, 1, …, so that the rows' histories and targets tile the train tokens without overlap),
  and `as_of` is the target token's `ts`.
  time: per cutoff, `as_of` is the cutoff date at 00:00 UTC and c is the number of tokens before it.
- **Targets.** `next_item` is the item id of the target token (null when there is none; OOV when
  its item is null). `act_<K>d` is 1 when a raw event of an act type (any type when
  `targets.act_event_types` is empty) has as_of ≤ ts < as_of + K days; `value_<K>d` sums those
  events' values (nulls count as 0). The window starts at the target token: with event tokens, a
  history event that shares the target's timestamp (an earlier token in the tie order) is not
  counted, so no event is both history and target. With day tokens and leave_last_out, as_of is
  the target day's last event, so that day's earlier events are in neither. Sums of doubles are
  taken in a fixed order, so reruns give identical bits.
- **Known future.** `future_<flag>[d]` is the calendar flag on date(as_of) + d days, for d in
  0 … max(horizons_days) - 1 (one slot when there are no horizons); dates missing from the
  calendar read 0.
- **Static features.** `user_<name>`: vocab id (OOV for a user missing from the users table) or
  float (0.0 when missing).
"""

from __future__ import annotations

import datetime
import operator
from dataclasses import replace
from functools import partial, reduce

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from lumos.data.contract import FIRST_TOKEN_ID, OOV_ID, TIME_FEATURES
from lumos.data.recipe import IngestRecipe
from lumos.data.time_rows import (  # the time units are declared once, where the Spark-free builder needs them
    ACT_ONLY,
    EPOCH_WEEKDAY,
    MICROS_PER_DAY,
    MICROS_PER_HOUR,
    MICROS_PER_MINUTE,
    TOKEN,
    TimeRowsPlan,
    TokenIds,
    build_rows,
)

MAX_GAP_BUCKET = TIME_FEATURES["gap_bucket"] - 1  # gap buckets are 0 … 15

EPOCH = datetime.date(1970, 1, 1)

# Leave-last-out split names, indexed by how many tokens before the last one the target is.
LEAVE_LAST_OUT_SPLITS = ("test", "valid", "train")
HOLDOUT_SPLIT = "holdout"  # splits.holdout_users: a held-out user's one row, cut where test is


# ---------------------------------------------------------------------------------------------
# Vocabulary


VOCAB_SCHEMA = "feature string, token string, id int, count bigint"


def build_vocab(events: DataFrame, users: DataFrame | None, recipe: IngestRecipe) -> DataFrame:
    """One row per kept token: `feature` string, `token` string, `id` int (2, 3, …), `count` long."""
    pairs = events.select(F.inline(F.array(*token_pairs(recipe))))
    return vocab_frame(events.sparkSession, number_tokens(token_counts(pairs, users, recipe).toArrow()))


def token_pairs(recipe: IngestRecipe, counted: Column | None = None) -> list[Column]:
    """A (feature, token) struct per event feature with a vocabulary: `F.inline(F.array(...))` of
    them turns each events row into its tokens. Rows where `counted` is false give null tokens,
    which no vocabulary counts."""
    return _pairs(_event_vocab_features(recipe), counted)


def token_counts(pairs: DataFrame, users: DataFrame | None, recipe: IngestRecipe, kept_feature: str | None = None
                 ) -> DataFrame:
    """(feature, token, count) of the tokens in `pairs` (event tokens, from `token_pairs`) and of
    the users rows' features, kept when counted at least vocab.min_count times. Event features
    are counted over the events given, user features over users rows. Every count of
    `kept_feature` is kept, a null token's too (ingest counts its rules in the same pass)."""
    user_features = _user_vocab_features(recipe)
    if user_features:
        pairs = pairs.unionByName(_feature_tokens(_require(users, "users"), user_features))
    kept = F.col("token").isNotNull() & (F.col("count") >= recipe.vocab.min_count)
    if kept_feature is not None:
        kept = kept | (F.col("feature") == kept_feature)
    return pairs.groupBy("feature", "token").agg(F.count(F.lit(1)).alias("count")).where(kept)


def number_tokens(counts: pa.Table) -> pa.Table:
    """The vocabulary from its kept (feature, token, count) rows: per feature, ids from
    FIRST_TOKEN_ID by count (descending), then token (ascending, by UTF-8 bytes, as Spark orders
    strings). Numbered here rather than by a Spark window: the counts are on the driver already,
    and the builders need the ids there (a window, a cache and a count were three Spark jobs)."""
    ordered = counts.select(["feature", "token", "count"]).sort_by(
        [("feature", "ascending"), ("count", "descending"), ("token", "ascending")])
    features = ordered.column("feature").to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, features[1:] != features[:-1]])  # [0] when empty: no ids either
    first_of_feature = np.repeat(starts, np.diff(np.r_[starts, len(features)]))
    ids = (np.arange(len(features)) - first_of_feature + FIRST_TOKEN_ID).astype(np.int32)
    return pa.table({"feature": ordered.column("feature"), "token": ordered.column("token"), "id": ids,
                     "count": ordered.column("count").cast(pa.int64())})


def vocab_frame(spark, vocab: pa.Table) -> DataFrame:
    """A vocabulary built on the driver (`number_tokens`) as a DataFrame."""
    return spark.createDataFrame(vocab, schema=VOCAB_SCHEMA)


def _event_vocab_features(recipe: IngestRecipe) -> list[tuple[str, str]]:
    """(feature, events column) for every vocabulary counted over events."""
    features = [("item", "item_id")] if recipe.columns.item_id else []
    features.append(("event_type", "event_type"))
    features += [(f"cat_{name}", f"cat_{name}") for name in recipe.columns.categorical]
    features += [(column, column) for column in _item_attribute_columns(recipe)[0]]
    return features


def _float_features(recipe: IngestRecipe) -> list[str]:
    """History features of floats, each also the events column it is read from (nulls read 0.0)."""
    return (["value"] if recipe.columns.value else []) + [f"num_{name}" for name in recipe.columns.numeric] \
        + _item_attribute_columns(recipe)[1]


def _item_attribute_columns(recipe: IngestRecipe) -> tuple[list[str], list[str]]:
    """The item_<name> events columns (`lumos.data.items`) of tokens (categorical and
    multi-valued attributes), and of floats (numeric ones)."""
    spec = recipe.items
    if spec is None:
        return [], []
    return [f"item_{name}" for name in (*spec.categorical, *spec.multi_valued)], [f"item_{name}" for name in spec.numeric]


def _user_vocab_features(recipe: IngestRecipe) -> list[tuple[str, str]]:
    if recipe.users is None:
        return []
    return [(f"user_{name}", f"user_{name}") for name in recipe.users.categorical]


def _feature_tokens(frame: DataFrame, features: list[tuple[str, str]]) -> DataFrame:
    """(feature, token) pairs of every row, read in one pass over `frame`."""
    return frame.select(F.inline(F.array(*_pairs(features))))


def _pairs(features: list[tuple[str, str]], counted: Column | None = None) -> list[Column]:
    """A (feature, token) struct per (feature, column); null tokens where `counted` is false."""
    return [F.struct(F.lit(feature).alias("feature"),
                     (F.col(column) if counted is None else F.when(counted, F.col(column))).alias("token"))
            for feature, column in features]


def _require(frame: DataFrame | None, name: str) -> DataFrame:
    if frame is None:
        raise ValueError(f"the recipe names a {name} source, but no {name} frame was given")
    return frame


# ---------------------------------------------------------------------------------------------
# Sequences


def build_sequences(
    events: DataFrame,
    vocab: DataFrame,
    users: DataFrame | None,
    calendar: DataFrame | None,
    recipe: IngestRecipe,
    tokens: DataFrame | None = None,
    targets: bool = True,
    builder: str = "arrow",
    time_rows: tuple[DataFrame, TimeRowsPlan] | None = None,
) -> DataFrame:
    """One row per (user, split, as_of): history arrays, static features, targets, future context.

    `events`: user_id, ts (timestamp), event_type, and where the recipe maps them item_id, value
    (double), cat_<name> (string), num_<name> (double). `users` (when recipe.users): user_id,
    user_<name>. `calendar` (when recipe.calendar): date, and one 0/1 column per flag. `vocab` is
    what `build_vocab` returned (or that table read back). `tokens` is `sequence_tokens(events,
    recipe)` when the caller keeps it persisted: the cuts, the act targets and the histories all
    read it, and without a persisted copy its per-user sort and windows run once for each.
    `targets=False` (inference: what follows as_of is what the model predicts) writes every
    act_<K>d and value_<K>d as 0 instead of joining each row to the events after it.

    Time splits are built per partition in Arrow (`lumos.data.time_rows`, one shuffle; `tokens`
    is not read); `builder="spark"` builds them with the windows and joins below, as
    leave-last-out always is (the tests hold the two to the same rows). `time_rows` is
    `time_rows_input(...)` when the caller has it already (making it collects the vocabulary).
    """
    if builder not in ("arrow", "spark"):
        raise ValueError(f"builder {builder!r}: choose arrow or spark")
    if recipe.splits.mode == "time" and builder == "arrow":
        tokens, plan = time_rows or time_rows_input(events, vocab, users, recipe, targets)
        rows = tokens.mapInArrow(partial(build_rows, plan), plan.spark_schema())
        rows = rows.withColumn("as_of", F.timestamp_micros("as_of_micros")).drop("as_of_micros")
    else:
        tokens = sequence_tokens(events, recipe) if tokens is None else tokens
        rows = cut_rows(tokens, recipe)
        if recipe.targets.horizons_days and targets:
            rows = _with_act_targets(rows, _act_events(events, tokens, recipe), recipe)
        elif recipe.targets.horizons_days:
            rows = rows.withColumns({name: F.lit(0).cast("int") if name.startswith("act_") else F.lit(0.0)
                                     for days in recipe.targets.horizons_days for name in (f"act_{days}d", f"value_{days}d")})
        rows = _with_history(rows, _user_tokens(tokens, vocab, recipe), recipe)
        if recipe.users is not None:
            rows = _with_static_features(rows, _require(users, "users"), vocab, recipe)
    if recipe.calendar is not None and recipe.calendar.flags:
        rows = _with_future_context(rows, _require(calendar, "calendar"), recipe)
    return rows.select(*output_columns(recipe))


def output_columns(recipe: IngestRecipe) -> list[str]:
    """The sequences table's columns, in their fixed order."""
    columns = ["user_id", "split", "as_of", "length", *_history_features(recipe)]
    if recipe.tokens.age_days:
        columns.append("age_days")
    if recipe.users is not None:
        columns += [f"user_{name}" for name in (*recipe.users.categorical, *recipe.users.numeric)]
    if recipe.targets.next_item:
        columns.append("next_item")
    for days in recipe.targets.horizons_days:
        columns += [f"act_{days}d", f"value_{days}d"]
    if recipe.calendar is not None:
        columns += [f"future_{flag}" for flag in recipe.calendar.flags]
    return columns


def _history_features(recipe: IngestRecipe) -> list[str]:
    """Per-token features, in the order they are written (age_days comes after, from as_of)."""
    features = [feature for feature, _ in _event_vocab_features(recipe)] + _float_features(recipe)
    if recipe.tokens.unit == "day":
        features.append("count")
    return features + ["hour", "weekday", "gap_bucket"]


# ---------------------------------------------------------------------------------------------
# Tokens: one row per token, with its place in the user's full sequence


def sequence_tokens(events: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """Events (or day tokens) with, per user, `position` (0-based), `gap_bucket`, `token_count`
    and for time splits `tokens_before_<i>`: how many tokens precede cutoff i."""
    tokens = events.withColumn("funnel_rank", _funnel_rank(recipe)).withColumn("tie_key", _tie_key(recipe))
    if recipe.tokens.unit == "day":
        tokens = _day_tokens(tokens, recipe)
    in_order = Window.partitionBy("user_id").orderBy(*[F.col(name).asc_nulls_first() for name in _token_order(recipe)])
    # The same partitioning and order with the whole user as frame: every window column below then
    # comes from one sort and one pass over each user's rows (Spark computes window expressions
    # that share partitioning and order together; three separate windows took 1.7x as long).
    whole_user = in_order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    # Tokens are in ts order, so the tokens before a cutoff are a prefix: their count is the cut.
    cuts = {
        f"tokens_before_{index}": F.count_if(F.col("ts") < _utc_midnight(cutoff.as_of)).over(whole_user).cast("int")
        for index, cutoff in enumerate(recipe.splits.cutoffs)
    }
    return (
        tokens.withColumns({
            "position": F.row_number().over(in_order) - 1,
            "previous_ts": F.lag("ts").over(in_order),
            "token_count": F.count(F.lit(1)).over(whole_user).cast("int"),
            **cuts,
        })
        .withColumn("gap_bucket", _gap_bucket(F.col("previous_ts"), F.col("ts")))
        .drop("previous_ts", "tie_key")
    )


def _token_order(recipe: IngestRecipe) -> list[str]:
    """The columns that order a user's events, most significant first (the stated tie-break)."""
    order = ["ts", "funnel_rank", "tie_key"]
    order += ["item_id"] if recipe.columns.item_id else []
    order += ["value"] if recipe.columns.value else []
    order += [f"cat_{name}" for name in recipe.columns.categorical]
    order += [f"num_{name}" for name in recipe.columns.numeric]
    # Item attributes follow from item_id, so they break no tie it leaves; listed so that a day
    # token carries its last event's attributes.
    order += [column for columns in _item_attribute_columns(recipe) for column in columns]
    return order


def _tie_key(recipe: IngestRecipe) -> Column:
    """The seeded hash that orders events tied on ts and funnel rank (see Token order)."""
    item = F.col("item_id") if recipe.columns.item_id else F.lit(None).cast("string")
    return F.xxhash64(F.lit(recipe.tokens.tie_seed), F.col("user_id"), item, F.col("ts"))


def _funnel_rank(recipe: IngestRecipe) -> Column:
    ranks = F.create_map(
        *[F.lit(part) for rank, name in enumerate(recipe.cleaning.event_types) for part in (name, rank)]
    )
    return ranks[F.col("event_type")]


def _day_tokens(events: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """One token per user and UTC day: the day's last event, its event count and its value sum."""
    # Structs compare field by field with nulls first, like the window's order, so the max struct
    # is the day's last event in token order.
    fields = [*_token_order(recipe), "event_type"]
    aggregates = [F.max(F.struct(*fields)).alias("last"), F.count(F.lit(1)).cast("int").alias("count")]
    if recipe.columns.value:
        aggregates.append(_ordered_sum(F.sort_array(F.collect_list("value"))).alias("day_value"))
    days = events.groupBy("user_id", _utc_day(F.col("ts")).alias("day")).agg(*aggregates)
    last_event = [F.col(f"last.{name}").alias(name) for name in fields if name != "value"]
    day_value = [F.col("day_value").alias("value")] if recipe.columns.value else []
    return days.select("user_id", *last_event, *day_value, "count")


def _gap_bucket(previous_ts: Column, ts: Column) -> Column:
    """0 for a user's first token, else min(15, 1 + floor(log2(1 + whole minutes since the previous)))."""
    minutes = F.floor((F.unix_micros(ts) - F.unix_micros(previous_ts)) / MICROS_PER_MINUTE)
    # floor(log2(x)) counts the powers 2^k (k ≥ 1) that are ≤ x; integer comparisons avoid a
    # floating log2 landing just below a power of two.
    doublings = sum(((minutes + 1) >= 2**k).cast("int") for k in range(1, MAX_GAP_BUCKET))
    return F.when(previous_ts.isNull(), F.lit(0)).otherwise(F.lit(1) + doublings)


# ---------------------------------------------------------------------------------------------
# Time splits, built per partition: one shuffle puts each user's tokens together in token order


def time_rows_input(events: DataFrame, vocab: DataFrame, users: DataFrame | None, recipe: IngestRecipe,
                    targets: bool) -> tuple[DataFrame, TimeRowsPlan]:
    """What `time_rows.build_rows` reads (each partition's users, each user's rows together and in
    order), and its plan: `build_sequences` maps it to the rows; inference builds and scores them
    in one pass.

    A user's tokens and (for day tokens, after them) raw act events reach the builder as one run
    of rows. The static features are joined to the tokens before the sort: the events are already
    partitioned by user (validation's shuffle), so Spark shuffles only the users table for it;
    joining them to the built rows instead shuffled every row's history arrays again.
    """
    plan = replace(_time_rows_plan(recipe, targets), token_ids=_token_ids(vocab, recipe))
    tokens = events.withColumn("funnel_rank", _funnel_rank(recipe)).withColumn("tie_key", _tie_key(recipe))
    act_types = list(recipe.targets.act_event_types)
    is_act = F.col("event_type").isin(act_types) if act_types else F.lit(True)
    with_acts = plan.targets and bool(plan.horizons_days)
    if recipe.tokens.unit == "day":
        tokens = _day_tokens(tokens, recipe).withColumn("is_act", F.lit(False))
        if with_acts:  # a day token's act targets count raw events
            value = F.col("value") if recipe.columns.value else F.lit(None).cast("double")
            acts = events.where(is_act).select("user_id", "ts", value.alias("value"),
                                               F.lit(ACT_ONLY).alias("kind"), F.lit(True).alias("is_act"))
            tokens = tokens.withColumn("kind", F.lit(TOKEN)).unionByName(acts, allowMissingColumns=True)
    else:
        tokens = tokens.withColumn("is_act", is_act)
    if recipe.users is not None:
        # A join, not a union of the users' rows into the run: Spark's join requirement is what
        # puts each user's static row beside their tokens (a union of two inputs partitioned by
        # user_id reused their partitioning, and lost every user's static row in inference).
        tokens = tokens.join(_static_features(_require(users, "users"), vocab, recipe), "user_id", "left")
    order = (["kind"] if "kind" in tokens.columns else []) + _token_order(recipe)
    in_order = tokens.repartition("user_id").sortWithinPartitions(
        "user_id", *[F.col(name).asc_nulls_first() for name in order])
    # The tokens go to the builder as they are; it maps them to their ids (TokenIds).
    inputs = ["user_id", F.unix_micros("ts").alias("ts"),
              *[F.col(column).alias(f"tok_{feature}") for feature, column in _event_vocab_features(recipe)],
              *plan.float_features, *plan.static_ids, *plan.static_floats]
    inputs += ["count"] if plan.day_counts else []
    inputs += ["is_act"] if with_acts else []
    inputs += ["kind"] if "kind" in tokens.columns else []
    return in_order.select(*inputs), plan


def _token_ids(vocab: DataFrame, recipe: IngestRecipe) -> TokenIds:
    """The event features' vocabularies, collected for the builder (a few MB for a million tokens)."""
    features = [feature for feature, _ in _event_vocab_features(recipe)]
    table = vocab.where(F.col("feature").isin(features)).select("feature", "token", "id").toArrow()
    vocabularies = {feature: ([], []) for feature in features}
    for feature, token, token_id in zip(*(table.column(name).to_pylist() for name in ("feature", "token", "id")),
                                        strict=True):
        vocabularies[feature][0].append(token)
        vocabularies[feature][1].append(token_id)
    return TokenIds(vocabularies)


def _time_rows_plan(recipe: IngestRecipe, targets: bool) -> TimeRowsPlan:
    floats = _float_features(recipe)
    return TimeRowsPlan(
        cutoffs=tuple((cutoff.split, (cutoff.as_of - EPOCH).days * MICROS_PER_DAY) for cutoff in recipe.splits.cutoffs),
        max_len=recipe.tokens.max_len,
        min_history=recipe.splits.min_history,
        id_features=tuple(feature for feature, _ in _event_vocab_features(recipe)),
        float_features=tuple(floats),
        day_counts=recipe.tokens.unit == "day",
        age_days=recipe.tokens.age_days,
        next_item=recipe.targets.next_item,
        horizons_days=tuple(recipe.targets.horizons_days),
        targets=targets,
        static_ids=tuple(_static_columns(recipe)[0]) if recipe.users else (),
        static_floats=tuple(_static_columns(recipe)[1]) if recipe.users else (),
    )


# ---------------------------------------------------------------------------------------------
# Cuts: (user_id, split, as_of, cut_position), one per sequences row


def cut_rows(tokens: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """(user_id, split, as_of, cut_position): one per row `build_sequences` writes."""
    if recipe.splits.mode == "leave_last_out":
        cuts = _leave_last_out_cuts(tokens, recipe.splits.train_targets, recipe.tokens.max_len)
        if recipe.splits.holdout_users:
            cuts = _held_out_users(cuts, recipe.splits.holdout_users, recipe.splits.holdout_seed)
    else:
        cuts = _time_cuts(tokens, recipe)
    # The history before truncation is exactly the cut_position tokens before the cut.
    return cuts.where(F.col("cut_position") >= recipe.splits.min_history)


def _leave_last_out_cuts(tokens: DataFrame, train_targets: str = "last", max_len: int = 0) -> DataFrame:
    """Test targets a user's last token, valid the one before; train the one before that, with
    "every" every earlier token too, with "windows" every (max_len + 1)-th earlier token."""
    back = F.col("token_count") - 1 - F.col("position")
    n_splits = len(LEAVE_LAST_OUT_SPLITS)
    split = F.array(*[F.lit(name) for name in LEAVE_LAST_OUT_SPLITS])[F.least(back, F.lit(n_splits - 1))]
    if train_targets == "every":
        targets = tokens
    elif train_targets == "windows":  # back = 2, 2 + (max_len + 1), ...: windows tile the train tokens
        targets = tokens.where((back < n_splits) | (F.pmod(back - (n_splits - 1), F.lit(max_len + 1)) == 0))
    else:
        targets = tokens.where(back < n_splits)
    return targets.select(
        "user_id",
        split.alias("split"),
        F.col("ts").alias("as_of"),  # the act window starts at the target token, inclusive
        F.col("position").alias("cut_position"),
    )


def _held_out_users(cuts: DataFrame, share: float, seed: int) -> DataFrame:
    """A seeded `share` of users keeps only its test cut, renamed holdout: no row of theirs trains."""
    buckets = 1_000_000
    held = F.pmod(F.xxhash64(F.lit(seed), F.col("user_id")), F.lit(buckets)) < round(share * buckets)
    kept = cuts.where(~held | (F.col("split") == LEAVE_LAST_OUT_SPLITS[0]))
    return kept.withColumn("split", F.when(held, F.lit(HOLDOUT_SPLIT)).otherwise(F.col("split")))


def _time_cuts(tokens: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """One cut per user and cutoff, at the number of the user's tokens before the cutoff."""
    cuts = [
        F.struct(
            F.lit(cutoff.split).alias("split"),
            _utc_midnight(cutoff.as_of).alias("as_of"),
            F.col(f"tokens_before_{index}").alias("cut_position"),
        )
        for index, cutoff in enumerate(recipe.splits.cutoffs)
    ]
    first_tokens = tokens.where(F.col("position") == 0)  # one per user, carrying the user's counts
    return first_tokens.select("user_id", F.inline(F.array(*cuts)))


# ---------------------------------------------------------------------------------------------
# Row parts: each takes the cut rows and adds columns


def _act_events(events: DataFrame, tokens: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """(act_user_id, act_micros, act_position, act_value): the raw events that count as acting.

    Event tokens are the raw events, and their position keeps a history event that shares the
    target's timestamp out of the act window. A day token's history ends the day before its
    target, so raw events (position null) need no such guard.
    """
    source = tokens if recipe.tokens.unit == "event" else events.withColumn("position", F.lit(None).cast("int"))
    act_types = recipe.targets.act_event_types
    acts = source.where(F.col("event_type").isin(list(act_types))) if act_types else source
    value = F.col("value") if recipe.columns.value else F.lit(None).cast("double")
    return acts.select(
        F.col("user_id").alias("act_user_id"),
        F.unix_micros("ts").alias("act_micros"),
        F.col("position").alias("act_position"),
        value.alias("act_value"),
    )


def _with_act_targets(rows: DataFrame, act_events: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """Add act_<K>d and value_<K>d per horizon K: act events in [as_of, as_of + K days)."""
    horizons = recipe.targets.horizons_days
    as_of = F.unix_micros("as_of")
    in_window = (
        (F.col("user_id") == F.col("act_user_id"))
        & (F.col("act_micros") >= as_of)
        & (F.col("act_micros") < as_of + max(horizons) * MICROS_PER_DAY)
        & F.coalesce(F.col("act_position") >= F.col("cut_position"), F.lit(True))
    )
    joined = rows.join(act_events, in_window, "left")
    matched = F.when(F.col("act_micros").isNotNull(), F.struct("act_micros", "act_value"))
    # Sorted by (time, value), so the value sums below add in a fixed order.
    grouped = joined.groupBy(*rows.columns).agg(F.sort_array(F.collect_list(matched)).alias("acts"))
    targets = [column for days in horizons for column in _horizon_targets(days, as_of)]
    return grouped.select(*rows.columns, *targets)


def _horizon_targets(days: int, as_of_micros: Column) -> list[Column]:
    """act_<days>d and value_<days>d from the row's sorted `acts` array."""
    end = as_of_micros + days * MICROS_PER_DAY
    within = F.filter("acts", lambda act: act["act_micros"] < end)
    return [
        (F.size(within) > 0).cast("int").alias(f"act_{days}d"),
        _ordered_sum(F.transform(within, _field("act_value"))).alias(f"value_{days}d"),
    ]


def _with_history(rows: DataFrame, user_tokens: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """Add `length`, one array per history feature, `age_days`, and `next_item`."""
    max_len = recipe.tokens.max_len
    cut = F.col("cut_position")
    first = F.greatest(cut - max_len, F.lit(0))
    joined = rows.join(user_tokens, F.col("user_id") == F.col("token_user_id"))
    # A user's tokens are sorted by position and hold every position within reach of a cut (see
    # _user_tokens), so a history is one contiguous run of the array, found and cut out by native
    # array functions: Spark runs a lambda over an array element by element, uncompiled, and a
    # filter over the whole array per row was most of ingest's time.
    start = F.greatest(F.array_position("positions", first), F.lit(1)).cast("int")  # 1-based; an empty history reads from 1
    target = F.array_position("positions", cut).cast("int")  # 0: no target token (a cutoff after the last token)
    with_history = joined.select(
        *rows.columns,
        F.slice("tokens", start, cut - first).alias("history"),
        F.when(target > 0, F.element_at("tokens", target)).alias("target"),
    )
    as_of_micros = F.unix_micros("as_of")
    arrays = [F.col("history")[name].alias(name) for name in _history_features(recipe)]
    age_days = F.transform(
        "history", lambda token: ((as_of_micros - token["ts_micros"]) / MICROS_PER_DAY).cast("float")
    )
    ages = [age_days.alias("age_days")] if recipe.tokens.age_days else []
    next_item = [F.col("target")["item"].alias("next_item")] if recipe.targets.next_item else []
    return with_history.select(
        *rows.columns, F.size("history").alias("length"), *arrays, *ages, *next_item
    )


def _user_tokens(tokens: DataFrame, vocab: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """(token_user_id, tokens, positions): per user, the token structs that some row reads sorted
    by position, ids mapped, and their positions.

    Only tokens within reach of a cut are kept (the target and the max_len before it), so a
    user's array is bounded by the recipe, however long their history: max_len + 3 tokens for
    leave_last_out, (max_len + 1) per cutoff for time splits. With train_targets = "every" or
    "windows" every token is some row's history or target, so the whole sequence is kept.
    """
    reachable = tokens.where(_within_reach(recipe))
    for feature, column in _event_vocab_features(recipe):
        reachable = _with_vocab_ids(reachable, column, vocab, feature)
    micros = F.unix_micros("ts")
    fields = {"position": F.col("position"), "ts_micros": micros}  # position first: it sorts the array
    fields |= {feature: F.col(feature) for feature, _ in _event_vocab_features(recipe)}
    for name in _float_features(recipe):
        fields[name] = F.coalesce(F.col(name), F.lit(0.0)).cast("float")
    if recipe.tokens.unit == "day":
        fields["count"] = F.col("count")
    fields["hour"] = F.floor(F.pmod(micros, F.lit(MICROS_PER_DAY)) / MICROS_PER_HOUR).cast("int")
    fields["weekday"] = F.pmod(_utc_day(F.col("ts")) + EPOCH_WEEKDAY, F.lit(7)).cast("int")
    fields["gap_bucket"] = F.col("gap_bucket").cast("int")
    token = F.struct(*[column.alias(name) for name, column in fields.items()])
    per_user = reachable.groupBy(F.col("user_id").alias("token_user_id")).agg(
        F.sort_array(F.collect_list(token)).alias("tokens")
    )
    return per_user.withColumn("positions", F.col("tokens")["position"])


def _within_reach(recipe: IngestRecipe) -> Column:
    """True for a token that is some row's target or within max_len before it (gap buckets are
    already computed over the full sequence, so dropping the rest changes nothing)."""
    position, max_len = F.col("position"), recipe.tokens.max_len
    if recipe.splits.mode == "leave_last_out":
        if recipe.splits.train_targets in ("every", "windows"):
            return F.lit(True)
        return position >= F.col("token_count") - len(LEAVE_LAST_OUT_SPLITS) - max_len
    cuts = [F.col(f"tokens_before_{index}") for index in range(len(recipe.splits.cutoffs))]
    return reduce(operator.or_, [(position >= cut - max_len) & (position <= cut) for cut in cuts])


def _with_vocab_ids(frame: DataFrame, column: str, vocab: DataFrame, feature: str) -> DataFrame:
    """Set `feature` (which may be `column` itself) to the `feature` vocab id of string `column`;
    null, rare and unknown tokens get OOV."""
    ids = vocab.where(F.col("feature") == feature).select(
        F.col("token").alias("vocab_token"), F.col("id").alias("vocab_id")
    )
    joined = frame.join(ids, F.col(column) == F.col("vocab_token"), "left")
    return joined.withColumn(feature, F.coalesce(F.col("vocab_id"), F.lit(OOV_ID))).drop("vocab_token", "vocab_id")


def _static_features(users: DataFrame, vocab: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """user_id and the user_<name> columns: vocab ids and floats (null where the users table is)."""
    categorical, numeric = _static_columns(recipe)
    static = users
    for column in categorical:
        static = _with_vocab_ids(static, column, vocab, column)
    return static.select("user_id", *categorical, *[F.col(column).cast("float").alias(column) for column in numeric])


def _static_columns(recipe: IngestRecipe) -> tuple[list[str], list[str]]:
    """The user_<name> columns of vocab ids, and of floats."""
    spec = recipe.users
    return [f"user_{name}" for name in spec.categorical], [f"user_{name}" for name in spec.numeric]


def _with_static_features(rows: DataFrame, users: DataFrame, vocab: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """Join user_<name> columns: vocab ids (OOV when missing) and floats (0.0 when missing)."""
    categorical, numeric = _static_columns(recipe)
    joined = rows.join(_static_features(users, vocab, recipe), "user_id", "left")
    return joined.select(
        *rows.columns,
        *[F.coalesce(F.col(column), F.lit(OOV_ID)).alias(column) for column in categorical],
        *[F.coalesce(F.col(column), F.lit(0.0).cast("float")).alias(column) for column in numeric],
    )


def _with_future_context(rows: DataFrame, calendar: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """future_<flag>: the flag on date(as_of) + d for each decoder slot d (0 where the date is absent)."""
    flags = recipe.calendar.flags
    slots = max(recipe.targets.horizons_days, default=1)
    # The calendar is small: the arrays are built once per day it can reach (one row of
    # {epoch day → flag} maps read per day), then broadcast and joined to the rows by day. Looking
    # the maps up per row was a linear scan of each map, uncompiled, for every slot of every row.
    dated = calendar.where(F.col("date").isNotNull())
    lookup = dated.agg(
        F.min(F.unix_date("date")).alias("first_date"),
        F.max(F.unix_date("date")).alias("last_date"),
        *[
            F.map_from_entries(F.collect_list(F.struct(F.unix_date("date"), F.col(flag).cast("int")))).alias(
                f"calendar_{flag}"
            )
            for flag in flags
        ],
    )
    # Days before the calendar's first date can still see it within `slots` days; later days see nothing.
    reachable_days = F.explode(F.sequence(F.col("first_date") - (slots - 1), F.col("last_date")))
    offsets = F.sequence(F.lit(0), F.lit(slots - 1))
    by_day = lookup.where(F.col("first_date").isNotNull()).select(reachable_days.alias("context_day"), "*").select(
        "context_day",
        *[F.transform(offsets, _flag_on_day(f"calendar_{flag}", F.col("context_day"))).alias(f"context_{flag}")
          for flag in flags],
    )
    no_flags = F.array_repeat(F.lit(0), slots)
    joined = rows.join(F.broadcast(by_day), _utc_day(F.col("as_of")).cast("int") == F.col("context_day"), "left")
    return joined.select(
        *rows.columns, *[F.coalesce(F.col(f"context_{flag}"), no_flags).alias(f"future_{flag}") for flag in flags]
    )


def future_context(calendar: DataFrame, recipe: IngestRecipe, dates) -> dict[datetime.date, dict[str, list[int]]]:
    """future_<flag> of the rows at each of `dates`, as `_with_future_context` gives every row:
    date → flag → the flag on date + d for each decoder slot d, 0 where the calendar lacks the
    day. One small collect of the calendar's days in reach; {} without calendar flags."""
    if recipe.calendar is None or not recipe.calendar.flags or not dates:
        return {}
    slots = max(recipe.targets.horizons_days, default=1)
    dates = sorted(set(dates))
    last = dates[-1] + datetime.timedelta(days=slots - 1)
    days = calendar.where((F.col("date") >= F.lit(dates[0])) & (F.col("date") <= F.lit(last))).collect()
    by_date = {row["date"]: row for row in days}
    flags_on = {date: [by_date.get(date + datetime.timedelta(days=slot)) for slot in range(slots)] for date in dates}
    return {date: {flag: [int(row[flag]) if row is not None else 0 for row in rows] for flag in recipe.calendar.flags}
            for date, rows in flags_on.items()}


# ---------------------------------------------------------------------------------------------
# Small helpers

# Spark reads a lambda's parameter count to choose between (element) and (element, index), so the
# per-feature lambdas are built by these factories rather than with default arguments.


def _field(name: str):
    return lambda struct: struct[name]


def _flag_on_day(calendar_map: str, first_day: Column):
    return lambda offset: F.coalesce(F.try_element_at(F.col(calendar_map), first_day + offset), F.lit(0))


def _utc_day(ts: Column) -> Column:
    """Days since 1970-01-01 in UTC, from epoch microseconds (independent of the session time zone)."""
    return F.floor(F.unix_micros(ts) / MICROS_PER_DAY)


def _utc_midnight(date: datetime.date) -> Column:
    """The timestamp of `date` at 00:00 UTC."""
    return F.timestamp_micros(F.lit((date - EPOCH).days * MICROS_PER_DAY))


def _ordered_sum(values: Column) -> Column:
    """Sum of a double array from first to last element (nulls count as 0); 0.0 when empty.

    Callers sort the array first: a plain SUM adds in shuffle order, and double addition is not
    associative, so reruns could differ in the last bits.
    """
    return F.aggregate(values, F.lit(0.0), lambda total, value: total + F.coalesce(value, F.lit(0.0)))
