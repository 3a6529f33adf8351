"""The per-user state of nightly inference: `<dataset>.user_state`, one row per user with their
last tokens (`lumos.data.last_tokens`), so a night reads the day's new events, not the whole log.

A night is two calls: `read_night` chooses the mode and reads and checks the events it needs;
`write_night` writes the night's rejects (partition as_of of `<dataset>.infer_rejects`), moves the
state to the date and reads back what scoring needs. `lumos.infer.run` scores between that and
the predictions commit.

**Modes.** A night is *incremental* when the newest state version can be carried forward: it was
built for the model's recipe and vocabulary and the same events source, its date is on or before
the as-of date, the source only grew by new files since (a folder's files, or a local Delta
table's, compared with the listing the state recorded: `event_files`), and the predictions commit
of its run names it (see Kills). It then reads the new files, and the recorded files holding
events on or after the state's date (the listing records each file's latest event), keeping the
events with timestamps in [state date, as-of date), plus the new files' events from before the
state date (*late* events), checked by the recipe's rules. Users with late events are recomputed
from the whole log; every other user with new events gets their state tokens and new tokens
merged. Anything else is a *full* rebuild from the whole log,
and the night says why (first run, --full, changed recipe or vocab, an earlier date, a rewritten
source, an interrupted run).

**One commit.** The new state is written as an overwrite of the whole table (unchanged users and
updated users): one Delta commit. A MERGE would rewrite every file holding a changed user, and a
day's activity touches users spread over nearly every file, so it would rewrite about as much
while also joining the table to the changes; the overwrite is simpler and cannot half-apply.

**Kills.** The state is written before the predictions, and the predictions commit names the
state version it scored from. A state version that no predictions commit names was left by a
run killed between the two commits; the next night does not trust it and rebuilds. So, as seen
by the next run, a date's state and predictions both advanced or neither did.

**Equality.** Every night, full or incremental, scores from the state as written, so the two modes
share one scoring path; the integration test drives a sequence of dates (skipped nights, reruns,
an earlier date, late events) and compares each night's predictions with a full rebuild's.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumos.core.config import config_hash, to_plain
from lumos.core.errors import UsageError
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.tables import TableRef, read_table, table_exists, table_history, table_location, write_table
from lumos.core.workspace import Workspace
from lumos.data.contract import FeatureSpec
from lumos.data.event_files import EventFile, event_times, fingerprinted, with_event_times
from lumos.data.ingest import RejectCounts, count_rejects, enforce_reject_budget, read_checked_inputs
from lumos.data.items import with_item_attributes
from lumos.data.predictions import write_partition
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import EPOCH, future_context
from lumos.data.sources import quote_column, read_source_files, source_files
from lumos.data.time_rows import MICROS_PER_DAY, TimeRowsPlan
from lumos.data.training_data import TrainingData, as_of_recipe, item_tokens, require_exists
from lumos.data.validation import check_events, rejected_rows, strip_whitespace, valid_events

STATE_TABLE = "user_state"
REJECTS_TABLE = "infer_rejects"  # <dataset>.infer_rejects: one partition per date, as predictions
FULL, INCREMENTAL = "full", "incremental"
STAGE = "infer"


@dataclass(frozen=True)
class StateKey:
    """What a state is valid for: a state built for another key is rebuilt, never carried forward."""

    recipe_hash: str
    vocab: str
    events: str
    """The events source's location."""
    tokens_kept: int


@dataclass(frozen=True)
class StateVersion:
    """One committed version of the state table, as its lineage describes it."""

    ref: TableRef
    as_of: datetime.date
    key: StateKey
    events: LineageInput
    files: dict[str, EventFile] | None
    """The events source's files as consumed (`event_files`); None when it is not a folder or table of files."""


