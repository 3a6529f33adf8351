"""Options that several verbs share, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE",
                 help="Override one setting of the file by its dotted key, e.g. --set run.max_steps=50 (repeatable)."),
]

RunOption = Annotated[str | None, typer.Option("--run", help="The MLflow training run.")]

ModelOption = Annotated[str | None, typer.Option("--model", help="A registered model, NAME@alias.")]


def given(**values: object) -> dict[str, object]:
    """The options the user gave. Options whose default lives in a core dataclass or function
    default to None here and are left out, so that the core's default applies: each default is
    declared once, and the CLI does not import the heavy module to read it."""
    return {name: value for name, value in values.items() if value is not None}
