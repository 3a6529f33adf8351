"""`lumos train`: plan the run once, launch 1..N ranks of the training loop, record everything in MLflow.

The parent process pins the data version, rebuilds the model to size it, picks the batch size
(fixed or "auto"), opens the MLflow run with params, lineage tags and artifacts, then runs
`fit` itself (one rank) or spawns N ranks with torch.multiprocessing (gloo on CPU, nccl on GPU).
On several machines (`Nodes`), each runs one such process for its ranks; node 0's does the MLflow
work. Under torchrun (WORLD_SIZE set) every process is a rank and rank 0 does the parent's MLflow work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lumos.core.config import config_hash, to_plain, to_toml
from lumos.core.errors import LumosError, UsageError
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.progress import Report
from lumos.core.runs import (
    CHECKPOINT_TAG,
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATA_TAG,
    DATA_VERSION_TAG,
    INIT_CHECKPOINT_TAG,
    INIT_DATA_TAG,
    INIT_MODEL_TAG,
    INIT_RUN_TAG,
    MODEL_URI_TAG,
    RECIPE_HASH_TAG,
    SEED_TAG,
    STAGE_TAG,
    STEP_TAG,
    TRAIN_STAGE,
    delta_dataset_input,
    download_checkpoint,
)
from lumos.core.tables import TableRef, table_location
from lumos.core.tracking import NOTE_TAG, ensure_experiment, flatten_params, source_tags, tracking_client
from lumos.core.workspace import Workspace
from lumos.data.loader import SequenceLoader
from lumos.data.sequences_version import open_sequences
from lumos.train.checkpoint import load_model, load_training_state
from lumos.train.config import TrainConfig
from lumos.train.init_from import InitSource, InitSummary, frozen_parameters, prepare_init
from lumos.train.loop import LAUNCHER_STORE, RENDEZVOUS_FILE, FitPlan, FitResult, fit
from lumos.train.memory import estimate_memory, find_batch_size
from lumos.train.model import LumosModel

SYSTEM_METRICS_INTERVAL_S = 5


@dataclass(frozen=True)
class Nodes:
    """The machines a run spans, in torchrun's terms: each runs `lumos train` with the same
    `--nproc`, and global rank = node_rank × nproc + local rank."""

    count: int = 1
    """How many machines (--nnodes)."""
    rank: int = 0
    """This machine's place among them, 0 … count-1 (--node-rank); node 0 owns the MLflow run."""
    master_addr: str | None = None
    """Address of node 0, where rank 0 listens for the others (--master-addr)."""
    master_port: int | None = None
    """Port on node 0 for that rendezvous (--master-port); without it, one machine's ranks meet in a file."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise UsageError(f"--nnodes {self.count}: must be at least 1")
        if not 0 <= self.rank < self.count:
            raise UsageError(f"--node-rank {self.rank}: must be between 0 and --nnodes - 1 = {self.count - 1}")
        if self.count > 1 and (self.master_addr is None or self.master_port is None):
            raise UsageError(f"--nnodes {self.count} needs --master-addr and --master-port: node 0's address "
                             "and a free port there, the same on every node")


ONE_NODE = Nodes()


@dataclass
class TrainSummary:
    run_id: str | None
    experiment: str
    data: str
    batch_size: int
    batch_size_search: list[tuple[int, int, bool]] = field(default_factory=list)
    memory_estimate: list[tuple[str, int]] = field(default_factory=list)
    parameters: int = 0
    world_size: int = 1
    result: FitResult | None = None
    dry_run: bool = False
    init_from: InitSummary | None = None
    """With config.init_from: the parent run, how many tensors were loaded and which were new."""
    frozen: list[str] = field(default_factory=list)
    """The parameters config.freeze keeps fixed."""


def train(
    config: TrainConfig,
    workspace: Workspace,
    nproc: int = 1,
    resume_run_id: str | None = None,
    dry_run: bool = False,
    report: Report = lambda _: None,
    nodes: Nodes = ONE_NODE,
) -> TrainSummary:
    if nproc < 1:
        raise UsageError("--nproc must be at least 1")
    if nodes.count > 1 and "WORLD_SIZE" in os.environ:
        raise UsageError("under torchrun, give --nnodes and --node-rank to torchrun, not to lumos train")
    world_size = int(os.environ.get("WORLD_SIZE", nproc * nodes.count))
    resume_dir = None
    if resume_run_id:
        config, resume_dir = _resume_source(workspace, resume_run_id)
        started_with = len(load_training_state(resume_dir).rng)  # one RNG state per rank
        if started_with != world_size:
            raise UsageError(f"--resume {resume_run_id}: the run trained on {started_with} rank(s); resume it with --nproc {started_with}")
    sequences = open_sequences(workspace, TableRef.parse(config.data.table))
    data = str(sequences.ref)
    model = LumosModel(config.model, sequences.spec)
    report(f"data {data}: {model.num_parameters():,} parameters")

    summary = TrainSummary(run_id=resume_run_id, experiment=config.run.experiment, data=data, batch_size=0,
                           parameters=model.num_parameters(), world_size=world_size, dry_run=dry_run)
    train_loader = SequenceLoader(sequences.snapshot, sequences.spec, 1, split=config.data.train_split, num_workers=0)
    train_rows = train_loader.rows
    global_batch, micro_batch = _batch_sizes(config, model, world_size, train_rows, summary, report)
    summary.batch_size = global_batch
    summary.memory_estimate = estimate_memory(model, micro_batch).rows()
    config = replace(config, run=replace(config.run, batch_size=global_batch))
    _check_batch_fits(config, data, train_rows, micro_batch, world_size)
    summary.frozen = frozen_parameters(model, config.freeze)  # an unknown prefix: exit 2 before any run exists
    init = None
    if config.init_from is not None and resume_run_id is None:  # a resumed run continues its own weights
        init = _init_source(workspace, config.init_from, model, sequences.ref, report)
        summary.init_from = init.summary
        config = replace(config, init_from=init.summary.run)  # the run id, wherever the alias points later
    if dry_run:
        _remove_init(init)
        return summary
    try:
        plan = FitPlan(config=config, workspace=workspace, data=data, micro_batch=micro_batch, run_id=None,
                       checkpoint_dir="", resume_from=str(resume_dir) if resume_dir else None,
                       init_weights=str(init.weights_file) if init else None)
        with rendezvous_store(nodes, world_size):
            return _run(plan, sequences, train_loader.columns, resume_run_id, summary, report, nodes)
    finally:
        _remove_init(init)


def _run(plan: FitPlan, sequences, columns: list[str], resume_run_id: str | None, summary: TrainSummary,
         report: Report, nodes: Nodes) -> TrainSummary:
    """Launch the planned ranks; on rank 0 of node 0, inside the MLflow run it opens and closes."""
    workspace = plan.workspace
    if int(os.environ.get("RANK", "0")) != 0 or nodes.rank != 0:
        # A torchrun rank other than 0, or a node other than 0: it computes; rank 0 owns the MLflow
        # run and checkpoints.
        plan = replace(plan, checkpoint_dir=tempfile.mkdtemp(prefix="lumos-rank-"))
        summary.result = launch(plan, summary.world_size, report, nodes)
        return summary
    client, run_id = _open_run(workspace, plan.config, sequences, resume_run_id, summary)
    summary.run_id = run_id
    plan = replace(plan, run_id=run_id, checkpoint_dir=str(Path(workspace.path("runs", run_id, "checkpoints"))))
    status = "FAILED"
    monitor = _system_metrics(workspace, run_id)
    try:
        result = launch(plan, summary.world_size, report, nodes)
        summary.result = result
        if result.failure is not None:
            kept = f"the last good checkpoint is {result.checkpoint}" if result.checkpoint else "no checkpoint was written"
            raise LumosError(f"training stopped at {result.failure}; run {run_id} is FAILED and {kept}. "
                             "Look for NaN or infinite values in the data, or lower optim.lr")
        if not result.interrupted and result.checkpoint:
            report("logging the checkpoint as an MLflow model")
            _log_model(workspace, run_id, Path(result.checkpoint), sequences, columns)
        status = "KILLED" if result.interrupted else "FINISHED"
        return summary
    finally:
        _stop_system_metrics(monitor)
        client.set_terminated(run_id, status)


def _init_source(workspace: Workspace, ref: str, model: LumosModel, data: TableRef, report: Report) -> InitSource:
    """The parent `init_from` names, checked against `model` (exit 2 on a mismatch, before any run exists)."""
    report(f"init_from {ref}: reading its checkpoint")
    init = prepare_init(workspace, ref, model, data)
    found = init.summary
    named = f" ({found.model})" if found.model else ""
    new = f": {', '.join(found.new)}" if found.new else ""
    report(f"init_from run {found.run}{named}, trained on {found.data}: {found.loaded} tensors loaded, "
           f"{len(found.new)} new{new}")
    return init


def _remove_init(init: InitSource | None) -> None:
    if init is not None:
        shutil.rmtree(init.weights_file.parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Planning


def _batch_sizes(
    config: TrainConfig, model: LumosModel, world_size: int, train_rows: int, summary: TrainSummary, report: Report
) -> tuple[int, int]:
    """(global batch, per-rank micro-batch): global = micro × ranks × grad_accum."""
    per_step = world_size * config.run.grad_accum
    if config.run.batch_size == "auto":
        # No batch larger than the split: the search stops there too.
        largest = max(1, min(config.run.max_batch_size, train_rows) // per_step)
        device = torch.device("cuda" if config.run.device != "cpu" and torch.cuda.is_available() else "cpu")
        budget = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else config.run.memory_budget_mb * 2**20
        report("finding the largest batch that fits")
        search = find_batch_size(model, device, largest, budget)
        summary.batch_size_search = search.tried
        micro = search.batch_size
        report(f"batch size: {micro} per rank (stopped by {search.limit})")
        return micro * per_step, micro
    if config.run.batch_size % per_step:
        raise UsageError(
            f"run.batch_size = {config.run.batch_size} must divide evenly over {world_size} rank(s) × "
            f"run.grad_accum = {config.run.grad_accum}; try {max(per_step, config.run.batch_size // per_step * per_step)}"
        )
    return config.run.batch_size, config.run.batch_size // per_step


def _check_batch_fits(config: TrainConfig, data: str, train_rows: int, micro_batch: int, world_size: int) -> None:
    """Each rank needs at least one whole batch (the loader drops a short last one in training)."""
    if train_rows // world_size < micro_batch:
        raise UsageError(
            f"split {config.data.train_split!r} of {data} has {train_rows} rows, fewer than one batch of "
            f"{micro_batch} per rank × {world_size} rank(s); lower run.batch_size"
        )


def _resume_source(workspace: Workspace, run_id: str) -> tuple[TrainConfig, Path]:
    """The run's own config (the one given must not change the run) and its latest checkpoint."""
    folder = download_checkpoint(workspace, run_id, "--resume")
    _, saved = load_model(folder)
    return saved, folder


