"""`lumos train`: train the user model on a sequences table version and log the run to MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lumos.cli.options import JsonOption, SetOption, given
from lumos.cli.output import echo, emit_json, handles_errors, json_data, print_table, progress, renamed, state
from lumos.core.config import load_config
from lumos.core.errors import UsageError
from lumos.core.workspace import open_workspace


@handles_errors
def train(
    ctx: typer.Context,
    config_file: Annotated[Path, typer.Option("--config", "-c", help="The training recipe (train.toml).")],
    data: Annotated[
        str | None, typer.Option("--data", help="Sequences table, dataset.sequences[@VERSION]; overrides data.table.")
    ] = None,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Ranks on this machine (DDP: gloo on CPU, nccl on GPU).")] = None,
    nnodes: Annotated[
        int | None, typer.Option("--nnodes", help="Machines in the run, each running this command with the same --nproc.")
    ] = None,
    node_rank: Annotated[
        int | None, typer.Option("--node-rank", help="This machine's place, 0 … nnodes-1; node 0 logs the MLflow run.")
    ] = None,
    master_addr: Annotated[
        str | None, typer.Option("--master-addr", help="Address of node 0, where the ranks meet (with --nnodes > 1).")
    ] = None,
    master_port: Annotated[
        int | None, typer.Option("--master-port", help="A free port on node 0 for the ranks to meet (with --nnodes > 1).")
    ] = None,
    overrides: SetOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the memory estimate and batch size, then stop without training.")
    ] = False,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue this MLflow run from its latest checkpoint.")
    ] = None,
    init_from: Annotated[
        str | None, typer.Option("--init-from", help="Start from a trained model's weights: RUN_ID, NAME@alias or "
                                                     "NAME/VERSION (tensors matched by name and shape); overrides init_from.")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Train the encoder-decoder user model; every run is an MLflow run with its lineage.

    The run records the exact data version, the resolved config and its hash, the data recipe and
    the seed, logs losses, learning rate, samples/s and data-wait every few steps, and keeps
    checkpoints (safetensors) from which the model rebuilds alone. Ctrl-C or SIGTERM writes a
    checkpoint and exits 130; `--resume RUN_ID` continues it. `--init-from` starts from a trained
    run's weights (fine-tuning; `freeze` in the recipe keeps parts fixed) and records that run as
    the parent. See lumos/quickstart/train.toml.
    """
    from lumos.train.config import TrainConfig
    from lumos.train.loop import FitResult
    from lumos.train.run import Nodes
    from lumos.train.run import train as run_training

    overrides = list(overrides or [])
    if data is not None:
        overrides.append(f"data.table={data}")
    if init_from is not None:
        if resume is not None:
            raise UsageError("--init-from with --resume: a resumed run continues from its own checkpoint")
        overrides.append(f"init_from={init_from}")
    config = load_config(TrainConfig, config_file, overrides)
    nodes = Nodes(**given(count=nnodes, rank=node_rank, master_addr=master_addr, master_port=master_port))
    workspace = open_workspace(state(ctx).workspace_dir)
    with progress("training") as report:
        summary = run_training(config, workspace, resume_run_id=resume, dry_run=dry_run, report=report, nodes=nodes,
                               **given(nproc=nproc))
    result = summary.result
    if json_output:
        # The fit result's fields sit beside the summary's (a dry run has none: zero values).
        fields = renamed(json_data(summary), memory_estimate="memory_estimate_bytes")
        fit = fields.pop("result") or json_data(FitResult(step=0, interrupted=False))
        emit_json({**fields, **fit, "memory_estimate_bytes": dict(summary.memory_estimate)})
        if result and result.interrupted:
            raise typer.Exit(130)  # as without --json: a script must not take a stopped run for a finished one
        return
    print_table(
        f"memory per rank at batch {summary.batch_size // max(summary.world_size * config.run.grad_accum, 1)}",
        ["", "MiB"], [(name, f"{size / 2**20:,.1f}") for name, size in summary.memory_estimate],
    )
    if summary.init_from is not None:
        found = summary.init_from
        new = f": {', '.join(found.new)}" if found.new else ""
        echo(f"started from run {found.run}{f' ({found.model})' if found.model else ''}, trained on {found.data}: "
             f"{found.loaded} tensors loaded, {len(found.new)} new{new}")
    if summary.frozen:
        echo(f"frozen: {len(summary.frozen)} parameter tensors under {', '.join(config.freeze)}")
    if summary.dry_run:
        echo(f"would train {summary.parameters:,} parameters on {summary.data} with batch size {summary.batch_size}")
        return
    losses = ", ".join(f"{task} {value:.4f}" for task, value in (result.valid_losses or result.train_losses).items())
    verb = "interrupted at" if result.interrupted else "trained"
    echo(f"{verb} step {result.step}: {losses}")
    if summary.run_id is None:
        echo(f"node {nodes.rank} of {nodes.count}: node 0 logs the run")
    else:
        echo(f"run {summary.run_id} in experiment {summary.experiment}; resume with --resume {summary.run_id}")
        echo(f"see it: mlflow ui --backend-store-uri {workspace.mlflow_tracking_uri}")
    if result.interrupted:
        raise typer.Exit(130)
