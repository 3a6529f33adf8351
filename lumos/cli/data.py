"""`lumos data …`: list tables, their version history with lineage, one version in detail, and
synthetic quickstart data."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress, state
from lumos.core.tables import TableRef, TableVersion
from lumos.core.workspace import Workspace, open_workspace
from lumos.data.synthetic import SyntheticSpec
from lumos.data.table_metadata import describe_table, list_tables, table_history

T = TypeVar("T")

app = typer.Typer(help="Versioned tables: list, history with lineage, details; synthetic data.", no_args_is_help=True)


@app.command("list")
@handles_errors
def list_command(ctx: typer.Context, json_output: JsonOption = False) -> None:
    """List the tables in the workspace."""
    workspace = open_workspace(state(ctx).workspace_dir)
    names = list_tables(workspace)
    if json_output:
        emit_json({"workspace_root": workspace.root, "tables": names})
    elif names:
        echo("\n".join(names))
    else:
        echo(f"no tables yet under {workspace.tables_root}; `lumos ingest --recipe …` writes some")


@app.command("history")
@handles_errors
def history(
    ctx: typer.Context,
    table: Annotated[str, typer.Argument(help="dataset.table, e.g. quickstart.sequences")],
    json_output: JsonOption = False,
) -> None:
    """Every version of a table, newest first, with the lineage that made it."""
    _answer(ctx, table, lambda ref: f"reading the history of {ref.name}", table_history, json_output,
            lambda ref, entries: {"table": ref.name, "versions": [_entry_json(entry) for entry in entries]}, _print_history)


@app.command("show")
@handles_errors
def show(
    ctx: typer.Context,
    table: Annotated[str, typer.Argument(help="dataset.table[@VERSION]; latest without a version")],
    json_output: JsonOption = False,
) -> None:
    """One version's lineage (recipe, hash, inputs, stats), schema and row count."""
    _answer(ctx, table, lambda ref: f"reading {ref}", describe_table, json_output, lambda ref, details: details, _print_details)


def _answer(
    ctx: typer.Context,
    table: str,
    doing: Callable[[TableRef], str],
    read: Callable[[Workspace, TableRef], T],
    json_output: bool,
    to_json: Callable[[TableRef, T], dict],
    render: Callable[[TableRef, T], None],
) -> None:
    """The skeleton of the table verbs: parse the table, read it from the workspace (`doing(ref)`
    says what under the spinner), then print it as JSON or for a person."""
    ref = TableRef.parse(table)
    workspace = open_workspace(state(ctx).workspace_dir)
    with progress(doing(ref)):
        result = read(workspace, ref)
    if json_output:
        emit_json(to_json(ref, result))
    else:
        render(ref, result)


def _print_history(ref: TableRef, entries: list[TableVersion]) -> None:
    rows = []
    for entry in entries:
        lineage = entry.lineage
        inputs = ", ".join(f"{i.uri}@{i.version}" for i in lineage.inputs) if lineage else ""
        rows.append((entry.version, entry.timestamp, lineage.stage if lineage else entry.operation,
                     lineage.config_hash[:19] if lineage else "", inputs, _short_stats(lineage.stats) if lineage else ""))
    print_table(f"{ref.name}: {len(entries)} version(s)", ["version", "written", "stage", "config hash", "inputs", "stats"], rows)
    echo("full recipe and lineage of one version: lumos data show " + f"{ref.name}@VERSION")


def _print_details(ref: TableRef, details: dict) -> None:
    echo(f"[bold]{details['table']}@{details['version']}[/bold]  {details['rows']} rows  ({details['location']})", markup=True)
    print_table("schema", ["column", "type"], [(c["name"], c["type"]) for c in details["schema"]])
    echo("lineage:")
    echo(json.dumps(details["lineage"], indent=2, sort_keys=True) if details["lineage"] else "  (none recorded)")


