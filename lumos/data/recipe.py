"""The ingest recipe (`ingest.toml`): how raw events become versioned training sequences.

A recipe is data: column mapping, cleaning rules, vocabularies, tokenization, splits and targets.
Relative paths in it are read relative to the recipe file.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Literal

from lumos.core.config import require_valid

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

SourceFormat = Literal["auto", "parquet", "csv", "json", "delta"]
"""How a source is read; the events, users and calendar sources take the same formats."""


@dataclass(frozen=True)
class SourceSpec:
    path: str
    """Events: a file or folder (relative to the recipe), or a Lumos table as dataset.table[@version]."""
    format: SourceFormat = "auto"
    """auto picks by file suffix; a folder of parquet parts or a _delta_log is detected too."""


@dataclass(frozen=True)
class ColumnMap:
    user_id: str
    """Source column holding the user id (read as a string)."""
    timestamp: str
    """Source column holding the event time: a timestamp, or a string Spark can parse, in UTC."""
    event_type: str
    """Source column holding the event type."""
    item_id: str | None = None
    """Source column holding the item id, if events have items."""
    value: str | None = None
    """Source column holding a numeric event value (spend, watch time), if any."""
    categorical: tuple[str, ...] = ()
    """Extra categorical columns; each gets a vocabulary and a token feature."""
    numeric: tuple[str, ...] = ()
    """Extra numeric columns; each becomes a token feature as given."""


@dataclass(frozen=True)
class UsersSpec:
    path: str
    """Static user attributes: file or folder (relative to the recipe) or dataset.table[@version]."""
    user_id: str = "user_id"
    """Column holding the user id."""
    categorical: tuple[str, ...] = ()
    """Categorical attributes; each gets a vocabulary (feature name user_<column>)."""
    numeric: tuple[str, ...] = ()
    """Numeric attributes, joined as given (missing values become 0)."""
    format: SourceFormat = "auto"
    """As for the event source."""


@dataclass(frozen=True)
class ItemsSpec:
    path: str
    """Item attributes, one row per item: file or folder (relative to the recipe) or dataset.table[@version]."""
    item_id: str = "item_id"
    """Column holding the item id, matched to the events' columns.item_id. An id listed twice is an error."""
    categorical: tuple[str, ...] = ()
    """Single-valued attributes (release year, brand); each a history-token feature item_<column>
    with its own vocabulary, counted over the valid events as event features are."""
    multi_valued: tuple[str, ...] = ()
    """Attributes holding several values (genres "Action|Comedy"), split at `separator`. The token
    is the item's set of values, sorted and joined by `separator` ("Comedy|Action" and
    "Action|Comedy" are one token): one id per history token, which the model embeds like any
    other feature (a bag of values would need a third tensor dimension in loader and model)."""
    separator: str = "|"
    """What separates the values of a multi_valued column (" " for space-separated lists)."""
    numeric: tuple[str, ...] = ()
    """Numeric attributes: history-token features item_<column> of floats (0.0 when missing)."""
    format: SourceFormat = "auto"
    """As for the event source."""

    def __post_init__(self) -> None:
        require_valid([("separator", "must not be empty")] if not self.separator else [])

    @property
    def attributes(self) -> tuple[str, ...]:
        return (*self.categorical, *self.multi_valued, *self.numeric)


@dataclass(frozen=True)
class CalendarSpec:
    path: str
    """Known future events, one row per date: file (relative to the recipe) or dataset.table[@version]."""
    date: str = "date"
    """Column holding the date."""
    flags: tuple[str, ...] = ()
    """0/1 columns (holiday, sale, …) given to each prediction slot as known-future context."""
    format: SourceFormat = "auto"
    """As for the event source."""


@dataclass(frozen=True)
class CleaningSpec:
    event_types: tuple[str, ...]
    """Allowed event types, in funnel order; the order also breaks timestamp ties. Others are rejected."""
    non_negative: tuple[str, ...] = ()
    """Recipe column roles or names (value, or an extra numeric column) that must not be negative."""
    min_timestamp: datetime.datetime | None = None
    """Events before this instant (UTC) are rejected."""
    max_timestamp: datetime.datetime | None = None
    """Events at or after this instant (UTC) are rejected."""
    reject_duplicates: bool = True
    """Exact duplicate rows (all mapped columns equal) beyond the first are rejected."""
    max_reject_fraction: float = 0.05
    """Fail the ingest, writing nothing, when more than this fraction of rows is rejected."""

    def __post_init__(self) -> None:
        # Event times are compared in UTC; an offset in the recipe is honoured, then dropped.
        for name in ("min_timestamp", "max_timestamp"):
            moment = getattr(self, name)
            if moment is not None and moment.tzinfo is not None:
                object.__setattr__(self, name, moment.astimezone(datetime.UTC).replace(tzinfo=None))
        problems = []
        if not self.event_types:
            problems.append(("event_types", "list at least one allowed event type"))
        if len(set(self.event_types)) != len(self.event_types):
            problems.append(("event_types", "lists an event type twice"))
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            problems.append(("max_reject_fraction", "must be between 0 and 1"))
        if self.min_timestamp and self.max_timestamp and self.min_timestamp >= self.max_timestamp:
            problems.append(("max_timestamp", "must be after min_timestamp"))
        require_valid(problems)


