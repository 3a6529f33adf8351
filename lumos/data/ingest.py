"""`lumos ingest`: raw events → <dataset>.rejects, <dataset>.vocab and <dataset>.sequences.

The whole path is distributed Spark DataFrame work, so the same recipe runs on a laptop or a
cluster master. The run is idempotent: the same resolved recipe over the same input versions
finds its earlier output and writes nothing. Two ingests of one dataset never run at once on a
local workspace: each holds `<workspace>/locks/<dataset>/ingest.lock` (lumos.core.lock) from before
it reads until its last commit, and the second exits 1 at once, having written nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumos.core.config import config_hash, to_plain
from lumos.core.disk import writing_to
from lumos.core.errors import UsageError
from lumos.core.faults import crash_during_write, fault_point
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.lock import describe_holder, lease_lock
from lumos.core.progress import Report
from lumos.core.spark import job_steps
from lumos.core.tables import (
    TableRef,
    commit_table_files,
    content_hash_of,
    row_hash,
    table_exists,
    table_history,
    table_location,
    write_arrow_table,
    write_table,
)
from lumos.core.workspace import Workspace
from lumos.data.items import count_missing_items, read_items, with_item_attributes
from lumos.data.recipe import IngestRecipe
from lumos.data.sequence_files import SequenceFiles, write_sequence_files
from lumos.data.sequences import (
    build_sequences,
    number_tokens,
    sequence_tokens,
    token_counts,
    token_pairs,
    vocab_frame,
)
from lumos.data.sources import read_source
from lumos.data.validation import (
    check_columns,
    check_events,
    event_columns,
    quote_column,
    rejected_rows,
    strip_whitespace,
    valid_events,
)


@dataclass(frozen=True)
class IngestResult:
    dataset: str
    tables: dict[str, str]
    """Role (sequences, vocab, rejects) → the exact version, e.g. quickstart.sequences@2."""
    reused: bool
    """True when an earlier ingest of the same recipe and inputs was found and nothing was written."""
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckedInputs:
    """A recipe's sources read, and its events checked against its rules: what ingest builds the
    vocab and sequences from, and what inference rebuilds a date's features from."""

    raw: Any
    """The events as read."""
    checked: Any
    """`raw` checked (validation.check_events): canonical columns and why a row was rejected."""
    users: Any
    """The users frame (user_id, user_<name>), or None when the recipe has no users."""
    calendar: Any
    """The calendar frame (date, flags), or None when the recipe has no calendar."""
    items: Any
    """The items frame (item_id, item_<name>), or None when the recipe has no items; `checked`
    carries its attributes already."""
    inputs: list[LineageInput]
    """What was read: events, then users, calendar and items (each only when the recipe has it)."""

    def rejects(self, counts: RejectCounts):
        """The rejected events (rule, reason, row), with `counts` from `count_rejects(checked)`."""
        return rejected_rows(self.checked, self.raw, counts.by_rule)


@dataclass(frozen=True)
class RejectCounts:
    rows_read: int
    by_rule: dict[str, int]
    """Rule → rows it rejected, rules in name order."""

    @property
    def rejected(self) -> int:
        return sum(self.by_rule.values())

    @classmethod
    def of(cls, rows_by_rule: dict[str | None, int]) -> RejectCounts:
        """From the rows per rule, None's being the valid rows."""
        return cls(sum(rows_by_rule.values()),
                   dict(sorted((rule, count) for rule, count in rows_by_rule.items() if rule is not None)))

    def lineage_stats(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "rows_rejected": self.rejected, "rejected_by_rule": self.by_rule}


def read_checked_inputs(spark, workspace: Workspace, recipe: IngestRecipe, base_dir: Path,
                        source_key: str = "source.path", events_fingerprint: bool = True) -> CheckedInputs:
    """Read the recipe's events, users, calendar and items (relative paths against `base_dir`),
    check the events with `validation.check_events` and join the items' attributes to them: the
    one read → check chain ingest and infer share.
    `source_key` names the events location in errors (source.path, or infer's --source).
    `events_fingerprint=False`: a local events file or folder's version is left for the caller
    (`sources.read_source`'s `content_fingerprint`)."""
    raw, events_input = read_source(spark, workspace, recipe.source.path, recipe.source.format, base_dir, source_key,
                                    events_fingerprint)
    check_columns(raw, [c.source for c in event_columns(recipe)], "columns", recipe.source.path)
    users, users_input = read_users(spark, workspace, recipe, base_dir)
    calendar, calendar_input = read_calendar(spark, workspace, recipe, base_dir)
    items, items_input = read_items(spark, workspace, recipe, base_dir)
    inputs = [item for item in (events_input, users_input, calendar_input, items_input) if item is not None]
    checked = with_item_attributes(check_events(raw, recipe), items, recipe.items)
    return CheckedInputs(raw, checked, users, calendar, items, inputs)