@app.command("synth")
@handles_errors
def synth(
    ctx: typer.Context,
    out: Annotated[str, typer.Option("--out", help="Folder to write events/, users, items, calendar and labels into.")],
    users: Annotated[int, typer.Option(help="Number of users.")] = SyntheticSpec.users,
    events: Annotated[int, typer.Option(help="Number of events (10M+ is fine: written in blocks).")] = SyntheticSpec.events,
    items: Annotated[int, typer.Option(help="Catalog size.")] = SyntheticSpec.items,
    clusters: Annotated[int, typer.Option(help="Taste clusters, which are also the item categories.")] = SyntheticSpec.clusters,
    start: Annotated[str, typer.Option(help="First day of activity, YYYY-MM-DD.")] = SyntheticSpec.start.isoformat(),
    days: Annotated[int, typer.Option(help="Length of the activity period in days.")] = SyntheticSpec.days,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same data.")] = SyntheticSpec.seed,
    json_output: JsonOption = False,
) -> None:
    """Generate the synthetic, learnable quickstart activity data (a previous run in --out is replaced)."""
    from lumos.cli.infer import parse_date
    from lumos.data.synthetic import generate_quickstart

    spec = SyntheticSpec(users=users, events=events, items=items, clusters=clusters,
                         start=parse_date(start, "--start"), days=days, seed=seed)
    with progress(f"generating {events:,} events for {users:,} users"):
        summary = generate_quickstart(out, spec)
    if json_output:
        emit_json(summary)
    else:
        echo(f"wrote {summary.events:,} events of {summary.users:,} users over {summary.items:,} items to {summary.out_dir}")


def _entry_json(entry) -> dict:
    return {
        "version": entry.version,
        "timestamp": entry.timestamp,
        "operation": entry.operation,
        "lineage": json.loads(entry.lineage.to_json()) if entry.lineage else None,
    }


def _short_stats(stats: dict) -> str:
    keys = ("rows_read", "rows_rejected", "users", "tokens", "rows")
    return ", ".join(f"{key}={stats[key]}" for key in keys if key in stats)


@app.command("trace")
@handles_errors
def trace(
    ctx: typer.Context,
    table: Annotated[str, typer.Argument(help="A predictions table, e.g. quickstart.predictions[@VERSION]")],
    user: Annotated[str, typer.Option("--user", help="The user id of the prediction.")],
    as_of: Annotated[str, typer.Option("--as-of", help="The prediction's date, YYYY-MM-DD.")],
    live: Annotated[bool, typer.Option("--live", help="Read the model version and run from MLflow as they are now "
                                                      "(its aliases may have moved since infer).")] = False,
    json_output: JsonOption = False,
) -> None:
    """Walk one prediction back to the model version, training run, config, data version and recipe.

    The model version (aliases, tags) and its run are shown as `lumos infer` recorded them in its
    commit when it wrote the prediction; `--live` reads them from MLflow instead."""
    from lumos.cli.infer import parse_date
    from lumos.infer.trace import trace_prediction

    day = parse_date(as_of, "--as-of")
    _answer(ctx, table, lambda ref: f"tracing {user} in {ref}",
            lambda workspace, ref: trace_prediction(workspace, ref, user, day, live=live),
            json_output, lambda ref, result: result, lambda ref, result: _print_trace(result, user, as_of))


def _print_trace(result: dict, user: str, as_of: str) -> None:
    commit, run, data = result["prediction"]["commit"], result["run"], result["data"]
    rows = [
        ("prediction", f"{result['prediction']['table']} version {commit['version']}, engine {commit['engine']}, "
                       f"written {commit['created_at']}"),
        ("model", f"{result['model']['version']} (aliases: {', '.join(result['model']['aliases']) or 'none'})"),
        ("training run", f"{run['id']} {run['name'] or ''}, config {run['config_hash']}, code {run['code_version']}"),
        *[("  started from", f"run {' '.join(filter(None, (parent['run'], parent['name'])))}"
                             f"{' (' + parent['model'] + ')' if parent['model'] else ''}, trained on {parent['data']}"
                             f"{'' if parent['exists'] else '; no longer in MLflow'}")
          for parent in run.get("init_from", [])],  # absent from snapshots infer recorded before init_from
        ("training data", f"{data['table']}, recipe {data['recipe_hash']}"),
        *[("  input", f"{item['kind']} {item['uri']} @ {item['version']}") for item in data["inputs"]],
    ]
    print_table(f"lineage of {user} as of {as_of}", ["step", "what"], rows)
