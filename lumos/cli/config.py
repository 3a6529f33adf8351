"""`lumos config show`: the resolved settings, after lumos.toml and --set overrides."""

from __future__ import annotations

import typer

from lumos.cli.options import JsonOption, SetOption
from lumos.cli.output import echo, emit_json, handles_errors, state
from lumos.core.config import to_plain, to_toml
from lumos.core.workspace import open_workspace

app = typer.Typer(help="Inspect the project settings (lumos.toml).", no_args_is_help=True)

@app.command("show")
@handles_errors
def show(
    ctx: typer.Context,
    overrides: SetOption = None,
    json_output: JsonOption = False,
) -> None:
    """Print the resolved settings and where they came from."""
    workspace = open_workspace(state(ctx).workspace_dir, overrides or [])
    if json_output:
        emit_json({
            "config_file": str(workspace.config_file) if workspace.config_file else None,
            "workspace_root": workspace.root,
            "mlflow_tracking_uri": workspace.mlflow_tracking_uri,
            "settings": to_plain(workspace.settings),
        })
        return
    source = workspace.config_file or "embedded defaults (no lumos.toml found)"
    echo(f"# from: {source}\n# workspace root: {workspace.root}\n# mlflow: {workspace.mlflow_tracking_uri}\n")
    echo(to_toml(workspace.settings))
