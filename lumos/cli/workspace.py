"""`lumos init [DIR]`: start a project with a commented lumos.toml of the embedded defaults."""

from __future__ import annotations

from typing import Annotated

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import echo, emit_json, handles_errors, state
from lumos.core.workspace import init_workspace


@handles_errors
def init(
    ctx: typer.Context,
    directory: Annotated[
        str | None, typer.Argument(help="Project folder to create or use (default: --workspace, else here).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing lumos.toml.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Write DIR/lumos.toml holding every setting with its default and an explanation."""
    target = init_workspace(directory or state(ctx).workspace_dir or ".", force=force)
    if json_output:
        emit_json({"config_file": str(target.resolve())})
    else:
        echo(f"wrote {target}\nnext: `lumos doctor` checks this machine; `lumos config show` prints the settings")
