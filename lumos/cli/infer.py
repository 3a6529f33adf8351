"""`lumos infer`: nightly batch predictions for every user into one Delta partition per date."""

from __future__ import annotations

import datetime
from typing import Annotated

import typer

from lumos.cli.options import JsonOption, given
from lumos.cli.output import echo, emit_json, handles_errors, json_data, progress, state
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace


def parse_date(text: str | None, flag: str) -> datetime.date:
    if text is None:
        return datetime.datetime.now(datetime.UTC).date()
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected a date YYYY-MM-DD") from None


@handles_errors
def infer(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="NAME@alias (e.g. quickstart@production) or NAME/VERSION.")],
    as_of: Annotated[str | None, typer.Option("--as-of", help="Date to predict for, YYYY-MM-DD (default: today, UTC).")] = None,
    source: Annotated[str | None, typer.Option("--source", help="Events to read instead of the source in the model's data lineage.")] = None,
    output: Annotated[str | None, typer.Option("--output", help="dataset.table to write (default: DATASET.predictions).")] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="torch, or compiled (a plan from `lumos compile`; torch when none).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Items to recommend per user.")] = None,
    include_history: Annotated[bool, typer.Option("--include-history", help="Allow items the user already has in the top-k.")] = False,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Rows per model call inside each Spark task.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="Torch threads per Spark task (Spark runs one task per core).")] = None,
    full: Annotated[bool, typer.Option("--full", help="Rebuild the user state from the whole event log instead of reading only the new events.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Score every user with history before --as-of and write partition as_of=DATE of DATASET.predictions.

    The features are rebuilt with the recipe and vocabulary version recorded in the model's
    lineage (unseen users and items get the out-of-vocabulary id). Each row holds the user
    embedding, the top-k items with scores, and each horizon's act probability and value. A rerun
    for the same date replaces exactly that partition, in one commit whose lineage names the
    model version, run, data versions, recipe hash and engine. Each user's last tokens are kept in
    DATASET.user_state, so a night reads only the events since the last run; the first run, a
    changed recipe, vocabulary or rewritten source, an earlier date, or --full rebuilds it from
    the whole log (--json: mode, mode_reason, events_read, users_updated). Built for cron: no prompts; exit 2
    for bad input (nothing written), 1 when another run holds the same date or on failure.
    See examples/cron/daily_infer.sh.
    """
    from lumos.infer.run import InferOptions
    from lumos.infer.run import infer as run_infer

    options = InferOptions(as_of=parse_date(as_of, "--as-of"), source=source, output=output,
                           exclude_history=not include_history, full=full,
                           **given(engine=engine, top_k=top_k, batch_size=batch_size, torch_threads=threads))
    workspace = open_workspace(state(ctx).workspace_dir)
    with progress(f"inferring with {model} as of {options.as_of}") as report:
        summary = run_infer(workspace, model, options, report)
    if json_output:
        emit_json({**json_data(summary), "seconds": round(summary.seconds, 2)})
        return
    echo(f"wrote {summary.rows:,} predictions to {summary.output} (as_of={summary.as_of}) with {summary.model} "
         f"[{summary.engine}] in {summary.seconds:.0f} s")