@dataclass(frozen=True)
class VocabSpec:
    min_count: int = 1
    """Tokens seen fewer times than this map to the out-of-vocabulary id."""

    def __post_init__(self) -> None:
        require_valid([("min_count", "must be at least 1")] if self.min_count < 1 else [])


@dataclass(frozen=True)
class TokenSpec:
    unit: Literal["event", "day"] = "event"
    """event: one token per event. day: one token per user and day of activity (its last event's
    features, with the day's event count and value sum)."""
    max_len: int = 200
    """Histories keep their most recent max_len tokens."""
    age_days: bool = True
    """Write age_days, each token's age in days at the row's as_of. With leave_last_out, as_of is
    the target's own time, so the ages tell the model when the next event happens: turn it off
    for a benchmark protocol in which that is unknown."""
    tie_seed: int = 0
    """Seed of the hash that orders a user's events left tied by timestamp and funnel order: the
    hash of (tie_seed, user, item, timestamp), never the item id itself, whose order the data never
    had and a model could learn (in MovieLens half of all ratings share their second)."""

    def __post_init__(self) -> None:
        require_valid([("max_len", "must be at least 1")] if self.max_len < 1 else [])


@dataclass(frozen=True)
class Cutoff:
    split: str
    """Split name written to the row (train, valid, test, …); several cutoffs may share one."""
    as_of: datetime.date
    """History is every token before this date (00:00 UTC); targets look forward from it."""