@dataclass
class Night:
    """One night's events read and checked, and how the state moves forward with them."""

    mode: str
    reason: str
    as_of: datetime.date
    recipe: IngestRecipe
    """The training recipe with the as-of date's cutoff (`training_data.as_of_recipe`)."""
    vocab: TableRef
    """The pinned vocabulary version the model was trained with."""
    output: TableRef
    """The predictions table the night's run writes: its commits confirm a state version (`last_state`)."""
    state: TableRef
    previous: StateVersion | None
    """The state carried forward (incremental), or None (full)."""
    log: Any
    """The whole events source as read (raw): users with late events are recomputed from it."""
    checked: Any
    """The events read tonight, checked (persisted; `release` frees them)."""
    counts: RejectCounts
    rejects: Any
    """The rejected events among them: rule, reason, row, as_of."""
    users: Any
    calendar: Any
    items: Any
    """The recipe's items table (None without [items]): its attributes join every checked event."""
    inputs: list[LineageInput]
    """Events, users and calendar as read, and the pinned vocab version."""
    files: dict[str, EventFile] | None
    """The events source's files, hashed and with their latest events (`event_files`)."""
    key: StateKey
    late_files: list[str] = field(default_factory=list)
    """New files with events before the state's date (incremental): the only ones read for them."""
    late_users: int = 0
    """Users with late events (timestamps before the state's date, in new files): recomputed from the log."""
    cached: list = field(default_factory=list)

    @property
    def events_read(self) -> int:
        return self.counts.rows_read

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


@dataclass(frozen=True)
class NightWritten:
    """What a night wrote (its rejects and the state moved to its date) and what scoring reads of
    it: every user of the state as written, with ages, gaps and calendar context for the date."""

    rejects: TableRef
    """The rejects table version written for the date, e.g. quickstart.infer_rejects@3."""
    state: TableRef
    """The user state version written, e.g. quickstart.user_state@4."""
    users_updated: int
    tokens: Any
    """(`scoring.score_tokens`'s input) each user's last tokens, with the vocabulary's ids."""
    plan: TimeRowsPlan
    future: dict[str, list[int]]
    """Calendar flag → its value on each decoder slot from the date."""
    item_tokens: tuple[str, ...]
    """Vocabulary id → item token, to name the recommendations (`training_data.item_tokens`)."""
    state_write_seconds: float
    """The state's Delta write (the updated users already computed and cached)."""


def read_night(spark, workspace: Workspace, data: TrainingData, as_of: datetime.date, events_source: str | None,
               predictions: TableRef, full: bool) -> Night:
    """Choose the mode for `as_of`, read the events it needs and check them (rejects as at ingest,
    the recipe's reject budget applied to the rows read). The caller calls `release()` at the end."""
    from pyspark.sql import functions as F

    recipe = as_of_recipe(data, as_of, events_source)
    require_exists(recipe.source.path, "--source" if events_source else "the events source")
    for role, section in recipe.source_sections()[1:]:
        require_exists(getattr(recipe, section).path, f"the {role} source")
    # The events' version waits for the mode: an incremental night hashes only the new files.
    sources = read_checked_inputs(spark, workspace, recipe, Path.cwd(), "--source", events_fingerprint=False)
    listed = source_files(spark, sources.inputs[0])
    key = StateKey(config_hash(to_plain(data.recipe)), str(data.vocab), sources.inputs[0].uri, _tokens_kept(recipe))
    state = TableRef(recipe.dataset, STATE_TABLE)
    previous = last_state(spark, workspace, state, predictions)
    reason = "--full" if full else _rebuild_reason(previous, key, as_of, sources.inputs[0], listed)
    if reason is None:
        mode, reason = INCREMENTAL, f"state of {previous.as_of} ({previous.ref}) carried forward"
    else:
        mode, previous = FULL, None
    events_input, files = fingerprinted(sources.inputs[0], listed, previous.files if previous and previous.files else {})
    inputs = [events_input, *sources.inputs[1:],
              LineageInput("delta", table_location(workspace, data.vocab), data.vocab.version)]
    if mode == INCREMENTAL:
        raw, files = _new_rows(spark, sources.raw, previous, events_input, files, recipe, as_of)
        checked = _checked(raw, recipe, sources.items)
    else:
        raw, checked = sources.raw, sources.checked
        if files is not None:  # every file's event times, for the nights that carry this state forward
            files = with_event_times(files, list(files), event_times(raw, _raw_timestamp(recipe)))
    checked = checked.persist()
    night = Night(mode=mode, reason=reason, as_of=as_of, recipe=recipe, vocab=data.vocab, output=predictions,
                  state=state, previous=previous,
                  log=sources.raw, checked=checked, counts=RejectCounts(0, {}), rejects=None, users=sources.users,
                  calendar=sources.calendar, items=sources.items, inputs=inputs, files=files, key=key,
                  late_files=_late_files(files, previous), cached=[checked])
    try:
        night.counts = count_rejects(checked)
        if mode == FULL or night.counts.rows_read:  # a night with no new events has nothing to budget
            enforce_reject_budget(checked, night.counts, recipe)
        if mode == FULL and not any_history(valid_events(checked), recipe, as_of):
            raise UsageError(f"no user has a valid event before {as_of} in {recipe.source.path}; pass a later "
                             "--as-of, or the --source that holds the events; nothing was written")
    except BaseException:
        night.release()
        raise
    night.rejects = rejected_rows(checked, raw, night.counts.by_rule).withColumn("as_of", F.lit(as_of))
    return night


