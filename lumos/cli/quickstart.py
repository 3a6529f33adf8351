"""`lumos quickstart`: synthetic data through every verb, in one folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress
from lumos.data.synthetic import SyntheticSpec


@handles_errors
def quickstart(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Option("--dir", help="Project folder to create or reuse.")] = Path("lumos-quickstart"),
    users: Annotated[int, typer.Option("--users", help="Synthetic users.")] = SyntheticSpec.users,
    events: Annotated[int, typer.Option("--events", help="Synthetic events.")] = SyntheticSpec.events,
    steps: Annotated[int | None, typer.Option("--steps", help="Training steps (default: train.toml's run.max_steps).")] = None,
    require: Annotated[
        list[str] | None,
        typer.Option("--require", help="Promotion gate TASK:METRIC>=VALUE, replacing the default "
                                        "will_purchase_7d:auc_roc>=0.6 (repeatable).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Run every verb end to end on synthetic data: ingest, train, eval --all, promote, infer.

    Creates the folder with lumos.toml, the recipes (ingest.toml, train.toml, tasks/) and data/,
    then writes the Delta tables and the MLflow store under its .lumos/. Files already in the
    folder are kept, so edit a recipe and rerun. About five minutes on 2 CPU cores.
    """
    from lumos.quickstart.run import REQUIREMENTS, run_quickstart

    spec = SyntheticSpec(users=users, events=events)
    overrides = (f"run.max_steps={steps}",) if steps else ()
    with progress(f"quickstart in {directory}") as report:
        summary = run_quickstart(directory, spec, overrides, tuple(require) if require else REQUIREMENTS, report)
    workspace = summary.workspace
    if json_output:
        emit_json({"dir": str(summary.directory), "workspace": workspace.root, "tables": summary.tables,
                   "run_id": summary.run_id, "model": summary.model, "predictions": summary.predictions,
                   "prediction_rows": summary.prediction_rows, "as_of": summary.as_of.isoformat(),
                   "eval": {task: {"metric": m, "model": v, "baseline": b} for task, (m, v, b) in summary.eval_primary.items()},
                   "seconds": summary.seconds, "mlflow_tracking_uri": workspace.mlflow_tracking_uri})
        return
    print_table("eval: primary metric per task", ["task", "metric", "model", "baseline"],
                [(task, metric, f"{value:.4f}", "" if base is None else f"{base:.4f}")
                 for task, (metric, value, base) in summary.eval_primary.items()])
    stages = ", ".join(f"{stage} {secs:.0f} s" for stage, secs in summary.seconds.items())
    echo(f"done in {sum(summary.seconds.values()):.0f} s ({stages})")
    echo(f"model {summary.model} is quickstart@production; {summary.prediction_rows:,} predictions in "
         f"{summary.predictions} (as_of={summary.as_of})")
    echo()
    echo("where to look (from inside the folder):")
    for line in (
        f"cd {summary.directory}",
        "lumos data list                                   # the Delta tables",
        "lumos data history quickstart.predictions         # versions with their lineage",
        "lumos eval leaderboard --task next_item           # model vs baseline",
        "lumos models quickstart                           # versions, aliases, lineage",
        f"lumos data trace quickstart.predictions --user u0000000 --as-of {summary.as_of}",
        f"mlflow ui --backend-store-uri {workspace.mlflow_tracking_uri}",
    ):
        echo(f"  {line}")
