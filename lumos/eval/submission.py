"""Leaderboard submissions: predictions from any model, in a file, scored on a task's held-out labels.

A team that trains outside Lumos exports a task (`lumos.eval.export`), predicts for every user of
it, and submits a Parquet, CSV or Delta file with `user_id` and the column its kind names
(`Prediction` in lumos/eval/kinds/). The file is checked strictly before anything is logged; every
broken rule is reported at once, with the first offending rows, and nothing is written. Then the
kind scores the predictions with the same metric code as its model entries, and the entry is logged
as `submission/TEAM/MODEL`, with the file's sha256, rows, description and, when the file sits in a
git checkout, its commit.

A name may submit `daily_submissions` files to a task in any 24 hours (a task setting), counted
from the tracking store; past it, GateError (exit 3) says when the next one is allowed.

A submitted entry never writes into a training run, so no promotion gate ever reads it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lumos.core.errors import GateError, UsageError
from lumos.core.tables import TableRef
from lumos.core.workspace import Workspace
from lumos.data.sequences_version import SequencesVersion, open_sequences
from lumos.data.user_share import UserShare
from lumos.eval.embeddings import split_rows
from lumos.eval.kinds import KINDS
from lumos.eval.kinds.kind import Broken, Prediction, Scores
from lumos.eval.leaderboard import Subject, entry_start_times, record
from lumos.eval.sides import on_side, side_metrics
from lumos.eval.tasks import LoadedTask, TaskSpec

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
SHOWN_ROWS = 5  # offending rows named per broken rule
DAY_MS = 24 * 60 * 60 * 1000


class SubmissionError(UsageError):
    """A predictions file that breaks the task's schema (exit 2); nothing was logged."""


@dataclass(frozen=True)
class SubmissionResult:
    task: str
    name: str
    data: str
    metrics: dict[str, float]
    rows: int
    """Rows of the file (one per user)."""
    scored_rows: int
    """Rows the metrics count (a retrieval row with no next item is not scored)."""
    sha256: str
    eval_run_id: str
    scored_on: str = "all"
    """Which users `metrics` are on: public (the leaderboard's side; the private side is logged,
    not shown) or all (the task has no private side)."""


def prediction_of(spec: TaskSpec) -> Prediction:
    prediction = KINDS[spec.kind].prediction
    if prediction is None:
        takers = ", ".join(name for name, kind in KINDS.items() if kind.prediction)
        raise UsageError(f"task {spec.name}: {spec.kind} tasks take no submissions (only {takers} tasks do)")
    return prediction


def task_users(spec: TaskSpec, data: SequencesVersion) -> pa.Table:
    """The split's rows (labels included), one per user, sorted by user id: the order every
    submission is scored in, so the order of a file's rows never changes its score."""
    rows = split_rows(data, spec.split)
    rows = rows.take(pc.sort_indices(rows, [("user_id", "ascending")]))
    users = rows["user_id"]
    if pc.count_distinct(users).as_py() != rows.num_rows:
        raise UsageError(f"task {spec.name}: split {spec.split!r} of {data.ref} has several rows for some users; "
                         "a submission gives one prediction per user, so it needs a split with one row per user")
    return rows