def count_rejects(checked) -> RejectCounts:
    """Rows read and rows rejected per rule, in one pass over the checked events."""
    return RejectCounts.of({row["_rule"]: row["count"] for row in checked.groupBy("_rule").count().collect()})


RULES = "_rule"
"""The feature name under which `count_rejects_and_tokens` counts rows per rule (None: valid)."""


def count_rejects_and_tokens(checked, users, recipe: IngestRecipe):
    """`count_rejects`, and the vocabulary's token counts over the valid events (and the users
    rows: `sequences.token_counts`), in one pass over the checked events: one Spark job where
    counting them apart scanned the cached events twice. Returns the counts and an Arrow table
    of (feature, token, count) for `sequences.number_tokens`."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    rule = F.struct(F.lit(RULES).alias("feature"), F.col("_rule").alias("token"))
    pairs = checked.select(F.inline(F.array(rule, *token_pairs(recipe, counted=F.col("_rule").isNull()))))
    counts = token_counts(pairs, users, recipe, kept_feature=RULES).toArrow()
    is_rule = pc.equal(counts.column("feature"), RULES)
    rules = counts.filter(is_rule)
    by_rule = dict(zip(rules.column("token").to_pylist(), rules.column("count").to_pylist(), strict=True))
    return RejectCounts.of(by_rule), counts.filter(pc.invert(is_rule))


def run_ingest(spark, workspace: Workspace, recipe: IngestRecipe, recipe_dir: Path, report: Report = lambda _: None,
               rebuild: bool = False) -> IngestResult:
    """`rebuild`: write new versions even when an earlier ingest of the same work exists (reproduce)."""
    with dataset_lock(workspace, recipe.dataset):
        return _ingest(spark, workspace, recipe, recipe_dir, report, rebuild)


@contextlib.contextmanager
def dataset_lock(workspace: Workspace, dataset: str) -> Iterator[None]:
    """Hold the dataset's ingest lock; without it two ingests would both find no earlier ingest and
    both write, interleaving versions of sequences and vocab. A remote workspace has no shared file
    system to lock on: there Delta's concurrency check fails the later commit of each table."""
    if not workspace.is_local:
        yield
        return
    path = Path(workspace.root.removeprefix("file:")) / "locks" / dataset / "ingest.lock"

    def busy(holder: dict) -> str:
        return (f"another lumos ingest is writing dataset {dataset} ({describe_holder(holder)}); this run wrote "
                f"nothing. Wait for it and rerun (the rerun finds its tables and writes nothing when the recipe and "
                f"inputs are the same); a lock whose holder died is taken over once its lease runs out, or remove {path}")

    with lease_lock(path, busy):
        yield