@dataclass(frozen=True)
class SplitSpec:
    mode: Literal["leave_last_out", "time"] = "leave_last_out"
    """leave_last_out: per user, test predicts the last token, valid the one before, train the one
    before that. time: one row per user and cutoff, history before the cutoff date."""
    cutoffs: tuple[Cutoff, ...] = ()
    """For mode = time: the cutoffs, e.g. [{ split = "train", as_of = 2026-08-01 }, …]."""
    min_history: int = 1
    """Rows whose history has fewer tokens than this are not written."""
    train_targets: Literal["last", "every", "windows"] = "last"
    """For mode = leave_last_out: "last" writes one train row per user (target: the third to last
    token); "every" writes one train row per token before the valid target (each prefix of the
    history predicts its next token); "windows" writes one train row per max_len + 1 tokens, back
    from the valid target, so rows tile the train tokens: with model.position_targets every
    position of a row is trained, as sequential recommenders (SASRec) train."""
    holdout_users: float = 0.0
    """For mode = leave_last_out: the share of users held out of training, chosen by a seeded hash
    of the user id. Each gets one row, split "holdout", predicting their last token from everything
    before it (where test sits), and no train, valid or test row. A validation that sits where test
    sits, for users the model never trained on: choose settings on it (data.valid_split = "holdout")
    rather than on valid (each user's second-to-last token, which the test's history holds)."""
    holdout_seed: int = 0
    """Seed of the hash that picks the held-out users."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.holdout_users < 1:
            problems.append(("holdout_users", "must be at least 0 and below 1"))
        if self.mode == "time" and self.holdout_users:
            problems.append(("holdout_users", "only used with mode = 'leave_last_out'"))
        if self.mode == "time" and self.train_targets != "last":
            problems.append(("train_targets", "only used with mode = 'leave_last_out'"))
        if self.mode == "time" and not self.cutoffs:
            problems.append(("cutoffs", "mode = 'time' needs at least one cutoff"))
        if self.mode == "leave_last_out" and self.cutoffs:
            problems.append(("cutoffs", "only used with mode = 'time'; remove them or set mode = 'time'"))
        if len({(c.split, c.as_of) for c in self.cutoffs}) != len(self.cutoffs):
            problems.append(("cutoffs", "lists the same split and date twice"))
        if any(not NAME.match(c.split) for c in self.cutoffs):
            problems.append(("cutoffs", "split names must be letters, digits and _"))
        if self.min_history < 0:
            problems.append(("min_history", "must be 0 or more"))
        require_valid(problems)


@dataclass(frozen=True)
class TargetSpec:
    next_item: bool = True
    """Write next_item: the item of the first token at or after the cut (needs columns.item_id)."""
    horizons_days: tuple[int, ...] = (7,)
    """For each K: act_<K>d (any act event in the K days from the cut) and value_<K>d (their value sum)."""
    act_event_types: tuple[str, ...] = ()
    """Event types that count as acting (e.g. purchase); empty means every event."""

    def __post_init__(self) -> None:
        problems = []
        if any(days < 1 for days in self.horizons_days):
            problems.append(("horizons_days", "every horizon must be at least 1 day"))
        if len(set(self.horizons_days)) != len(self.horizons_days):
            problems.append(("horizons_days", "lists a horizon twice"))
        require_valid(problems)


@dataclass(frozen=True)
class IngestRecipe:
    """A whole ingest recipe. Tables written: <dataset>.sequences, <dataset>.vocab, <dataset>.rejects."""

    dataset: str
    """Name of the dataset: the prefix of the tables this recipe writes."""
    source: SourceSpec
    """Where the events come from."""
    columns: ColumnMap
    """Which source columns play which role."""
    cleaning: CleaningSpec
    """What makes a row valid; invalid rows go to <dataset>.rejects with a reason."""
    users: UsersSpec | None = None
    """Optional static user attributes."""
    calendar: CalendarSpec | None = None
    """Optional calendar of known future events."""
    items: ItemsSpec | None = None
    """Optional item attributes, joined to the events by item id; events whose item the table
    lacks keep them missing (OOV ids, 0.0) and are counted (stats events_item_missing)."""
    vocab: VocabSpec = field(default_factory=VocabSpec)
    """Vocabularies of categorical features: 0 is padding, 1 is out-of-vocabulary."""
    tokens: TokenSpec = field(default_factory=TokenSpec)
    """How events become tokens."""
    splits: SplitSpec = field(default_factory=SplitSpec)
    """Which rows are written per user."""
    targets: TargetSpec = field(default_factory=TargetSpec)
    """What each row asks the model to predict."""

    def __post_init__(self) -> None:
        problems = []
        if not NAME.match(self.dataset):
            problems.append(("dataset", "must start with a letter and hold only letters, digits and _"))
        if self.targets.next_item and self.columns.item_id is None:
            problems.append(("targets.next_item", "needs columns.item_id"))
        unknown_acts = sorted(set(self.targets.act_event_types) - set(self.cleaning.event_types))
        if unknown_acts:
            problems.append(("targets.act_event_types", f"not in cleaning.event_types: {', '.join(unknown_acts)}"))
        numeric_roles = {"value"} | set(self.columns.numeric)
        unknown_checks = sorted(set(self.cleaning.non_negative) - numeric_roles)
        if unknown_checks:
            problems.append(("cleaning.non_negative", f"not a numeric column of the recipe: {', '.join(unknown_checks)}"))
        if "value" in self.cleaning.non_negative and self.columns.value is None:
            problems.append(("cleaning.non_negative", "names value, but columns.value is not set"))
        features = [*self.columns.categorical, *self.columns.numeric]
        # Extra columns name output features (cat_<name>, num_<name>, user_<name>, future_<flag>, item_<name>).
        extra_names = [
            ("columns", features),
            ("users", [*self.users.categorical, *self.users.numeric] if self.users else []),
            ("calendar.flags", list(self.calendar.flags) if self.calendar else []),
            ("items", list(self.items.attributes) if self.items else []),
        ]
        for key, names in extra_names:
            bad = [name for name in names if not NAME.match(name)]
            if bad:
                problems.append((key, f"feature columns must be letters, digits and _ (rename: {', '.join(bad)})"))
            if len(set(names)) != len(names):
                problems.append((key, "lists a column twice"))
        if self.users and "id" in [*self.users.categorical, *self.users.numeric]:
            problems.append(("users", "an attribute named 'id' would clash with user_id; rename it"))
        if self.items and "id" in self.items.attributes:
            problems.append(("items", "an attribute named 'id' would clash with item_id; rename it"))
        if self.items and self.columns.item_id is None:
            problems.append(("items", "needs columns.item_id: attributes are joined to the events by item"))
        if self.calendar and "date" in self.calendar.flags:
            problems.append(("calendar.flags", "a flag named 'date' would clash with the date column; rename it"))
        require_valid(problems)

    def source_sections(self) -> list[tuple[str, str]]:
        """(lineage role, recipe section) of every source the recipe reads, in the order ingest
        reads them and records them as lineage inputs: events, then users, calendar and items,
        each only when the recipe has it."""
        optional = [(name, name) for name in ("users", "calendar", "items") if getattr(self, name) is not None]
        return [("events", "source"), *optional]