def _open_run(workspace: Workspace, config: TrainConfig, sequences, resume_run_id: str | None, summary: TrainSummary):
    client = tracking_client(workspace)
    if resume_run_id:
        client.update_run(resume_run_id, status="RUNNING")
        return client, resume_run_id
    experiment_id = ensure_experiment(client, workspace, config.run.experiment)
    recipe = sequences.recipe
    init = summary.init_from
    lineage = LineageRecord(
        stage=TRAIN_STAGE,
        config=to_plain(config),
        config_hash=config_hash(config),
        inputs=[LineageInput("delta", table_location(workspace, sequences.ref), sequences.ref.version)]
        + ([LineageInput("mlflow-run", f"runs:/{init.run}", init.checkpoint)] if init else []),
        # threads: CPU results are bit-for-bit repeatable only at the same thread count (reproduce uses it).
        stats={"parameters": summary.parameters, "batch_size": summary.batch_size, "world_size": summary.world_size,
               "threads": torch.get_num_threads(), "cuda": config.run.device != "cpu" and torch.cuda.is_available(),
               "init_from": dataclasses.asdict(init) if init else None, "frozen": summary.frozen},
        seed=config.run.seed,
    )
    tags = {
        **source_tags(TRAIN_STAGE, lineage.code_version),
        NOTE_TAG: _description(sequences, lineage, config_hash(recipe), table_location(workspace, sequences.ref)),
        STAGE_TAG: TRAIN_STAGE,
        DATA_TAG: str(sequences.ref),
        DATA_VERSION_TAG: str(sequences.ref.version),
        CONFIG_HASH_TAG: lineage.config_hash,
        RECIPE_HASH_TAG: config_hash(recipe),
        CODE_VERSION_TAG: lineage.code_version,
        SEED_TAG: str(config.run.seed),
        **(_init_tags(init) if init else {}),
    }
    run = client.create_run(experiment_id, run_name=config.run.run_name or _run_name(config, lineage.config_hash), tags=tags)
    run_id = run.info.run_id
    client.log_inputs(run_id, [delta_dataset_input(sequences.ref, table_location(workspace, sequences.ref), "train")])
    for key, value in flatten_params(to_plain(config)).items():
        client.log_param(run_id, key, value)
    client.log_param(run_id, "batch_size.resolved", str(summary.batch_size))
    client.log_param(run_id, "world_size", str(summary.world_size))
    client.log_text(run_id, to_toml(config), "config.toml")
    client.log_text(run_id, json.dumps(recipe, indent=2, sort_keys=True), "recipe.json")
    client.log_text(run_id, json.dumps(json.loads(lineage.to_json()), indent=2, sort_keys=True), "lineage.json")
    return client, run_id


