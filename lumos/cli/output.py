"""How every verb talks: Rich on a terminal, plain log lines otherwise, one JSON object with --json.

Human output goes to stderr so that stdout carries only the `--json` summary, which scripts parse.
Errors map to exit codes (lumos.core.errors) and print without a traceback unless --debug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from lumos.core.config import InvalidFields
from lumos.core.disk import full_disk_message
from lumos.core.errors import EXIT_RUNTIME, EXIT_USAGE, LumosError
from lumos.core.tracking import locked_store_message


@dataclasses.dataclass
class CliState:
    """Options of the root command, shared by every verb through the Typer context."""

    workspace_dir: str | None = None
    debug: bool = False


def state(ctx: typer.Context) -> CliState:
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def stderr_console() -> Console:
    # Built per call: the test runner swaps sys.stderr between invocations.
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def is_terminal() -> bool:
    return sys.stderr.isatty()


def log(message: str) -> None:
    """A plain, timestamped line on stderr (cron and CI logs), or a dim line on a terminal."""
    if is_terminal():
        stderr_console().print(f"[dim]{message}[/dim]")
    else:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{stamp} lumos: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """A `report(step)` callback: a live spinner on a terminal, log lines otherwise."""
    if not is_terminal():
        log(title)
        yield log
        return
    console = stderr_console()
    with console.status(f"{title}…") as status:
        def report(step: str) -> None:
            console.print(f"[dim]  {step}[/dim]")
            status.update(f"{title}: {step}…")

        yield report


def emit_json(payload: Any) -> None:
    """The one machine-readable summary of a command, on stdout (dataclasses as their fields)."""
    sys.stdout.write(json.dumps(json_data(payload), indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def json_data(value: Any) -> Any:
    """A core result as JSON data: each dataclass becomes a dict of its fields, recursively, so a
    verb's `--json` keys are its result dataclass's field names. Dates print as ISO text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: json_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: json_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_data(item) for item in value]
    return value


def renamed(data: dict[str, Any], **new_names: str) -> dict[str, Any]:
    """`data` with some keys renamed (old=new), for JSON keys older than the field names."""
    return {new_names.get(key, key): value for key, value in data.items()}


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title or None, title_justify="left", show_header=any(columns))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*["" if cell is None else escape(str(cell)) for cell in row])
    # Off a terminal there is no width to fit; wide rows read better in logs than wrapped cells.
    width = None if sys.stdout.isatty() else 200
    Console(file=sys.stdout, highlight=False, width=width).print(table)


def echo(message: str = "", markup: bool = False) -> None:
    """Print to stdout; Rich markup such as [bold] only when asked, so TOML's [tables] survive."""
    Console(file=sys.stdout, highlight=False, soft_wrap=True).print(message, markup=markup)


def handles_errors(command: Callable) -> Callable:
    """Turn Lumos errors into their exit codes with one clear message; tracebacks only with --debug."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        ctx = kwargs.get("ctx")  # Typer passes parameters by name; verbs name their context `ctx`
        debug = state(ctx).debug if ctx is not None else False
        try:
            return command(*args, **kwargs)
        except (LumosError, InvalidFields) as error:
            # InvalidFields: a dataclass built from options refused them; that is bad input too.
            if debug:
                traceback.print_exc()
            stderr_console().print(f"[bold red]error:[/bold red] {escape(str(error))}")
            raise typer.Exit(getattr(error, "exit_code", EXIT_USAGE)) from None
        except KeyboardInterrupt:
            stderr_console().print("[bold red]interrupted[/bold red]")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as error:
            if debug:
                traceback.print_exc()
            known = locked_store_message(error) or full_disk_message(error)
            if known:
                stderr_console().print(f"[bold red]error:[/bold red] {escape(known)}")
                raise typer.Exit(EXIT_RUNTIME) from None
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            stderr_console().print(
                f"[bold red]error:[/bold red] {type(error).__name__}: {escape(message)}\n"
                "  rerun with --debug for the traceback"
            )
            raise typer.Exit(EXIT_RUNTIME) from None

    return wrapper


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)