def write_night(spark, workspace: Workspace, night: Night, model: str, features: FeatureSpec) -> NightWritten:
    """Write the night's rejects (`_write_rejects`), then move the state to its date in one commit,
    and read back what the model `model` (its version label) scores with `features`."""
    from lumos.data.last_tokens import time_rows_input_from_last_tokens

    rejects = _write_rejects(spark, workspace, night, model)
    state, users_updated, write_seconds = _write_state(spark, workspace, night)
    vocab = read_table(spark, workspace, night.vocab)
    tokens, plan = time_rows_input_from_last_tokens(read_table(spark, workspace, state), vocab, night.users, night.recipe)
    future = future_context(night.calendar, night.recipe, [night.as_of]).get(night.as_of, {})
    return NightWritten(rejects, state, users_updated, tokens, plan, future,
                        item_tokens(spark, workspace, night.vocab, features), write_seconds)


def _write_rejects(spark, workspace: Workspace, night: Night, model: str) -> TableRef:
    """Replace partition as_of of <dataset>.infer_rejects with the rejected events among those the
    night read (rule, reason, row), even when there are none, so the partition always describes
    the latest run."""
    rejects = TableRef(night.output.dataset, REJECTS_TABLE)
    request = {"model": model, "as_of": night.as_of.isoformat(), "rejects_for": night.output.name, "mode": night.mode}
    lineage = LineageRecord(stage=STAGE, config=request, config_hash=config_hash(request), inputs=night.inputs,
                            stats={"rows": night.counts.rejected, **night.counts.lineage_stats()})
    return write_partition(spark, workspace, rejects, night.rejects, night.as_of, lineage)


def _write_state(spark, workspace: Workspace, night: Night) -> tuple[TableRef, int, float]:
    """Move the state to the night's date in one commit (an overwrite, see the module docstring):
    (the version written, users updated, the write's seconds)."""
    from lumos.data.last_tokens import last_tokens

    events = valid_events(night.checked)
    if night.mode == FULL:
        updated = last_tokens(_before(events, night.as_of), night.recipe)
        updated = updated.persist()
        night.cached.append(updated)
        users_updated = updated.count()
    else:
        updated, users_updated = _carried_forward(spark, workspace, night, events)
    started = time.perf_counter()
    written = write_table(spark, workspace, night.state, updated, _lineage(workspace, night, users_updated))
    return written, users_updated, time.perf_counter() - started


def _carried_forward(spark, workspace: Workspace, night: Night, events):
    """(the state carried to the night's date, users updated): the state's users joined once with
    the users of tonight's newer events (their tokens merged), and users with late events
    recomputed from the log in place of their state rows."""
    from lumos.data.last_tokens import last_tokens, merged_last_tokens

    start = night.previous.as_of
    state = read_table(spark, workspace, night.previous.ref)
    newer = events.where(~_before_column(start))
    relearned = None
    if night.late_files:  # else no event read tonight is before the state's date
        late = _before(events, start).select("user_id").distinct().persist()
        night.cached.append(late)
        night.late_users = late.count()
        if night.late_users:
            state, newer = state.join(late, "user_id", "left_anti"), newer.join(late, "user_id", "left_anti")
            relearned = last_tokens(_before(_log_of(night, late), night.as_of), night.recipe)
    tonight = last_tokens(newer, night.recipe).persist()  # counted, then merged
    night.cached.append(tonight)
    users_updated = tonight.count() + night.late_users
    updated = merged_last_tokens(state, tonight, night.recipe)
    return (updated if relearned is None else updated.unionByName(relearned)), users_updated