def _init_tags(init: InitSummary) -> dict[str, str]:
    """The parent run and its data version, the lineage a fine-tuned run adds to its own."""
    tags = {INIT_RUN_TAG: init.run, INIT_DATA_TAG: init.data, INIT_CHECKPOINT_TAG: init.checkpoint}
    return tags | ({INIT_MODEL_TAG: init.model} if init.model else {})


def _run_name(config: TrainConfig, config_hash_text: str) -> str:
    """train-d64-L2-s0-1a2b3c4d: width, encoder depth, seed and the config hash's first 8 hex digits."""
    model = config.model
    return f"train-d{model.d_model}-L{model.encoder_layers}-s{config.run.seed}-{config_hash_text.removeprefix('sha256:')[:8]}"


def _description(sequences, lineage: LineageRecord, recipe_hash: str, location: str) -> str:
    """The run's Markdown description (MLflow shows it at the top of the run page)."""
    return "\n".join([
        f"Lumos training run on **{sequences.ref}**.",
        "",
        "| lineage | |",
        "|---|---|",
        f"| data | `{sequences.ref}` (Delta table `{location}`, version {sequences.ref.version}) |",
        f"| recipe hash | `{recipe_hash}` |",
        f"| config hash | `{lineage.config_hash}` |",
        f"| commit | `{lineage.code_version}` |",
        f"| seed | {lineage.seed} |",
        *([f"| started from | run `{init['run']}`{' (' + init['model'] + ')' if init['model'] else ''}, "
           f"trained on `{init['data']}`: {init['loaded']} tensors loaded, {len(init['new'])} new |"]
          if (init := lineage.stats.get("init_from")) else []),
        "",
        "Artifacts: `config.toml` (the resolved config), `recipe.json` (the ingest recipe), `lineage.json`, "
        "`checkpoints/`. Scores from `lumos eval` appear under metrics `eval/<task>/…` and in the "
        "`lumos-eval/<task>` leaderboards.",
    ])


