"""Evaluation task specs: TOML files that define, before any modelling, how models are scored.

Tasks live in a `tasks/` folder (the workspace's project folder, or beside an example), one file
per task, named after the task. Relative paths in a spec are read relative to its file.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lumos.core.config import load_config, require_valid
from lumos.core.errors import ConfigError, Problem, UsageError
from lumos.eval.kinds import KINDS
from lumos.eval.metrics import direction

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
Kind = Literal[tuple(KINDS)]  # a field-level check: an unknown kind is reported with the spec's other problems


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


@dataclass(frozen=True)
class TaskSpec:
    name: str
    """Task name: the MLflow experiment is lumos-eval/<name>."""
    kind: Kind
    """A kind of lumos/eval/kinds/ (retrieval: next item over the full corpus; next_items: the items
    of the days after one global cutoff; binary; regression; embedding_probe; user_label: a per-user
    label over folds); it sets the default metrics, how a model is scored and the baseline."""
    primary_metric: str
    """The metric leaderboards rank by."""
    description: str = ""
    """What the task measures, for people reading the leaderboard."""
    data: str = "quickstart.sequences"
    """The sequences table, dataset.sequences[@version]; the latest version is resolved and recorded."""
    split: str = "test"
    """Rows of this split are scored."""
    metrics: tuple[str, ...] = ()
    """Metrics to report; empty means the kind's defaults."""
    direction: Literal["max", "min"] | None = None
    """Whether a larger primary metric is better; unset means the metric's natural direction."""
    thresholds: dict[str, float] = field(default_factory=dict)
    """Bars a model must clear, metric → value (at least it for max metrics, at most for min ones);
    a miss exits with code 3."""
    ks: tuple[int, ...] = (10, 50)
    """retrieval and next_items: the cut-offs k of HR@k, recall@k and NDCG@k."""
    exclude_history: bool = True
    """retrieval: items already in the user's history are not candidates (the target stays one)."""
    horizon_days: int = 7
    """binary and regression: which horizon's head and target (act_<K>d, value_<K>d)."""
    decision_threshold: float = 0.5
    """binary: probability at which accuracy counts a positive."""
    labels: ProbeLabels | None = None
    """embedding_probe and user_label: the labels table and the probe."""
    window: TimeWindow | None = None
    """next_items: the global cutoff, the target window and the events file."""
    batch_size: int = 512
    """Rows scored at once."""
    daily_submissions: int = 5
    """Predictions files one submission name may enter in 24 hours (`lumos eval --predictions`);
    past it, exit 3 with the count and when the next one is allowed."""
    public_fraction: float = 0.5
    """Share of the split's users on the public side of the leaderboard (ranked and shown); the
    rest are the private side, shown only with `lumos eval leaderboard --private`. 1 keeps no
    private side. Only tasks that take submissions (not embedding probes) have sides."""
    public_seed: int = 0
    """Seed of the hash of user ids that puts each user on one side."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:  # a spec built in code; a file's kind is checked by its type
            require_valid([("kind", f"must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")])
        problems = []
        if not NAME.match(self.name):
            problems.append(("name", "must start with a letter and hold only letters, digits and _"))
        takes_labels = KINDS[self.kind].takes_labels
        if takes_labels and self.labels is None:
            problems.append(("labels", f"an {self.kind} task needs a [labels] table"))
        if not takes_labels and self.labels is not None:
            labelled = ", ".join(name for name, kind in KINDS.items() if kind.takes_labels)
            problems.append(("labels", f"only {labelled} tasks take labels, not {self.kind}"))
        takes_window = KINDS[self.kind].takes_window
        if takes_window and self.window is None:
            problems.append(("window", f"a {self.kind} task needs a [window] (cutoff, days, events)"))
        if not takes_window and self.window is not None:
            windowed = ", ".join(name for name, kind in KINDS.items() if kind.takes_window)
            problems.append(("window", f"only {windowed} tasks take a window, not {self.kind}"))
        if self.primary_metric not in self.metric_names:
            problems.append(("primary_metric", f"{self.primary_metric!r} is not among the metrics: {', '.join(self.metric_names)}"))
        for key, names in (("metrics", self.metric_names), ("thresholds", tuple(self.thresholds))):
            for name in names:
                try:
                    direction(name)
                except ValueError as error:
                    problems.append((key, str(error)))
        for name, bar in self.thresholds.items():
            if not math.isfinite(bar):
                problems.append(("thresholds", f"{name} = {bar}: a bar must be a finite number"))
        if any(k < 1 for k in self.ks):
            problems.append(("ks", "every k must be at least 1"))
        if self.batch_size < 1:
            problems.append(("batch_size", "must be at least 1"))
        if not 0 < self.public_fraction <= 1:
            problems.append(("public_fraction", "must be above 0 and at most 1"))
        if self.daily_submissions < 1:
            problems.append(("daily_submissions", "must be at least 1"))
        require_valid(problems)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return self.metrics or KINDS[self.kind].default_metrics(self)

    @property
    def primary_direction(self) -> str:
        return self.direction or direction(self.primary_metric)


@dataclass(frozen=True)
class LoadedTask:
    spec: TaskSpec
    path: Path


def task_folders(project_dir: Path) -> list[Path]:
    """Where tasks are looked for: <project>/tasks, then examples/*/tasks under the project."""
    folders = [project_dir / "tasks"]
    folders += sorted(project_dir.glob("examples/*/tasks"))
    return [folder for folder in folders if folder.is_dir()]


def load_tasks(folders: list[Path]) -> dict[str, LoadedTask]:
    """Every task spec in `folders`, by name; all bad specs are reported together."""
    tasks: dict[str, LoadedTask] = {}
    errors: list[Problem] = []
    for folder in folders:
        for path in sorted(folder.glob("*.toml")):
            try:
                spec = load_config(TaskSpec, path)
            except ConfigError as error:
                errors += [Problem(f"{path}: {problem.key}", problem.message) for problem in error.problems]
                continue
            if spec.name in tasks:
                errors.append(Problem(f"{path}: name", f"task {spec.name!r} is also defined in {tasks[spec.name].path}"))
                continue
            tasks[spec.name] = LoadedTask(spec, path)
    if errors:
        raise ConfigError("task specs", errors)
    return tasks


def find_task(tasks: dict[str, LoadedTask], name: str) -> LoadedTask:
    if name not in tasks:
        known = ", ".join(sorted(tasks)) or "none found"
        raise UsageError(f"no task {name!r}; known tasks: {known} (`lumos eval list` shows them)")
    return tasks[name]