def last_state(spark, workspace: Workspace, state: TableRef, predictions: TableRef) -> StateVersion | None:
    """The newest version of the state table, when some predictions commit names it; else None
    (no state yet, or a run that died between the state's commit and its predictions')."""
    location = table_location(workspace, state)
    if not table_exists(spark, location):
        return None
    newest = table_history(spark, workspace, state, limit=1)[0]
    if newest.lineage is None or "as_of" not in newest.lineage.stats:
        return None
    named = LineageInput("delta", location, newest.version)
    scored = table_exists(spark, table_location(workspace, predictions)) and any(
        entry.lineage is not None and named in entry.lineage.inputs
        for entry in table_history(spark, workspace, predictions, limit=20))
    if not scored:
        return _unconfirmed(state.at(newest.version))
    stats = newest.lineage.stats
    return StateVersion(state.at(newest.version), datetime.date.fromisoformat(stats["as_of"]), StateKey(**stats["key"]),
                        LineageInput(**stats["events"]), _recorded_files(stats.get("source_files")))


def _recorded_files(recorded: dict | None) -> dict[str, EventFile] | None:
    """The files a state's lineage records; None also for a listing without per-file records (an
    older lumos recorded only identities), which `_rebuild_reason` rebuilds."""
    if not recorded or not all(isinstance(item, dict) for item in recorded.values()):
        return None
    return {uri: EventFile(**item) for uri, item in recorded.items()}


def _unconfirmed(ref: TableRef) -> StateVersion:
    """A state version no predictions commit names: an empty key, so that it is rebuilt."""
    return StateVersion(ref, datetime.date.min, StateKey("", "", "", 0), LineageInput("", ""), None)


def _rebuild_reason(previous: StateVersion | None, key: StateKey, as_of: datetime.date, events: LineageInput,
                    files: dict[str, str] | None) -> str | None:
    """Why the night must rebuild the state from the whole log; None when it can carry it forward.
    `files`: the events source's listing tonight (`sources.source_files`), compared with the
    state's; a source without one is compared by version."""
    if previous is None:
        return "no state yet (first run)"
    if previous.as_of == datetime.date.min:
        return (f"{previous.ref} is named by no predictions commit of this output (a run stopped between the "
                "two, or the state was last written for another --output)")
    if previous.key.recipe_hash != key.recipe_hash or previous.key.tokens_kept != key.tokens_kept:
        return "the model's recipe differs from the state's"
    if previous.key.vocab != key.vocab:
        return f"the model's vocabulary {key.vocab} differs from the state's {previous.key.vocab}"
    if previous.key.events != key.events:
        return f"the events source {key.events} differs from the state's {previous.key.events}"
    if as_of < previous.as_of:
        return f"{as_of} is before the state's date {previous.as_of}"
    if files is not None and previous.files is None:
        return "the state records no per-file listing of the events source (an older lumos wrote it)"
    if files is None:
        if previous.events.version == events.version:
            return None
        return f"the events source changed and is not a folder of files or a local Delta table ({events.kind})"
    rewritten = [name for name, item in previous.files.items() if files.get(name) != item.identity]
    if rewritten:
        return f"the events source was rewritten, not appended ({len(rewritten)} files changed or gone, e.g. {rewritten[0]})"
    return None


def _new_rows(spark, raw, previous: StateVersion, events: LineageInput, files: dict[str, EventFile] | None,
              recipe: IngestRecipe, as_of: datetime.date):
    """(the raw rows tonight reads, the files with the new ones' latest events). Rows with
    timestamps in [state date, as_of) from the recorded files whose latest event is on or after
    the state date, and every new file's rows before as_of or with no readable time (late events
    and rejects among them). A source without a listing (read by version, unchanged) is filtered
    whole."""
    from pyspark.sql import functions as F

    ts = _raw_timestamp(recipe)
    start, end = _utc_midnight(previous.as_of), _utc_midnight(as_of)
    if files is None:
        return raw.where((ts >= start) & (ts < end)), None
    start_micros = _midnight_micros(previous.as_of)
    reopened = sorted(uri for uri, item in previous.files.items()
                      if item.last_event is not None and item.last_event >= start_micros)
    new = sorted(set(files) - set(previous.files))
    parts = []
    if reopened:
        parts.append(read_source_files(spark, events, recipe.source.format, reopened).where((ts >= start) & (ts < end)))
    if new:
        arrived = read_source_files(spark, events, recipe.source.format, new)
        files = with_event_times(files, new, event_times(arrived, ts))
        parts.append(arrived.where(ts.isNull() | (ts < end)))
    if not parts:
        return raw.where(F.lit(False)), files  # nothing to read: Spark scans no file for it
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part, allowMissingColumns=True)
    return rows, files