def _system_metrics(workspace: Workspace, run_id: str):
    """CPU, memory, disk, network (and GPU) samples logged to the run while it trains."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S, tracking_uri=workspace.mlflow_tracking_uri)
    monitor.start()
    return monitor


def _stop_system_metrics(monitor) -> None:
    """Stop sampling and log one last sample: MLflow publishes only after a whole interval, so a run
    shorter than one would have no system metrics at all."""
    monitor.finish()
    monitor.collect_metrics()
    monitor.publish_metrics(monitor.aggregate_metrics())
    monitor.mlflow_logger.flush()


def _log_model(workspace: Workspace, run_id: str, checkpoint: Path, sequences, columns: list[str]) -> None:
    """The final checkpoint as MLflow model `model` of the run, its input example three training rows."""
    import pyarrow.parquet as pq

    from lumos.train.mlflow_model import log_checkpoint_model

    example = pq.read_table(sequences.snapshot.files[0].path, columns=columns).slice(0, 3).to_pandas()
    model_uri = log_checkpoint_model(run_id, checkpoint, example, workspace.mlflow_tracking_uri)
    tracking_client(workspace).set_tag(run_id, MODEL_URI_TAG, model_uri)


# ---------------------------------------------------------------------------------------------
# Launch


def launch(plan: FitPlan, world_size: int, report: Report, nodes: Nodes = ONE_NODE) -> FitResult:
    """Run `fit` here (one rank, or a torchrun rank) or spawn this node's share of `world_size` ranks."""
    if world_size == 1 or "WORLD_SIZE" in os.environ:
        return fit(plan, **_rank0_hooks(plan, report))
    import torch.multiprocessing as mp

    local_ranks = world_size // nodes.count
    with tempfile.TemporaryDirectory(prefix="lumos-ranks-") as scratch:
        result_file = Path(scratch) / "result.json"
        if os.environ.get(LAUNCHER_STORE):
            # The ranks meet at node 0's store (rendezvous_store has set MASTER_ADDR and MASTER_PORT).
            os.environ.pop(RENDEZVOUS_FILE, None)  # an earlier one-machine launch's, in this process
        else:
            # One machine: the ranks meet in a file, not on a port. A port found free here could be
            # taken by another process before rank 0 bound it (two trainings started together).
            os.environ[RENDEZVOUS_FILE] = str(Path(scratch) / "rendezvous")
        ranks = mp.spawn(_rank_main, args=(nodes.rank * local_ranks, local_ranks, world_size, plan, str(result_file)),
                         nprocs=local_ranks, join=False)
        with _forward_signals([process.pid for process in ranks.processes]):
            try:
                while not ranks.join(grace_period=RANK_GRACE_SECONDS):
                    pass
            except mp.ProcessExitedException as error:
                # torch has stopped this node's other ranks (SIGTERM, then SIGKILL after the grace
                # period: a rank blocked in a collective cannot run its handler).
                died = f"signal {error.signal_name}" if error.signal_name else f"exit code {error.exit_code}"
                raise LumosError(f"rank {nodes.rank * local_ranks + error.error_index} (pid {error.error_pid}) died of "
                                 f"{died}; the other ranks were stopped and the run is FAILED. Resume it from its last "
                                 f"checkpoint with `lumos train --resume RUN_ID`") from None
        raw = json.loads(result_file.read_text())
    return FitResult(**raw)


