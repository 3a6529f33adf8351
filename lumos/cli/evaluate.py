"""`lumos eval`: score runs and models on the task registry; `eval list`; `eval leaderboard`."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption, ModelOption, RunOption
from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress, state
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace

app = typer.Typer(invoke_without_command=True)  # the callback's docstring is the help

TasksOption = Annotated[
    Path | None, typer.Option("--tasks", help="Folder of task specs (default: tasks/ and examples/*/tasks/ of the project).")
]


def _load(ctx: typer.Context, tasks_dir: Path | None):
    from lumos.eval.tasks import load_tasks, task_folders

    workspace = open_workspace(state(ctx).workspace_dir)
    folders = [tasks_dir] if tasks_dir else task_folders(workspace.project_dir)
    if tasks_dir and not tasks_dir.is_dir():
        raise UsageError(f"--tasks {tasks_dir}: no such folder")
    return workspace, load_tasks(folders)


@app.callback()
@handles_errors
def run_eval(
    ctx: typer.Context,
    task: Annotated[list[str] | None, typer.Option("--task", "-t", help="Task to score (repeatable).")] = None,
    all_tasks: Annotated[bool, typer.Option("--all", help="Score every task.")] = False,
    run: RunOption = None,
    model: ModelOption = None,
    fail_below: Annotated[
        list[str] | None, typer.Option("--fail-below", help="METRIC=VALUE: exit 3 when a score is under it (repeatable).")
    ] = None,
    predictions: Annotated[
        Path | None, typer.Option("--predictions", help="Submit a predictions file (Parquet, CSV or Delta) from any model.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="TEAM/MODEL: the submission's leaderboard name.")] = None,
    description: Annotated[str, typer.Option("--description", help="What the submitted model is.")] = "",
    tasks_dir: TasksOption = None,
    json_output: JsonOption = False,
) -> None:
    """Score a training run (--run) or registered model (--model) on tasks (--task T, or --all),
    or submit a predictions file from any model (--task T --predictions FILE --name TEAM/MODEL).

    Each (task, model, data version) becomes one entry of the task's leaderboard, the MLflow
    experiment lumos-eval/T, replacing an earlier entry of the same triple; the task's "no model"
    baseline is refreshed beside it, and the scores are also logged into the training run as
    eval/T/METRIC. Exit code 3 when a task threshold or --fail-below bar is missed.
    A submission is checked before anything is logged (exit 2 naming each broken rule);
    `lumos eval tasks export T` writes what a team needs to make one.
    """
    if ctx.invoked_subcommand is not None:
        return
    if predictions is not None or name is not None:
        _submit(ctx, task or [], all_tasks, run, model, fail_below, predictions, name, description, tasks_dir, json_output)
        return
    from lumos.eval.evaluate import evaluate, resolve_subject
    from lumos.eval.tasks import find_task

    if not task and not all_tasks:
        raise UsageError("name the tasks to score: --task T (repeatable) or --all; `lumos eval list` shows them")
    if (run is None) == (model is None):
        raise UsageError("name exactly one of --run RUN_ID or --model NAME@alias")
    bars = _parse_bars(fail_below or [])
    workspace, tasks = _load(ctx, tasks_dir)
    chosen = list(tasks.values()) if all_tasks else [find_task(tasks, name) for name in task]
    subject = resolve_subject(workspace, run, model)
    with progress(f"evaluating {subject.label}") as report:
        results = evaluate(workspace, chosen, subject, bars, report)
    if json_output:
        emit_json({"subject": subject.key, "run_id": subject.run_id, "model": subject.model, "results": results})
        return
    for result in results:
        rows = [(name, f"{value:.4f}", f"{result.baseline_metrics[name]:.4f}" if name in result.baseline_metrics else "")
                for name, value in result.metrics.items()]
        print_table(f"{result.task} on {result.data} ({result.rows:,} rows)", ["metric", subject.label, result.baseline or ""], rows)
    echo("leaderboards: lumos eval leaderboard --task " + results[0].task if results else "")


def _submit(ctx, task: list[str], all_tasks: bool, run, model, fail_below, predictions: Path | None, name: str | None,
            description: str, tasks_dir: Path | None, json_output: bool) -> None:
    from lumos.eval.submission import submit
    from lumos.eval.tasks import find_task

    if predictions is None or name is None:
        raise UsageError("a submission names both --predictions FILE and --name TEAM/MODEL")
    if len(task) != 1 or all_tasks:
        raise UsageError("a submission is for one task: --task T")
    if run is not None or model is not None or fail_below:
        raise UsageError("--predictions is scored as it is: leave out --run, --model and --fail-below")
    workspace, tasks = _load(ctx, tasks_dir)
    result = submit(workspace, find_task(tasks, task[0]), predictions, name, description)
    if json_output:
        emit_json(result)
        return
    side = " (scores on the public side; the private side is kept for the end of the round)" if result.scored_on == "public" else ""
    print_table(f"{result.task} on {result.data}: submission {result.name} ({result.rows:,} users){side}",
                ["metric", result.name], [(metric, f"{value:.4f}") for metric, value in result.metrics.items()])
    echo(f"sha256 {result.sha256}; leaderboard: lumos eval leaderboard --task {result.task}")


@app.command("list")
@handles_errors
def list_tasks(ctx: typer.Context, tasks_dir: TasksOption = None, json_output: JsonOption = False) -> None:
    """The tasks of the project, with kind, data, split and primary metric."""
    _, tasks = _load(ctx, tasks_dir)
    if json_output:
        emit_json({"tasks": [{"name": t.spec.name, "kind": t.spec.kind, "data": t.spec.data, "split": t.spec.split,
                              "metrics": list(t.spec.metric_names), "primary_metric": t.spec.primary_metric,
                              "direction": t.spec.primary_direction, "description": t.spec.description,
                              "file": str(t.path)} for t in tasks.values()]})
        return
    print_table(f"{len(tasks)} task(s)", ["task", "kind", "data", "split", "primary", "description"],
                [(t.spec.name, t.spec.kind, t.spec.data, t.spec.split,
                  f"{t.spec.primary_metric} ({t.spec.primary_direction})", t.spec.description) for t in tasks.values()])


@app.command("leaderboard")
@handles_errors
def show_leaderboard(
    ctx: typer.Context,
    task: Annotated[str, typer.Option("--task", "-t", help="The task whose leaderboard to show.")],
    top: Annotated[int | None, typer.Option("--top", help="Show only the best N entries.")] = None,
    tasks_dir: TasksOption = None,
    json_output: JsonOption = False,
    csv_output: Annotated[bool, typer.Option("--csv", help="Print CSV on stdout.")] = False,
    group_by: Annotated[
        str | None, typer.Option("--group-by", help="config: one row per training config, mean ± std over its seeds.")
    ] = None,
    private: Annotated[
        bool, typer.Option("--private", help="Also show the private side's scores (for the task's owner, at the end of a round).")
    ] = False,
) -> None:
    """Entries of a task ranked by its primary metric; reads only the MLflow store.

    A task that takes submissions splits its users by a seeded hash (public_fraction, 50% by
    default): entries are ranked and shown on the public side; --private adds the other side."""
    from lumos.eval.leaderboard import entry_json, leaderboard
    from lumos.eval.tasks import find_task

    if group_by not in (None, "config"):
        raise UsageError(f"--group-by {group_by!r}: the one grouping is config")
    workspace, tasks = _load(ctx, tasks_dir)
    spec = find_task(tasks, task).spec
    if group_by:
        _show_groups(workspace, spec, top, json_output, csv_output)
        return
    entries = leaderboard(workspace, spec, top)
    metrics = list(spec.metric_names)
    if json_output:
        emit_json({"task": spec.name, "primary_metric": spec.primary_metric, "direction": spec.primary_direction,
                   "entries": [entry_json(entry, private) for entry in entries]})
        return
    hidden = [f"private {m}" for m in metrics] if private else []
    header = ["rank", "entry", "kind", "run", "model", "scored on", *metrics, *hidden, "data", "date"]
    rows = [[e.rank, e.label, e.kind, e.run_id or "", e.model or "", e.scored_on, *[_cell(e.metrics.get(m)) for m in metrics],
             *[_cell(e.private_metrics.get(m)) for m in metrics if private], e.data, e.date] for e in entries]
    _print_rows(f"{spec.name}: ranked by {spec.primary_metric} ({spec.primary_direction})", header, rows, csv_output)


tasks_app = typer.Typer(no_args_is_help=True, help="Write task specs; export a task and its submission schema.")
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("generate")
@handles_errors
def generate_tasks(
    ctx: typer.Context,
    labels: Annotated[Path, typer.Option("--labels", help="Labels table: a Parquet or CSV file, one row per user.")],
    data: Annotated[str, typer.Option("--data", help="The sequences table the tasks score, e.g. quickstart.sequences.")],
    columns: Annotated[
        str | None, typer.Option("--columns", help="Label columns, comma-separated (default: every column but the user id).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the task files (default: tasks/ of the project).")] = None,
    split: Annotated[str, typer.Option("--split", help="The split whose users are probed.")] = "test",
    user_id: Annotated[str, typer.Option("--user-id", help="The labels table's user id column.")] = "user_id",
    probe: Annotated[str, typer.Option("--probe", help="auto (by column type), logistic or linear.")] = "auto",
    prefix: Annotated[str, typer.Option("--prefix", help="Prepended to each column name to make the task name.")] = "",
    force: Annotated[bool, typer.Option("--force", help="Replace task files that already exist.")] = False,
    json_output: JsonOption = False,
) -> None:
    """One embedding-probe task per label column of a labels table, written as OUT/<prefix><column>.toml.

    The probe follows the column's type (floats linear; strings, booleans and integers with at most
    20 values logistic). Every spec is checked before any file is written.
    """
    from lumos.eval.generate import generate_probe_tasks

    if probe not in ("auto", "logistic", "linear"):
        raise UsageError(f"--probe {probe!r}: expected auto, logistic or linear")
    folder = out if out is not None else open_workspace(state(ctx).workspace_dir).project_dir / "tasks"
    chosen = [name.strip() for name in columns.split(",") if name.strip()] if columns is not None else None
    written = generate_probe_tasks(labels, folder, chosen, data=data, split=split, user_id=user_id, probe=probe,
                                   prefix=prefix, overwrite=force)
    if json_output:
        emit_json({"labels": str(labels), "out": str(folder), "tasks": [
            {"name": task.name, "column": task.column, "probe": task.probe, "file": str(task.path)} for task in written]})
        return
    print_table(f"{len(written)} task(s) in {folder}", ["task", "column", "probe"],
                [(task.name, task.column, task.probe) for task in written])


@tasks_app.command("export")
@handles_errors
def export_task(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="The task to export.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write users.parquet, vocab.parquet, items.parquet and schema.json to.")],
    tasks_dir: TasksOption = None,
    json_output: JsonOption = False,
) -> None:
    """What a team outside Lumos needs to submit to a task: its users and their histories up to the
    task's cutoff (never a label), the item ids (retrieval) and the submission schema."""
    from lumos.eval.export import export_task as export
    from lumos.eval.tasks import find_task

    workspace, tasks = _load(ctx, tasks_dir)
    result = export(workspace, find_task(tasks, task), out)
    if json_output:
        emit_json(result)
        return
    items = f", {result.items:,} items" if result.items is not None else ""
    echo(f"{result.task}: {result.users:,} users{items} from {result.data} → {out}: {', '.join(result.files)}")
    echo(f"submit: lumos eval --task {result.task} --predictions FILE --name TEAM/MODEL")