def submit(workspace: Workspace, task: LoadedTask, path: Path, name: str, description: str = "") -> SubmissionResult:
    """Check, score and log one submission; raises SubmissionError (exit 2) before logging anything."""
    spec = task.spec
    prediction = prediction_of(spec)
    if not NAME.match(name):
        raise UsageError(f"--name {name!r}: expected TEAM/MODEL (letters, digits, '.', '_' and '-'), e.g. acme/gbdt-v2")
    subject = Subject(key=f"submission:{name}", label=name)
    check_daily_limit(workspace, spec, subject)
    data = open_sequences(workspace, TableRef.parse(spec.data))
    rows = task_users(spec, data)
    table = read_predictions(path, prediction)
    column = checked_predictions(spec, data, prediction, rows, table, path)
    scores = prediction.score(spec, data, rows, column)
    sides = side_metrics(spec, lambda share: score_side(spec, data, prediction, rows, column, share).metrics)
    digest = file_sha256(path)
    details = {"sha256": digest, "file": path.name, "file_rows": str(table.num_rows), "description": description}
    commit = checkout_commit(path)
    if commit:
        details["file_commit"] = commit
    eval_run_id = record(workspace, spec, subject, str(data.ref), scores.metrics | sides, scores.rows, details)
    public = on_side(sides, "public")
    return SubmissionResult(spec.name, name, str(data.ref), public or scores.metrics, table.num_rows, scores.rows, digest,
                            eval_run_id, "public" if public else "all")


def score_side(spec: TaskSpec, data: SequencesVersion, prediction: Prediction, rows: pa.Table,
                column: pa.ChunkedArray, share: UserShare) -> Scores:
    """The submission's scores on one side of the task's users."""
    held = pa.array(share.holds(rows["user_id"]))
    return prediction.score(spec, data, rows.filter(held), column.filter(held))


