"""`lumos ingest`: raw events → versioned sequences, vocab and rejects tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption, SetOption
from lumos.cli.output import echo, emit_json, handles_errors, print_table, progress, state
from lumos.core.config import load_config
from lumos.core.spark import workspace_spark
from lumos.core.tables import TABLE_REF
from lumos.core.workspace import open_workspace
from lumos.data.recipe import IngestRecipe


@handles_errors
def ingest(
    ctx: typer.Context,
    recipe_file: Annotated[Path, typer.Option("--recipe", "-r", help="The ingest recipe (ingest.toml).")],
    source: Annotated[
        str | None, typer.Option("--source", help="Read events from here instead of the recipe's source.path.")
    ] = None,
    overrides: SetOption = None,
    json_output: JsonOption = False,
) -> None:
    """Validate events, build vocabularies and per-user sequences, and write them as new table versions.

    Bad rows go to DATASET.rejects with a reason; if too many are bad nothing is written (exit 2).
    Rerunning the same recipe over the same input versions writes nothing and reports the existing
    versions. See lumos/quickstart/ingest.toml for a commented recipe.
    """
    from lumos.data.ingest import run_ingest  # imports Spark's Python side; keep `lumos --help` fast

    overrides = list(overrides or [])
    if source is not None:
        # --source is relative to where the user stands, unlike recipe paths (relative to the recipe).
        keep = "://" in source or (TABLE_REF.match(source) and not Path(source).exists())
        location = source if keep else str(Path(source).resolve())
        overrides.append(f"source.path={location}")
    recipe = load_config(IngestRecipe, recipe_file, overrides)
    workspace = open_workspace(state(ctx).workspace_dir)
    workspace.ensure_root()
    with progress(f"ingesting {recipe.dataset}") as report:
        report("starting Spark")
        spark = workspace_spark(workspace)
        result = run_ingest(spark, workspace, recipe, recipe_file.resolve().parent, report)
    if json_output:
        emit_json(result)
        return
    stats = result.stats
    verb = "already up to date" if result.reused else "ingested"
    echo(f"[bold]{verb}[/bold]: {result.dataset}", markup=True)
    rows = [
        ("rows read", f"{stats.get('rows_read', 0):,}"),
        ("rows rejected", f"{stats.get('rows_rejected', 0):,}  " + ", ".join(
            f"{rule}={count}" for rule, count in stats.get("rejected_by_rule", {}).items())),
        *([("events, item not in items", f"{stats['events_item_missing']:,}")] if "events_item_missing" in stats else []),
        ("users", f"{stats.get('users', 0):,}"),
        ("tokens", f"{stats.get('tokens', 0):,}"),
        ("rows by split", ", ".join(f"{split}={count:,}" for split, count in stats.get("rows_by_split", {}).items())),
        *[(role, name) for role, name in sorted(result.tables.items())],
    ]
    print_table("", ["", ""], rows)
    echo(f"lineage: lumos data history {result.dataset}.sequences")