@tasks_app.command("schema")
@handles_errors
def task_schema(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="The task whose submission schema to show.")],
    tasks_dir: TasksOption = None,
    json_output: JsonOption = False,
) -> None:
    """The columns and rules of a submission to a task."""
    from lumos.eval.export import submission_schema
    from lumos.eval.tasks import find_task

    _, tasks = _load(ctx, tasks_dir)
    schema = submission_schema(find_task(tasks, task).spec)
    if json_output:
        emit_json(schema)
        return
    print_table(f"{schema['task']} ({schema['kind']}): a submission's columns", ["column", "type", "description"],
                [(column["name"], column["type"], column["description"]) for column in schema["columns"]])
    for rule in schema["rules"]:
        echo(f"- {rule}")
    echo(f"formats: {', '.join(schema['formats'])}")
    echo(schema["submit"])


def _show_groups(workspace, spec, top: int | None, json_output: bool, csv_output: bool) -> None:
    from lumos.eval.leaderboard import group_json, grouped_leaderboard

    groups = grouped_leaderboard(workspace, spec, top)
    if json_output:
        emit_json({"task": spec.name, "primary_metric": spec.primary_metric, "direction": spec.primary_direction,
                   "group_by": "config", "groups": [group_json(group) for group in groups]})
        return
    metrics = list(spec.metric_names)
    header = ["rank", "config", "seeds", *metrics]
    rows = [[group.rank, group.label, max(1, len(group.run_ids)),
             *[f"{group.metrics[m][0]:.4f} ± {group.metrics[m][1]:.4f}" if m in group.metrics else "" for m in metrics]]
            for group in groups]
    _print_rows(f"{spec.name}: configs ranked by mean {spec.primary_metric} ({spec.primary_direction}) over seeds",
                header, rows, csv_output)


def _print_rows(title: str, header: list[str], rows: list[list], csv_output: bool) -> None:
    """A leaderboard as CSV on stdout (for scripts and spreadsheets) or as a table."""
    if csv_output:
        writer = csv.writer(sys.stdout)
        writer.writerow(header)
        writer.writerows(rows)
        return
    print_table(title, header, rows)


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _parse_bars(items: list[str]) -> dict[str, float]:
    bars = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            bars[name.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--fail-below {item!r}: expected METRIC=NUMBER, e.g. ndcg@10=0.05") from None
        if not sep or not math.isfinite(bars[name.strip()]):
            raise UsageError(f"--fail-below {item!r}: expected METRIC=NUMBER with a finite number")
    return bars
