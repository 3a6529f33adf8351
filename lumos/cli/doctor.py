"""`lumos doctor`: check the machine against what the embedded defaults need."""

from __future__ import annotations

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import emit_json, handles_errors, print_table, progress, state
from lumos.core.doctor import run_checks
from lumos.core.errors import EXIT_RUNTIME
from lumos.core.workspace import open_workspace


@handles_errors
def doctor(
    ctx: typer.Context,
    json_output: JsonOption = False,
) -> None:
    """Check Java, Spark with Delta, the MLflow store, gcc, a CUDA compiler and a GPU.

    Exits 0 when everything the embedded defaults need works (CUDA and GPU are optional).
    """
    workspace = open_workspace(state(ctx).workspace_dir)
    with progress("checking this machine") as report:
        checks = run_checks(workspace, report)
    healthy = all(check.ok for check in checks if check.required)
    if json_output:
        emit_json({"ok": healthy, "checks": checks})
    else:
        rows = [
            ("ok" if c.ok else ("MISSING" if c.required else "absent (optional)"), c.name, c.detail, "" if c.ok else c.fix)
            for c in checks
        ]
        print_table("lumos doctor", ["status", "check", "found", "fix"], rows)
    if not healthy:
        raise typer.Exit(EXIT_RUNTIME)