def _ingest(spark, workspace: Workspace, recipe: IngestRecipe, recipe_dir: Path, report: Report,
            rebuild: bool) -> IngestResult:
    refs = {role: TableRef(recipe.dataset, role) for role in ("sequences", "vocab", "rejects")}
    report(f"reading {recipe.source.path}")
    sources = read_checked_inputs(spark, workspace, recipe, recipe_dir)
    users, calendar = sources.users, sources.calendar
    lineage_base = dict(stage="ingest", config=to_plain(recipe), config_hash=config_hash(recipe), inputs=sources.inputs)

    earlier = None if rebuild else _find_earlier_ingest(spark, workspace, refs["sequences"], LineageRecord(**lineage_base))
    if earlier is not None:
        report(f"already ingested as {earlier.tables['sequences']}; nothing written")
        return earlier

    step = job_steps(spark, "ingest", report)
    step("validating rows")
    checked = sources.checked.persist()
    try:
        counts, tokens_counted = count_rejects_and_tokens(checked, users, recipe)
        enforce_reject_budget(checked, counts, recipe)
        rows_read, rejected = counts.rows_read, counts.by_rule

        events = valid_events(checked)
        # Events whose item the items table lacks are kept (their attributes read OOV and 0.0),
        # and counted: a high count means the table and the events disagree on ids.
        items_missing = {} if sources.items is None else {
            "events_item_missing": count_missing_items(events, sources.items)}
        step("building vocabularies")
        vocab_table = number_tokens(tokens_counted)
        vocab, vocab_rows = vocab_frame(spark, vocab_table), vocab_table.num_rows
        tokens = None
        if recipe.splits.mode == "leave_last_out":
            # Its cuts, act targets and histories all read each user's numbered tokens: kept once.
            step("ordering each user's tokens")
            tokens = sequence_tokens(events, recipe).persist()
        step("building sequences")
        rows = _sequence_rows(spark, workspace, refs["sequences"], events, vocab, users, calendar, recipe, tokens)
        try:
            summary = rows.summary()
            stats = {
                "rows_read": rows_read,
                "rows_rejected": sum(rejected.values()),
                "rejected_by_rule": rejected,
                "events": rows_read - counts.rejected,
                **items_missing,
                "users": summary.users,
                "tokens": sum(summary.tokens_by_split.values()),
                "rows_by_split": summary.rows_by_split,
                "content_hash": summary.content_hash,
            }
            step("writing tables")
            rejects = sources.rejects(counts)
            rejects_lineage = LineageRecord(**lineage_base, stats={"rows": stats["rows_rejected"],
                                                                   "rejected_by_rule": rejected})
            vocab_lineage = LineageRecord(**lineage_base, stats={"rows": vocab_rows})
            if workspace.is_local and not counts.rejected:  # an empty version: no file, no Spark job
                written = {"rejects": commit_table_files(spark, workspace, refs["rejects"], [], rejects.schema,
                                                         rejects_lineage)}
            else:
                written = {"rejects": write_table(spark, workspace, refs["rejects"], rejects, rejects_lineage)}
            fault_point("after_rejects")  # test hooks: lumos.core.faults
            with crash_during_write("mid_vocab", table_location(workspace, refs["vocab"])):
                if workspace.is_local:  # on the driver already: one file, no Spark job
                    written["vocab"] = write_arrow_table(spark, workspace, refs["vocab"], vocab_table, vocab.schema,
                                                         vocab_lineage)
                else:
                    written["vocab"] = write_table(spark, workspace, refs["vocab"], vocab.coalesce(1), vocab_lineage)
            fault_point("before_sequences")
            # Sequences last: its lineage names the exact vocab and rejects versions of this run,
            # and its presence marks the ingest as complete (the idempotency check reads it).
            tables = {role: str(ref) for role, ref in written.items()}
            written["sequences"] = rows.write(spark, workspace, refs["sequences"],
                                              LineageRecord(**lineage_base, stats={**stats, "tables": tables}))
        finally:
            rows.release()
            if tokens is not None:
                tokens.unpersist()
    finally:
        checked.unpersist()
        step(None)
    tables = {role: str(written[role]) for role in ("sequences", "vocab", "rejects")}
    return IngestResult(recipe.dataset, tables, reused=False, stats=stats)


def _sequence_rows(spark, workspace: Workspace, ref: TableRef, events, vocab, users, calendar, recipe: IngestRecipe,
                   tokens) -> _CachedRows | _FileRows:
    """Time splits in a local workspace: written as Parquet by the Python workers that build them
    (`lumos.data.sequence_files`; Spark's writer was most of an ingest's write). Otherwise built by
    Spark and cached, then written by Spark's writer."""
    if recipe.splits.mode == "time" and workspace.is_local:
        location = table_location(workspace, ref)
        with writing_to(location):
            return _FileRows(write_sequence_files(events, vocab, users, calendar, recipe, location))
    return _CachedRows(build_sequences(events, vocab, users, calendar, recipe, tokens).persist(), events)


@dataclass(frozen=True)
class RowsSummary:
    """What ingest records of the sequences rows it built."""

    rows_by_split: dict[str, int]
    tokens_by_split: dict[str, int]
    content_hash: str
    """What `lumos reproduce` compares a rebuild against."""
    users: int
    """Users with valid events."""


@dataclass
class _CachedRows:
    """Rows Spark built and cached: counted and hashed from the cache, then written by Spark."""

    frame: Any
    events: Any
    """The valid events the rows were built from."""

    def summary(self) -> RowsSummary:
        """One pass over the rows (the hash summed per split), and one over the events' users."""
        from pyspark.sql import functions as F

        summary = sorted(self.frame.groupBy("split").agg(
            F.count(F.lit(1)).alias("rows"), F.sum("length").alias("tokens"), F.sum(row_hash(self.frame)).alias("hash"),
        ).collect(), key=lambda row: row["split"])
        rows_by_split = {row["split"]: row["rows"] for row in summary}
        return RowsSummary(rows_by_split, {row["split"]: row["tokens"] or 0 for row in summary},
                           content_hash_of(sum(row["hash"] for row in summary), sum(rows_by_split.values())),
                           self.events.select("user_id").distinct().count())

    def write(self, spark, workspace: Workspace, ref: TableRef, lineage: LineageRecord) -> TableRef:
        return write_table(spark, workspace, ref, self.frame, lineage)

    def release(self) -> None:
        self.frame.unpersist()