@contextlib.contextmanager
def rendezvous_store(nodes: Nodes, world_size: int):
    """Where spawned ranks meet on a port (several nodes, or --master-port / MASTER_PORT given):
    node 0's `lumos train` binds the store on that port itself, before the MLflow run opens, and
    holds it until its ranks are done; every rank joins it as a client.

    The port is agreed on before any node starts (as with torchrun), so another process may hold
    it by then. Bound here, that fails at once with exit 1 naming the port and leaves no run
    behind; bound inside rank 0 it failed after the run opened, under torch's "Process 0
    terminated" wrapper. One machine without a port (its ranks meet in a file) and torchrun (its
    agent holds the store) need nothing here."""
    on_port = nodes.count > 1 or nodes.master_port or "MASTER_PORT" in os.environ
    if world_size == 1 or "WORLD_SIZE" in os.environ or not on_port:
        yield
        return
    address = nodes.master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = nodes.master_port or int(os.environ["MASTER_PORT"])
    store = None
    if nodes.rank == 0:
        try:
            store = dist.TCPStore(address, port, is_master=True, wait_for_workers=False)
        except dist.DistNetworkError as error:
            if "EADDRINUSE" not in str(error):
                raise
            raise LumosError(f"master port {port} is in use on node 0 by another process; start every node "
                             "again with another free --master-port") from None
    before = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT", LAUNCHER_STORE)}
    os.environ.update({"MASTER_ADDR": address, "MASTER_PORT": str(port), LAUNCHER_STORE: "1"})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        del store  # closes the port


