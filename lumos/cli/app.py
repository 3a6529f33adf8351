"""The root `lumos` command: global options, then one sub-command per verb."""

from __future__ import annotations

from typing import Annotated

import typer

import lumos
from lumos.cli import config, data, doctor, evaluate, infer, ingest, promote, quickstart, train, workspace
from lumos.cli.compile import compile_model
from lumos.cli.output import state
from lumos.cli.reproduce import reproduce
from lumos.cli.sweep import CONTEXT as SWEEP_CONTEXT
from lumos.cli.sweep import sweep

app = typer.Typer(
    name="lumos",
    help=(
        "Foundation models of user behaviour: raw events → versioned Delta tables → trained, evaluated, "
        "promoted models → nightly predictions. Start with `lumos init`, then `lumos doctor`."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lumos {lumos.__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    workspace_dir: Annotated[
        str | None,
        typer.Option("--workspace", "-w", help="Project folder holding lumos.toml (default: nearest one above the working directory)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    cli_state = state(ctx)
    cli_state.workspace_dir = workspace_dir
    cli_state.debug = debug


app.command("init")(workspace.init)
app.command("doctor")(doctor.doctor)
app.command("ingest")(ingest.ingest)
app.command("train")(train.train)
app.add_typer(config.app, name="config")
app.add_typer(data.app, name="data")
app.add_typer(evaluate.app, name="eval")
app.command("promote")(promote.promote)
app.command("models")(promote.models)
app.command("infer")(infer.infer)
app.command("quickstart")(quickstart.quickstart)
app.command("compile")(compile_model)
app.command("reproduce")(reproduce)
app.command("sweep", context_settings=SWEEP_CONTEXT)(sweep)


def main() -> None:
    app()