class _FileRows:
    """Rows already written into the table's folder, counted and hashed by the writers (an
    `arrow_hash` content hash): committed as the new version, or deleted if the ingest stops
    before that."""

    def __init__(self, files: SequenceFiles) -> None:
        self.files, self.committed = files, False

    def summary(self) -> RowsSummary:
        """As the writers counted and hashed what they wrote (and the users they read)."""
        splits = self.files.splits
        return RowsSummary({name: split.rows for name, split in splits.items()},
                           {name: split.tokens for name, split in splits.items()}, self.files.content_hash,
                           self.files.users)

    def write(self, spark, workspace: Workspace, ref: TableRef, lineage: LineageRecord) -> TableRef:
        version = commit_table_files(spark, workspace, ref, self.files.files, self.files.schema, lineage)
        self.committed = True
        return version

    def release(self) -> None:
        if not self.committed:
            self.files.discard()


def enforce_reject_budget(checked, counts: RejectCounts, recipe: IngestRecipe) -> None:
    """A UsageError (nothing written) when the source is empty or more than
    cleaning.max_reject_fraction of its rows failed the recipe's rules."""
    rows_read, rejected, total = counts.rows_read, counts.by_rule, counts.rejected
    if rows_read == 0:
        raise UsageError(f"{recipe.source.path}: the source has no rows; nothing was written")
    fraction = total / rows_read
    if fraction <= recipe.cleaning.max_reject_fraction:
        return
    examples = [row["_reason"] for row in checked.where(checked["_rule"].isNotNull()).select("_reason").limit(3).collect()]
    by_rule = ", ".join(f"{rule} {count}" for rule, count in rejected.items())
    raise UsageError(
        f"{total} of {rows_read} rows ({fraction:.1%}) failed validation, more than "
        f"cleaning.max_reject_fraction = {recipe.cleaning.max_reject_fraction}; nothing was written.\n"
        f"  by rule: {by_rule}\n" + "".join(f"  e.g. {reason}\n" for reason in examples)
        + "  Fix the source or the recipe's column mapping, or raise cleaning.max_reject_fraction."
    )


def _find_earlier_ingest(spark, workspace: Workspace, sequences: TableRef, wanted: LineageRecord) -> IngestResult | None:
    if not table_exists(spark, table_location(workspace, sequences)):
        return None
    for entry in table_history(spark, workspace, sequences):
        if entry.lineage is not None and entry.lineage.same_work(wanted):
            stats = dict(entry.lineage.stats)
            tables = {**stats.pop("tables", {}), "sequences": str(sequences.at(entry.version))}
            return IngestResult(sequences.dataset, tables, reused=True, stats=stats)
    return None


def read_users(spark, workspace: Workspace, recipe: IngestRecipe, recipe_dir: Path):
    from pyspark.sql import functions as F

    spec = recipe.users
    if spec is None:
        return None, None
    frame, source_input = read_source(spark, workspace, spec.path, spec.format, recipe_dir, "users.path")
    check_columns(frame, [spec.user_id, *spec.categorical, *spec.numeric], "users", spec.path)
    users = frame.select(
        strip_whitespace(F.col(quote_column(spec.user_id))).alias("user_id"),
        *[F.col(quote_column(name)).cast("string").alias(f"user_{name}") for name in spec.categorical],
        *[F.col(quote_column(name)).cast("double").alias(f"user_{name}") for name in spec.numeric],
    ).where(F.col("user_id").isNotNull() & (F.col("user_id") != ""))
    duplicated = users.groupBy("user_id").count().where(F.col("count") > 1).limit(3).collect()
    if duplicated:
        names = ", ".join(row["user_id"] for row in duplicated)
        raise UsageError(f"users.path = {spec.path!r}: user ids appear more than once (e.g. {names}); keep one row per user")
    return users, source_input


def read_calendar(spark, workspace: Workspace, recipe: IngestRecipe, recipe_dir: Path):
    from pyspark.sql import functions as F

    spec = recipe.calendar
    if spec is None:
        return None, None
    frame, source_input = read_source(spark, workspace, spec.path, spec.format, recipe_dir, "calendar.path")
    check_columns(frame, [spec.date, *spec.flags], "calendar", spec.path)
    calendar = frame.select(
        F.to_date(F.col(quote_column(spec.date))).alias("date"),
        *[F.coalesce(F.col(quote_column(flag)).cast("int"), F.lit(0)).alias(flag) for flag in spec.flags],
    )
    if calendar.where(F.col("date").isNull()).limit(1).count():
        raise UsageError(f"calendar.path = {spec.path!r}: column {spec.date!r} holds values that are not dates")
    return calendar, source_input
