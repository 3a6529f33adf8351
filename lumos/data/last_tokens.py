"""Each user's last tokens, kept in one row: the state that nightly inference updates instead of
rereading the whole event log (see `lumos.data.user_state`).

A time-split row for an as-of date reads only a user's last `max_len` tokens before it, their
gaps to the token before each, and the user's static features. So a row per user holding the
last `keep = max(max_len, min_history) + 1` tokens (the one extra is what the oldest kept token's
gap is measured from) rebuilds exactly the row that the whole log gives, for any date after its
last token: `time_rows_input_from_last_tokens` turns it back into what `time_rows.build_rows`
reads. Static features are not kept: they are joined from the users source each night, as a
full rebuild joins them, so a changed users table never makes the state stale.

Tokens are kept raw (strings, not vocabulary ids): the builder maps them with the model's
vocabulary, as it maps the log's tokens. A token is a struct whose fields, in order, are the
token order's columns (`sequences._token_order`), so `sort_array` puts a user's tokens in token
order, and a day token (`tokens.unit = "day"`) is the day's token as `sequences._day_tokens`
makes it.
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import (  # the token order and the builder's inputs are defined once, there
    _day_tokens,
    _event_vocab_features,
    _funnel_rank,
    _require,
    _static_features,
    _tie_key,
    _time_rows_plan,
    _token_ids,
    _token_order,
)
from lumos.data.time_rows import TimeRowsPlan


def tokens_kept(recipe: IngestRecipe) -> int:
    """How many of a user's last tokens the state keeps (see the module docstring)."""
    return max(recipe.tokens.max_len, recipe.splits.min_history) + 1


def last_tokens(events: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """(user_id, tokens): per user with a valid event in `events`, the last `tokens_kept` tokens
    (structs, see `token_fields`) in token order. `events` are valid canonical events."""
    tokens = events.withColumn("funnel_rank", _funnel_rank(recipe)).withColumn("tie_key", _tie_key(recipe))
    if recipe.tokens.unit == "day":
        tokens = _day_tokens(tokens, recipe)
    token = F.struct(*[F.col(name) for name in token_fields(recipe)])
    per_user = tokens.groupBy("user_id").agg(F.sort_array(F.collect_list(token)).alias("tokens"))
    return per_user.select("user_id", _last(F.col("tokens"), tokens_kept(recipe)).alias("tokens"))


def merged_last_tokens(earlier: DataFrame, later: DataFrame, recipe: IngestRecipe) -> DataFrame:
    """(user_id, tokens) of every user of `earlier` (the state) or `later` (`last_tokens` of newer
    events): a user of `later` gets both their token lists in token order, the last `tokens_kept`
    of them; any other user keeps their `earlier` row. One join: the state is shuffled once."""
    joined = earlier.alias("earlier").join(later.alias("later"), "user_id", "full_outer")
    both = F.concat(F.coalesce(F.col("earlier.tokens"), F.array()), F.col("later.tokens"))
    merged = F.when(F.col("later.tokens").isNull(), F.col("earlier.tokens"))
    merged = merged.otherwise(_last(F.sort_array(both), tokens_kept(recipe)))
    return joined.select("user_id", merged.alias("tokens"))


def token_fields(recipe: IngestRecipe) -> list[str]:
    """A kept token's fields: the token order's columns first (they sort it), then the rest."""
    fields = [*_token_order(recipe), "event_type"]
    return fields + (["count"] if recipe.tokens.unit == "day" else [])


def time_rows_input_from_last_tokens(state: DataFrame, vocab: DataFrame, users: DataFrame | None,
                                     recipe: IngestRecipe) -> tuple[DataFrame, TimeRowsPlan]:
    """What `sequences.time_rows_input(events, …, targets=False)` gives for the same users, from
    their last tokens: each user's rows together and in token order (one state row's tokens,
    unpacked in place), with the user's static features. `recipe` has the as-of date's cutoff."""
    plan = replace(_time_rows_plan(recipe, targets=False), token_ids=_token_ids(vocab, recipe))
    if recipe.users is not None:
        # Joined to the one row per user before unpacking: a join after it would shuffle the
        # tokens and lose their order.
        state = state.join(_static_features(_require(users, "users"), vocab, recipe), "user_id", "left")
    statics = [*plan.static_ids, *plan.static_floats]
    unpacked = state.select("user_id", *statics, F.inline("tokens"))
    inputs = ["user_id", F.unix_micros("ts").alias("ts"),
              *[F.col(column).alias(f"tok_{feature}") for feature, column in _event_vocab_features(recipe)],
              *plan.float_features, *statics]
    inputs += ["count"] if plan.day_counts else []
    return unpacked.select(*inputs), plan


def _last(tokens: Column, keep: int) -> Column:
    """The last `keep` elements of an array (all of it when shorter). Spark's slice with a start
    before the array's first element gives an empty array, hence the explicit start."""
    size = F.size(tokens)
    return F.when(size > keep, F.slice(tokens, size - keep + 1, F.lit(keep))).otherwise(tokens)