def _late_files(files: dict[str, EventFile] | None, previous: StateVersion | None) -> list[str]:
    """The new files whose first event is before the state's date: tonight reads the recorded
    files from that date on, so only these can hold late events. None on a full night."""
    if previous is None or files is None:
        return []
    start = _midnight_micros(previous.as_of)
    return sorted(uri for uri, item in files.items()
                  if uri not in (previous.files or {}) and item.first_event is not None and item.first_event < start)


def _log_of(night: Night, users):
    """The valid events of `users` in the whole log, checked as a full rebuild checks them (the
    rules, the duplicate one too, compare a user's events only with their own)."""
    from pyspark.sql import functions as F

    user = strip_whitespace(F.col(quote_column(night.recipe.columns.user_id)))  # the user_id validation reads
    theirs = night.log.join(users.withColumnRenamed("user_id", "_late_user"), user == F.col("_late_user"), "left_semi")
    return valid_events(_checked(theirs, night.recipe, night.items))


def _checked(raw, recipe: IngestRecipe, items):
    """Events checked by the recipe's rules with the items' attributes joined, as ingest and a full
    rebuild check them (`read_checked_inputs`)."""
    return with_item_attributes(check_events(raw, recipe), items, recipe.items)


def _lineage(workspace: Workspace, night: Night, users_updated: int) -> LineageRecord:
    request = {"state_for": night.recipe.dataset, "as_of": night.as_of.isoformat(), "mode": night.mode}
    events = night.inputs[0]
    return LineageRecord(
        stage=STAGE,
        config=request,
        config_hash=config_hash(request),
        inputs=night.inputs if night.previous is None else [*night.inputs, LineageInput(
            "delta", table_location(workspace, night.previous.ref), night.previous.ref.version)],
        stats={"as_of": night.as_of.isoformat(), "key": to_plain(night.key), "events": to_plain(events),
               "source_files": to_plain(night.files), "mode": night.mode, "reason": night.reason,
               "events_read": night.events_read, "users_updated": users_updated, "late_users": night.late_users,
               **night.counts.lineage_stats()},
    )


def any_history(events, recipe: IngestRecipe, as_of: datetime.date) -> bool:
    """Whether some user has splits.min_history tokens before `as_of` (a row to score)."""
    from pyspark.sql import functions as F

    if recipe.splits.min_history == 0:  # every user with an event has a row, its history maybe empty
        return events.limit(1).count() > 0
    before = events.where(F.unix_micros("ts") < _midnight_micros(as_of))
    if recipe.splits.min_history == 1:
        return before.limit(1).count() > 0
    if recipe.tokens.unit == "day":
        before = before.select("user_id", F.floor(F.unix_micros("ts") / MICROS_PER_DAY).alias("day")).distinct()
    enough = before.groupBy("user_id").count().where(F.col("count") >= recipe.splits.min_history)
    return enough.limit(1).count() > 0


def _tokens_kept(recipe: IngestRecipe) -> int:
    from lumos.data.last_tokens import tokens_kept

    return tokens_kept(recipe)


def _before(events, date: datetime.date):
    return events.where(_before_column(date))


def _before_column(date: datetime.date):
    from pyspark.sql import functions as F

    return F.unix_micros("ts") < _midnight_micros(date)


def _raw_timestamp(recipe: IngestRecipe):
    """The events' time as validation reads it (`check_events` casts the column so)."""
    from pyspark.sql import functions as F

    return F.col(quote_column(recipe.columns.timestamp)).cast("timestamp")


def _utc_midnight(date: datetime.date):
    from pyspark.sql import functions as F

    return F.timestamp_micros(F.lit(_midnight_micros(date)))


def _midnight_micros(date: datetime.date) -> int:
    """`date` at 00:00 UTC in unix microseconds: where a night's window starts and ends."""
    return (date - EPOCH).days * MICROS_PER_DAY
