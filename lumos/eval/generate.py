"""`lumos eval tasks generate`: one embedding-probe task spec per label column of a labels table.

A team with 150 downstream labels (will renew, has a pet, plan tier …) keeps them as columns of one
table with a row per user; each column becomes a task file `<out>/<prefix><column>.toml` that
reads the table through a path relative to the task file, so the folder can move with its labels.

The probe follows the column's type unless `probe` is given: floating point → linear (rmse, mae,
r2); strings and booleans → logistic (accuracy, log_loss, auc_roc for two classes); integers →
logistic when they hold at most MAX_CLASSES distinct values (codes, counts of a few), else linear.
Every spec is checked by loading it back before any file is written, so a bad column leaves the
folder as it was.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from lumos.core.config import from_dict
from lumos.core.errors import ConfigError, Problem, UsageError
from lumos.eval.tasks import NAME, TaskSpec

MAX_CLASSES = 20
Probe = Literal["auto", "logistic", "linear"]


@dataclass(frozen=True)
class GeneratedTask:
    name: str
    column: str
    probe: str
    path: Path


def generate_probe_tasks(
    labels: Path,
    out_dir: Path,
    columns: list[str] | None = None,
    data: str = "quickstart.sequences",
    split: str = "test",
    user_id: str = "user_id",
    probe: Probe = "auto",
    prefix: str = "",
    overwrite: bool = False,
) -> list[GeneratedTask]:
    """Write one probe task per label column (every column but `user_id` when `columns` is None)."""
    table = read_labels_table(labels)
    columns = columns if columns is not None else [name for name in table.column_names if name != user_id]
    problems = _check_columns(table, columns, user_id, prefix)
    if problems:
        raise ConfigError(f"--labels {labels}", problems)
    out_dir = out_dir.resolve()
    relative_labels = os.path.relpath(labels.resolve(), out_dir)
    planned: list[tuple[GeneratedTask, str]] = []
    for column in columns:
        kind = probe if probe != "auto" else probe_for(table[column])
        name = f"{prefix}{column}"
        text = _task_toml(name, column, kind, data, split, relative_labels, user_id, labels.name)
        # Loading it back is the same check `lumos eval` makes; fail here, before any file exists.
        from_dict(TaskSpec, tomllib.loads(text), source=f"task for column {column!r}")
        planned.append((GeneratedTask(name, column, kind, out_dir / f"{name}.toml"), text))
    existing = [str(task.path) for task, _ in planned if task.path.exists()]
    if existing and not overwrite:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise UsageError(f"{shown} already exist; pass --force to replace them")
    out_dir.mkdir(parents=True, exist_ok=True)
    for task, text in planned:
        temporary = task.path.with_name(f".{task.path.name}.tmp")  # no half-written spec is ever loaded
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, task.path)
    return [task for task, _ in planned]


def read_labels_table(path: Path) -> pa.Table:
    """A Parquet or CSV file with one row per user."""
    if not path.is_file():
        raise UsageError(f"--labels {path}: no such file (a Parquet or CSV table with one row per user)")
    if path.suffix.lower() == ".csv":
        import pyarrow.csv as pacsv

        return pacsv.read_csv(path)
    if path.suffix.lower() != ".parquet":
        raise UsageError(f"--labels {path}: expected a .parquet or .csv file")
    import pyarrow.parquet as pq

    return pq.read_table(path)


def probe_for(column: pa.ChunkedArray) -> str:
    """logistic for classes, linear for quantities; see the module docstring."""
    kind = column.type
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "linear"
    if pa.types.is_integer(kind):
        return "logistic" if pc.count_distinct(column).as_py() <= MAX_CLASSES else "linear"
    return "logistic"


def _check_columns(table: pa.Table, columns: list[str], user_id: str, prefix: str) -> list[Problem]:
    problems = []
    if user_id not in table.column_names:
        problems.append(Problem("--user-id", f"no column {user_id!r}; the table has {', '.join(table.column_names)}"))
    if not columns:
        problems.append(Problem("--columns", "no label columns to generate tasks for"))
    for column in columns:
        if column not in table.column_names:
            problems.append(Problem(column, f"no such column; the table has {', '.join(table.column_names)}"))
        elif not NAME.match(f"{prefix}{column}"):
            problems.append(Problem(column, "a task name must start with a letter and hold only letters, digits "
                                            "and _; rename the column or pass --prefix"))
        elif pc.count_distinct(table[column]).as_py() < 2:
            problems.append(Problem(column, "holds fewer than two distinct values; a probe has nothing to learn"))
    if len(set(columns)) != len(columns):
        problems.append(Problem("--columns", "names a column more than once"))
    return problems


def _task_toml(name: str, column: str, probe: str, data: str, split: str, labels_path: str, user_id: str,
               labels_name: str) -> str:
    primary = "accuracy" if probe == "logistic" else "rmse"
    description = f"{column} from {labels_name}, read off the user embedding by a {probe} probe"
    string = json.dumps  # a JSON string is a valid TOML basic string
    return "\n".join([
        f"# Generated by `lumos eval tasks generate` from {labels_name}, column {column}.",
        f"#   lumos eval --task {name} --run RUN_ID",
        f"name = {string(name)}",
        f"description = {string(description)}",
        'kind = "embedding_probe"',
        f"data = {string(data)}",
        f"split = {string(split)}",
        f"primary_metric = {string(primary)}",
        "",
        "[labels]",
        f"path = {string(labels_path)}",
        f"label = {string(column)}",
        f"user_id = {string(user_id)}",
        f"probe = {string(probe)}",
        "",
    ])
