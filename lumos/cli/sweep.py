"""`lumos sweep`: one recipe over a grid and seeds as nested MLflow runs; mean ± std per point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption, SetOption
from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress, state
from lumos.core.errors import LumosError, UsageError
from lumos.core.workspace import open_workspace

# `--seeds 0 1 2`: click options take one value, so the seeds after the first arrive as extra arguments.
CONTEXT = {"allow_extra_args": True}


@handles_errors
def sweep(
    ctx: typer.Context,
    config_file: Annotated[Path, typer.Option("--config", "-c", help="The training recipe (train.toml).")],
    grid: Annotated[
        list[str] | None, typer.Option("--grid", help="KEY=V1,V2,… : a config field and its values (repeatable).")
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds, e.g. --seeds 0 1 2 (or 0,1,2).")] = "0",
    parallel: Annotated[int, typer.Option("--parallel", help="Children trained at once, each in its own process.")] = 1,
    overrides: SetOption = None,
    evaluate_best: Annotated[bool, typer.Option("--eval", help="Score the best point's seeds on the tasks.")] = False,
    tasks_dir: Annotated[Path | None, typer.Option("--tasks", help="Folder of task specs for --eval.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Train a recipe at every point of a grid, once per seed, as children of one MLflow run.

    `lumos sweep --config train.toml --grid optim.lr=1e-3,2e-3 --grid model.dropout=0.1,0.3 --seeds 0 1 2`
    trains 4 points × 3 seeds. Rerunning the same command resumes: finished children with the
    same config hash are kept. Prints mean ± std over seeds of the valid metric per point, best
    first; `--eval` scores the best point's seeds on the tasks (then `lumos eval leaderboard
    --task T --group-by config` shows mean ± std per config).
    """
    from lumos.experiments.sweep import sweep as run_sweep

    workspace = open_workspace(state(ctx).workspace_dir)
    result_seeds = _seeds([seeds, *ctx.args])
    with progress("sweeping") as report:
        result = run_sweep(workspace, config_file, grid or [], result_seeds, overrides or [], parallel,
                           evaluate_best, tasks_dir, report)
    if json_output:
        emit_json({"parent_run_id": result.parent_run_id, "experiment": result.experiment, "metric": result.metric,
                   "direction": result.direction, "trained": result.trained, "skipped": result.skipped,
                   "failed": result.failed, "points": [
                       {"point": list(s.point.overrides), "label": s.point.label, "runs": {str(k): v for k, v in s.runs.items()},
                        "values": {str(k): v for k, v in s.values.items()}, "mean": s.mean, "std": s.std}
                       for s in result.points],
                   "evaluation": {task: {name: {"mean": mean, "std": std} for name, (mean, std) in metrics.items()}
                                  for task, metrics in result.evaluation.items()}})
    else:
        print_table(f"sweep {result.parent_run_id}: {result.metric} ({result.direction}) over seeds, best first",
                    ["point", "seeds", f"{result.metric} mean ± std"],
                    [(s.point.label, len(s.values), f"{s.mean:.4f} ± {s.std:.4f}") for s in result.points])
        for task, metrics in result.evaluation.items():
            print_table(f"{task}: best point over {len(result.points[0].runs)} seed(s)", ["metric", "mean ± std"],
                        [(name, f"{mean:.4f} ± {std:.4f}") for name, (mean, std) in metrics.items()])
        echo(f"trained {result.trained}, kept {result.skipped} finished; rerun the same command to resume")
    if result.failed:
        raise LumosError("some children failed (rerun the same command to retry them):\n  " + "\n  ".join(result.failed))


def _seeds(items: list[str]) -> list[int]:
    seeds = []
    for item in items:
        for part in filter(None, item.split(",")):
            try:
                seeds.append(int(part))
            except ValueError:
                raise UsageError(f"--seeds: {part!r} is not a whole number (or an unexpected argument)") from None
    return seeds
