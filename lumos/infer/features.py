"""Features for one as-of date, rebuilt with the recipe and vocabulary a model was trained on.

The model's training data version names (in its Delta commit's lineage) the ingest recipe, the
exact vocab version and the sources it read. Inference reuses all three: the same validation
rules, the same tokenization and the same ids, so a user's features mean what they meant in
training. Users and items the vocabulary has never seen get the out-of-vocabulary id, like rare
tokens did in training; users with history before the date get one row each.

Nothing is dropped silently. Events that fail the recipe's rules are counted by rule and returned
as rejects (rule, reason, row), and the recipe's max_reject_fraction applies as at ingest. The
training window (cleaning.min_timestamp / max_timestamp) does not: at inference the window ends
at the as-of date, so a recipe written this year still reads next year's events.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput
from lumos.core.tables import read_table, table_location
from lumos.core.workspace import Workspace
from lumos.data.ingest import RejectCounts, count_rejects, enforce_reject_budget, read_checked_inputs
from lumos.data.sequences import build_sequences, future_context, time_rows_input
from lumos.data.time_rows import TimeRowsPlan
from lumos.data.training_data import TrainingData, as_of_recipe, require_exists
from lumos.data.user_state import any_history
from lumos.data.validation import valid_events


@dataclass(frozen=True)
class InferenceFeatures:
    rows: Any
    """One row per user with history before the date, with the sequences columns (as a frame: what
    tests and the benchmark's model-alone rate read)."""
    tokens: Any
    """What builds `rows` (`time_rows_input`): `lumos infer` builds and scores them in one pass."""
    plan: TimeRowsPlan
    future: dict[str, list[int]]
    """Calendar flag → its value on each decoder slot from the date: every row's future_<flag>."""
    rejects: Any
    """The events that failed the recipe's rules: rule, reason, row (the raw row as JSON)."""
    counts: RejectCounts
    inputs: list[LineageInput]
    """Events, users, calendar (as read) and the pinned vocab version."""
    cached: tuple[Any, ...] = ()
    """Frames persisted for `rows` and `rejects`; `release` frees them once those are written."""

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def inference_rows(spark, workspace: Workspace, data: TrainingData, as_of: datetime.date,
                   events_source: str | None = None) -> InferenceFeatures:
    """The features of users with history before `as_of`, the events rejected, and the inputs read.

    Events come from the recorded source unless `events_source` (a path, relative to the working
    directory as at ingest, or a URI) replaces it; users, calendar and items always from the
    recorded ones. A missing source, a reject fraction above the recipe's budget, or no user with history
    before the date is a UsageError: the caller writes nothing. The caller calls `release()` on
    the result once its rows and rejects are written.
    """
    from pyspark.sql import functions as F

    recipe = as_of_recipe(data, as_of, events_source)
    require_exists(recipe.source.path, "--source" if events_source else "the events source")
    for role, section in recipe.source_sections()[1:]:
        require_exists(getattr(recipe, section).path, f"the {role} source")
    sources = read_checked_inputs(spark, workspace, recipe, Path.cwd(), "--source")
    vocab = read_table(spark, workspace, data.vocab)
    inputs = [*sources.inputs, LineageInput("delta", table_location(workspace, data.vocab), data.vocab.version)]
    # As in ingest, the checked events are computed once and kept: the reject counts, the rejects
    # written, the emptiness check and the scored rows all read them, and without the cache each
    # re-read and re-checked the source.
    checked = sources.checked.persist()
    try:
        counts = count_rejects(checked)
        enforce_reject_budget(checked, counts, recipe)
        events = valid_events(checked)
        if not any_history(events, recipe, as_of):
            raise UsageError(f"no user has a valid event before {as_of} in {recipe.source.path}; pass a later "
                             "--as-of, or the --source that holds the events; nothing was written")
    except BaseException:
        checked.unpersist()
        raise
    tokens, plan = time_rows_input(events, vocab, sources.users, recipe, targets=False)
    rows = build_sequences(events, vocab, sources.users, sources.calendar, recipe, targets=False,
                           time_rows=(tokens, plan))
    future = future_context(sources.calendar, recipe, [as_of]).get(as_of, {})
    rejects = sources.rejects(counts).withColumn("as_of", F.lit(as_of))
    return InferenceFeatures(rows, tokens, plan, future, rejects, counts, inputs, cached=(checked,))
