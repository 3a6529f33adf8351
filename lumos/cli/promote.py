"""`lumos promote`: register a run behind eval gates and move an alias; `lumos models`: what is registered."""

from __future__ import annotations

import datetime
from typing import Annotated

import typer

from lumos.cli.options import JsonOption
from lumos.cli.output import echo, emit_json, handles_errors, json_data, print_table, renamed, state
from lumos.core.errors import UsageError
from lumos.core.registry import DEFAULT_ALIAS
from lumos.core.workspace import open_workspace


@handles_errors
def promote(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="Registered model name, e.g. quickstart.")],
    run_id: Annotated[str | None, typer.Argument(help="The training run to promote (omit with --version).")] = None,
    alias: Annotated[str, typer.Option("--alias", help="The alias to move.")] = DEFAULT_ALIAS,
    version: Annotated[int | None, typer.Option("--version", help="Move the alias to this existing version (rollback).")] = None,
    require: Annotated[
        list[str] | None,
        typer.Option("--require", help="TASK:METRIC>=VALUE (or <=, >, <) the run's eval must meet (repeatable)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the gates and say what would change; write nothing.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Promote a finished training run to NAME@alias, or roll the alias back with --version.

    The run's checkpoint becomes a new version of the registered model (the existing version when
    the run is already registered), with the run's lineage (data version, recipe and config
    hashes, code version, seed) and eval results as version tags; then the alias moves.
    `--require next_item:ndcg@10>=0.1` gates on what `lumos eval` logged for the run: a missing
    result or a missed bar refuses with exit code 3, as does a run that is not a finished Lumos
    training run. Nightly jobs name only NAME@alias, so promotion is what changes production.
    """
    from lumos.eval.promote import parse_requirement
    from lumos.eval.promote import promote as promote_run

    requirements = [parse_requirement(item) for item in require or []]
    workspace = open_workspace(state(ctx).workspace_dir)
    result = promote_run(workspace, model, alias, run_id=run_id, version=version, requirements=requirements,
                         dry_run=dry_run)
    if json_output:
        emit_json(renamed(json_data(result), name="model"))
        return
    for check in result.checks:
        echo(f"  passed {check}")
    target = f"version {result.version}" if result.version else "a new version"
    was = f" (was version {result.previous_version})" if result.previous_version else ""
    verb = "would point" if dry_run else "now points"
    echo(f"{result.name}@{result.alias} {verb} at {target} from run {result.run_id}{was}")
    if not dry_run:
        echo(f"roll back: lumos promote --model {result.name} --alias {result.alias} --version VERSION")


@handles_errors
def models(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="A registered model: list its versions.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Registered models with their aliases; with NAME, every version with its aliases and lineage."""
    from lumos.core.registry import model_versions, registered_names
    from lumos.core.runs import CONFIG_HASH_TAG, DATA_TAG
    from lumos.eval.promote import version_json

    workspace = open_workspace(state(ctx).workspace_dir)
    if name is None:
        listing = []
        for model_name in registered_names(workspace):
            versions = model_versions(workspace, model_name)
            aliases = {alias: v.version for v in versions for alias in v.aliases}
            listing.append({"name": model_name, "latest_version": versions[0].version if versions else None,
                            "aliases": aliases})
        if json_output:
            emit_json({"models": listing})
        elif listing:
            print_table("registered models", ["model", "latest version", "aliases"],
                        [(m["name"], m["latest_version"], ", ".join(f"{a} → {v}" for a, v in sorted(m["aliases"].items())))
                         for m in listing])
        else:
            echo("no registered models yet; `lumos promote RUN_ID --model NAME` registers one")
        return
    versions = model_versions(workspace, name)
    if not versions:
        raise UsageError(f"no registered model {name!r}; `lumos models` lists them")
    if json_output:
        emit_json({"name": name, "versions": [version_json(v) for v in versions]})
        return
    rows = [(v.version, ", ".join(v.aliases), v.run_id, v.tags.get(DATA_TAG, ""),
             v.tags.get(CONFIG_HASH_TAG, "")[:19], _date(v.created_at)) for v in versions]
    print_table(f"{name}: {len(versions)} version(s)", ["version", "aliases", "run", "data", "config hash", "registered"], rows)


def _date(millis: int) -> str:
    return datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M") if millis else ""
