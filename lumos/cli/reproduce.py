"""`lumos reproduce RUN_ID`: rebuild a run from its lineage and print recorded against reproduced."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import echo, emit_json, handles_errors, log, print_table, progress, state
from lumos.core.errors import GateError
from lumos.core.workspace import open_workspace


@handles_errors
def reproduce(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The training run to rebuild.")],
    tolerance: Annotated[
        float, typer.Option("--tolerance", help="On GPU or several ranks: |a - b| <= T × max(1, |a|) counts as a match.")
    ] = 0.01,
    tasks_dir: Annotated[Path | None, typer.Option("--tasks", help="Folder of task specs (default: the project's).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Rebuild a training run from its lineage alone and show that the result matches.

    Checks that the inputs of its data still exist unchanged (exit 2 naming what changed), ingests
    the recorded recipe again into a new sequences version and compares its content hash, retrains
    with the recorded config, seed and thread count, evaluates the tasks the run was scored on, and
    prints recorded against reproduced. Exit 0 when everything matches (exactly on CPU with one
    rank; within --tolerance on GPU or several ranks), 3 when not. Warns when the code differs.
    """
    from lumos.experiments.reproduce import reproduce as reproduce_run

    workspace = open_workspace(state(ctx).workspace_dir)
    with progress(f"reproducing run {run_id}") as report:
        result = reproduce_run(workspace, run_id, tolerance, tasks_dir, report)
    for warning in result.warnings:
        log(f"warning: {warning}")
    if json_output:
        emit_json(result.to_json())
    else:
        rows = [(c.name, _cell(c.recorded), _cell(c.reproduced), "yes" if c.match else "NO") for c in result.comparisons]
        print_table(f"run {result.run_id} (data {result.data_recorded}) against run {result.reproduced_run_id} "
                    f"(data {result.data_rebuilt}), {result.mode}", ["", "recorded", "reproduced", "match"], rows)
        echo(f"code: recorded {result.code_recorded}, now {result.code_current}")
        if result.parent_run_id:
            echo(f"both started from the weights of parent run {result.parent_run_id} (lumos reproduce it to rebuild it)")
    if not result.matches:
        differing = [c.name for c in result.comparisons if not c.match]
        raise GateError(f"run {result.run_id} did not reproduce ({result.mode}): {', '.join(differing)} differ")
    if not json_output:
        echo(f"run {result.run_id} reproduced ({result.mode})")


def _cell(value) -> str:
    if isinstance(value, float):
        return repr(value)  # every digit: an exact match must be visible as one
    return "" if value is None else str(value)