def check_daily_limit(workspace: Workspace, spec: TaskSpec, subject: Subject, now_ms: int | None = None) -> None:
    """GateError (exit 3) when `subject` already entered `spec.daily_submissions` files in the last 24 hours."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    recent = [start for start in entry_start_times(workspace, spec, subject) if start > now_ms - DAY_MS]
    if len(recent) >= spec.daily_submissions:
        allowed = recent[-spec.daily_submissions] + DAY_MS  # when the oldest counted one leaves the window
        at = datetime.datetime.fromtimestamp(allowed / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        raise GateError(f"{subject.label} has submitted {len(recent)} time(s) to task {spec.name} in the last 24 hours "
                        f"(the task allows {spec.daily_submissions}); the next submission is allowed at {at}")


def read_predictions(path: Path, prediction: Prediction) -> pa.Table:
    """A Parquet file, a CSV file (a list as JSON text, "[12, 7, 33]") or a Delta table folder."""
    if path.is_dir() and (path / "_delta_log").is_dir():
        from lumos.core.tables import open_delta_table

        return open_delta_table(str(path)).to_pyarrow_table()
    if not path.is_file():
        raise UsageError(f"--predictions {path}: no such file (a .parquet or .csv file, or a Delta table folder)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if suffix == ".csv":
        import pyarrow.csv as pacsv

        # user_id is read as text, as the export writes it: "007" must stay "007".
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types={"user_id": pa.string()}))
        if prediction.type.startswith("list") and prediction.column in table.column_names:
            table = table.set_column(table.column_names.index(prediction.column), prediction.column,
                                     _json_lists(table[prediction.column]))
        return table
    raise UsageError(f"--predictions {path}: expected a .parquet or .csv file, or a Delta table folder")


def _json_lists(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """CSV text "[12, 7]" → list<int64>; text that is no list of integers is left as text (the
    type rule then names it)."""
    parsed = []
    for text in column.to_pylist():
        try:
            value = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError:
            return column
        if value is not None and not (isinstance(value, list) and all(isinstance(item, int) or item is None for item in value)):
            return column
        parsed.append(value)
    return pa.chunked_array([pa.array(parsed, type=pa.list_(pa.int64()))])


def checked_predictions(spec: TaskSpec, data: SequencesVersion, prediction: Prediction, rows: pa.Table,
                        table: pa.Table, path: Path) -> pa.ChunkedArray:
    """The prediction column in `rows`' (user) order, once every rule holds; else SubmissionError
    naming each broken rule and its first rows."""
    where = f"--predictions {path}"
    missing = [name for name in ("user_id", prediction.column) if name not in table.column_names]
    if missing:
        raise SubmissionError(f"{where}: missing column {', '.join(missing)}; a {spec.kind} submission has user_id and "
                              f"{prediction.column} ({prediction.type}); it has {', '.join(table.column_names) or 'none'}"
                              f" (`lumos eval tasks schema {spec.name}` shows the schema); nothing was logged")
    type_problems = _type_problems(table, prediction)
    if type_problems:
        raise SubmissionError(f"{where}: wrong type: " + "; ".join(type_problems) + "; nothing was logged")
    users = pc.cast(table["user_id"], pa.string()).to_pylist()
    broken = _user_problems(users, rows["user_id"].to_pylist())
    broken += prediction.check(spec, data, table[prediction.column])
    if broken:
        lines = [f"  - {item.rule}" + (f": {_shown_rows(item.rows, users)}" if item.rows.size else "") for item in broken]
        raise SubmissionError(f"{where}: {len(broken)} rule(s) broken; nothing was logged\n" + "\n".join(lines))
    position = {user: index for index, user in enumerate(users)}
    return table[prediction.column].take(pa.array([position[user] for user in rows["user_id"].to_pylist()]))


def _type_problems(table: pa.Table, prediction: Prediction) -> list[str]:
    problems = []
    user_type = table.schema.field("user_id").type
    if not (pa.types.is_string(user_type) or pa.types.is_large_string(user_type) or pa.types.is_integer(user_type)):
        problems.append(f"user_id is {user_type}, expected string")
    kind = table.schema.field(prediction.column).type
    if prediction.type.startswith("list"):
        fits = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)
    else:
        fits = pa.types.is_floating(kind) or pa.types.is_integer(kind)
    if not fits:
        problems.append(f"{prediction.column} is {kind}, expected {prediction.type}")
    return problems


def _user_problems(users: list[str | None], expected: list[str]) -> list[Broken]:
    """Every user of the task exactly once, and no one else."""
    known = set(expected)
    seen: set[str | None] = set()
    duplicate, unknown = [], []
    for index, user in enumerate(users):
        if user in seen:
            duplicate.append(index)
        seen.add(user)
        if user not in known:
            unknown.append(index)
    broken = [Broken("duplicate user", np.array(duplicate, dtype=np.int64)),
              Broken("unknown user (not a user of the task; users.parquet of the export lists them)",
                     np.array(unknown, dtype=np.int64))]
    broken = [item for item in broken if item.rows.size]
    absent = [user for user in expected if user not in seen]
    if absent:
        shown = ", ".join(absent[:SHOWN_ROWS]) + (f" and {len(absent) - SHOWN_ROWS} more" if len(absent) > SHOWN_ROWS else "")
        broken.append(Broken(f"missing user: {len(absent)} user(s) of the task have no row, e.g. {shown}",
                             np.array([], dtype=np.int64)))
    return broken


def _shown_rows(rows: np.ndarray, users: list[str | None]) -> str:
    """"rows 3 (user u7), 9 (user u2) and 4 more": 1-based data rows of the file."""
    shown = ", ".join(f"{row + 1} (user {users[row]})" for row in rows[:SHOWN_ROWS])
    more = f" and {rows.size - SHOWN_ROWS} more" if rows.size > SHOWN_ROWS else ""
    return f"{rows.size} row(s): {shown}{more}"


def checkout_commit(path: Path) -> str | None:
    """The commit of the git checkout the file sits in (the code that made it, as a rule); None outside one."""
    folder = path if path.is_dir() else path.parent
    try:
        found = subprocess.run(["git", "-C", str(folder.resolve()), "rev-parse", "HEAD"], capture_output=True, text=True,
                               timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


def file_sha256(path: Path) -> str:
    """sha256 of the file; of a Delta folder, of its files' relative paths and bytes in path order."""
    digest = hashlib.sha256()
    files = sorted(item for item in path.rglob("*") if item.is_file()) if path.is_dir() else [path]
    for item in files:
        if path.is_dir():
            digest.update(str(item.relative_to(path)).encode() + b"\0")
        with item.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
