"""The knobs of the synthetic world (`SyntheticSpec`) and what a generation wrote (`SyntheticSummary`)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from lumos.core.config import require_valid

CHURN_QUIET_DAYS = 14
"""A churned user stops at least this many days before the period ends."""


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of the synthetic world; the same spec always gives the same bytes."""

    users: int = 2000
    """Number of users; every one appears in users.parquet and labels.parquet and has an event."""
    events: int = 200_000
    """Total number of events, hit exactly; shared among users by their activity level."""
    items: int = 500
    """Catalog size."""
    clusters: int = 8
    """Latent taste clusters, which are also the item categories ("c0", "c1", ...)."""
    start: datetime.date = datetime.date(2026, 6, 1)
    """First day of activity; timestamps are naive and mean UTC."""
    days: int = 120
    """Length of the activity period in days; the calendar runs 60 days longer."""
    churn_fraction: float = 0.2
    """Share of users who stop all activity on a random day of the second half of the period."""
    seed: int = 0
    """Random seed; every output file is a function of the whole spec."""
    users_per_file: int = 50_000
    """Users per events part file; one block is generated at a time, which bounds memory (about
    250 bytes per event of a block at peak)."""

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if self.users < 1:
            problems.append(("users", f"must be at least 1, got {self.users}"))
        if self.events < self.users:
            problems.append(("events", f"must be at least users ({self.users}), since every user has an event"))
        if self.clusters < 1:
            problems.append(("clusters", f"must be at least 1, got {self.clusters}"))
        if self.items < self.clusters:
            problems.append(("items", f"must be at least clusters ({self.clusters})"))
        if not isinstance(self.start, datetime.date):
            problems.append(("start", f"must be a date, got {self.start!r}"))
        if self.days < 2 * CHURN_QUIET_DAYS:
            problems.append(("days", f"must be at least {2 * CHURN_QUIET_DAYS}, got {self.days}"))
        if not 0.0 <= self.churn_fraction <= 1.0:
            problems.append(("churn_fraction", f"must be in [0, 1], got {self.churn_fraction}"))
        if self.seed < 0:
            problems.append(("seed", f"must be non-negative, got {self.seed}"))
        if self.users_per_file < 1:
            problems.append(("users_per_file", f"must be at least 1, got {self.users_per_file}"))
        require_valid(problems)


@dataclass(frozen=True)
class SyntheticSummary:
    """What `generate_quickstart` wrote."""

    out_dir: str
    users: int
    events: int
    items: int
    files: list[str]
    """Every file written, events parts first."""