RANK_GRACE_SECONDS = 10
"""How long the other ranks get to stop by themselves once one rank died, before SIGTERM (and as
long again before SIGKILL)."""


@contextlib.contextmanager
def _forward_signals(pids: list[int]):
    """While ranks run, SIGINT and SIGTERM sent to this parent reach them (a scheduler signals only the
    parent); each rank checkpoints and stops, and the parent waits for them instead of dying first."""

    def forward(signum, frame) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    try:
        previous = {number: signal.signal(number, forward) for number in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        previous = {}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _rank_main(
    local_rank: int, first_rank: int, local_ranks: int, world_size: int, plan: FitPlan, result_file: str
) -> None:
    rank = first_rank + local_rank
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size)})
    # A node's ranks share its cores; oversubscribed threads slow every rank down.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
    result = fit(plan, **(_rank0_hooks(plan, _print_line) if rank == 0 else {}))
    if local_rank == 0:  # this node's result: rank 0's on node 0
        Path(result_file).write_text(json.dumps(result.__dict__))
    # The work is done and recorded. Leave without interpreter finalisation: there, gloo's C++ threads
    # can still hold tensors whose release needs the GIL, and the rank dies of SIGABRT ("terminate
    # called without an active exception"; seen once in CI after a finished two-node run,
    # pytorch/pytorch#179291). A failure above still raises and reaches the parent as a traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stdout is reserved for --json


def _rank0_hooks(plan: FitPlan, report: Report) -> dict[str, Any]:
    """Callbacks rank 0 uses to log to MLflow; built inside the rank (clients do not pickle)."""
    if plan.run_id is None:
        return {"report": report}
    client = tracking_client(plan.workspace)

    def log_metrics(step: int, metrics: dict[str, float]) -> None:
        client.log_batch(plan.run_id, metrics=[_metric(key, value, step) for key, value in metrics.items()])

    uploaded: set[str] = set()

    def log_checkpoint(folder: Path, step: int) -> None:
        # A replaced checkpoint ("best") goes to a new path, never over the files the tag points at;
        # the tag moves once the upload is whole, so a reader always downloads one complete checkpoint.
        name = Path(folder).name
        artifact_path = f"checkpoints/{name}" if name.startswith("step-") else f"checkpoints/{name}-step-{step:08d}"
        if artifact_path not in uploaded:
            client.log_artifacts(plan.run_id, str(folder), artifact_path)
            uploaded.add(artifact_path)
        client.set_tag(plan.run_id, CHECKPOINT_TAG, artifact_path)
        client.set_tag(plan.run_id, STEP_TAG, str(step))

    return {"log_metrics": log_metrics, "log_checkpoint": log_checkpoint, "report": report}


def _metric(key: str, value: float, step: int):
    import time

    from mlflow.entities import Metric

    # MLflow metric names may not hold "@": valid/ndcg@10 is logged as valid/ndcg_at_10, as in leaderboards.
    return Metric(key=key.replace("@", "_at_"), value=float(value), timestamp=int(time.time() * 1000), step=step)
