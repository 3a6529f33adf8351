"""What the eval task kinds read of a task spec: its [labels] and [window] sections, and the spec
and loaded task as protocols.

`lumos.eval.tasks` holds the spec class itself, and it imports the kinds registry to check a
spec's kind (its labels, window and default metrics). The kinds are typed against the protocols
here instead of that class, so no import runs from a kind back to the task loader.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from lumos.core.config import require_valid


@dataclass(frozen=True)
class ProbeLabels:
    path: str
    """Labels table: a Parquet/CSV file (relative to the task file) with one row per user."""
    label: str
    """Column holding the label."""
    user_id: str = "user_id"
    """Column holding the user id."""
    probe: Literal["logistic", "linear"] = "logistic"
    """logistic for classes (accuracy, log_loss, auc for two), linear for numbers (rmse, mae, r2)."""
    test_fraction: float = 0.3
    """Share of users held out to score the probe; the split is seeded by user id."""
    seed: int = 0
    """Seed of the user split (or folds) and the probe fit."""
    target: Literal["classes", "label_sets"] = "classes"
    """user_label: one class per user, or a set of labels per user (a list, or one "|"-separated string)."""
    folds: int = 5
    """user_label: users are dealt into this many seeded folds, each scored once (mean ± std)."""

    def __post_init__(self) -> None:
        problems = [("test_fraction", "must be between 0 and 1")] if not 0 < self.test_fraction < 1 else []
        problems += [("folds", "must be at least 2")] if self.folds < 2 else []
        require_valid(problems)


@dataclass(frozen=True)
class TimeWindow:
    """next_items: one global cutoff, the days after it whose items are the targets, and the events
    file the targets and the popularity baselines are read from."""

    events: str
    """Events file (Parquet, relative to the task file) with a user, an item and a timestamp column:
    the same events the sequences were ingested from, including those after the cutoff."""
    cutoff: datetime.date
    """History is every event before this date (00:00 UTC); the task's split rows must be cut there."""
    days: int = 30
    """Targets: the items each user first rates in the `days` days from the cutoff."""
    recent_days: int = 7
    """The popularity_last_<N>d baseline counts the events of the N days before the cutoff."""
    recency_prior: float = 0.0
    """The model entry's item scores add this weight times log(1 + the item's events in the
    `recent_days` before the cutoff): a product of experts of the model and what is popular now,
    which a sequence model cannot see from one user's history. 0: the model alone. Choose it on an
    earlier cutoff (benchmarks/time_split_prior.py), never on this window's targets."""
    user_id: str = "user_id"
    item_id: str = "item_id"
    timestamp: str = "ts"
    """Column names in the events file (a timestamp; without a zone it reads as UTC)."""

    def __post_init__(self) -> None:
        problems = [(key, "must be at least 1") for key in ("days", "recent_days") if getattr(self, key) < 1]
        if not 0 <= self.recency_prior < math.inf:  # NaN fails both comparisons
            problems.append(("recency_prior", "must be a finite number >= 0"))
        require_valid(problems)


class TaskSpecLike(Protocol):
    """The fields of `lumos.eval.tasks.TaskSpec` that the kinds read (see there what each means)."""

    @property
    def name(self) -> str: ...
    @property
    def split(self) -> str: ...
    @property
    def metric_names(self) -> tuple[str, ...]: ...
    @property
    def ks(self) -> tuple[int, ...]: ...
    @property
    def exclude_history(self) -> bool: ...
    @property
    def horizon_days(self) -> int: ...
    @property
    def decision_threshold(self) -> float: ...
    @property
    def labels(self) -> ProbeLabels | None: ...
    @property
    def window(self) -> TimeWindow | None: ...
    @property
    def batch_size(self) -> int: ...


class LoadedTaskLike(Protocol):
    """`lumos.eval.tasks.LoadedTask`: a spec and the file it was read from (its paths are relative to it)."""

    @property
    def spec(self) -> TaskSpecLike: ...
    @property
    def path(self) -> Path: ...
