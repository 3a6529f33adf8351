"""The training loop, one code path for 1 and N ranks (DDP: gloo on CPU, nccl on GPU).

Each rank runs `fit`. The parent process (lumos.train.run) has already pinned the data version,
chosen the batch size and opened the MLflow run; rank 0 logs metrics and writes checkpoints, the
others only compute. Ctrl-C (SIGINT) and SIGTERM (what schedulers and `kill` send) are turned into a
flag that every rank agrees on at the next step boundary, so the checkpoint written on the way out
is a consistent one.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.nn.parallel import DistributedDataParallel

from lumos.core.faults import fault_point
from lumos.core.tables import TableRef
from lumos.core.workspace import Workspace
from lumos.data.contract import Batch
from lumos.data.loader import SequenceLoader
from lumos.data.sequences_version import open_sequences
from lumos.train import retrieval_metrics as retrieval
from lumos.train.checkpoint import (
    TrainingState,
    capture_rng,
    load_model,
    load_training_state,
    restore_rng,
    save_checkpoint,
)
from lumos.train.config import TrainConfig
from lumos.train.init_from import freeze, load_matching
from lumos.train.model import LumosModel


@dataclass(frozen=True)
class FitPlan:
    """Everything a rank needs, decided once by the parent and identical on every rank."""

    config: TrainConfig
    workspace: Workspace
    data: str
    """The pinned sequences version, dataset.sequences@V."""
    micro_batch: int
    """Rows per rank per forward/backward: batch_size / (world size × grad_accum)."""
    run_id: str | None
    """The MLflow run rank 0 logs to (None: no tracking, as in benchmarks)."""
    checkpoint_dir: str
    """Local folder for checkpoints of this run."""
    resume_from: str | None = None
    """A checkpoint folder to continue from."""
    init_weights: str | None = None
    """A parent's weights file (safetensors) to start from: its tensors that match by name are
    loaded into the freshly initialised model (lumos.train.init_from; checked by the parent process)."""


@dataclass
class FitResult:
    step: int
    interrupted: bool
    train_losses: dict[str, float] = field(default_factory=dict)
    valid_losses: dict[str, float] = field(default_factory=dict)
    samples_per_second: float = 0.0
    data_wait_fraction: float = 0.0
    checkpoint: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    """Per logged step: step, loss and learning rate (used by tests and benchmarks)."""
    valid_metrics: dict[str, float] = field(default_factory=dict)
    """The last evaluation's run.valid_metric, as {"ndcg@10": …}; empty without one."""
    best_step: int | None = None
    """With run.valid_metric: the step of the best evaluation, whose checkpoint is `checkpoint`."""
    best_value: float | None = None
    """With run.valid_metric: its value at best_step."""
    early_stopped: bool = False
    """True when run.patience evaluations in a row brought no new best."""
    failure: str | None = None
    """Why training stopped early on an error (a non-finite loss or gradient); None when it did not."""


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


RENDEZVOUS_FILE = "LUMOS_RENDEZVOUS_FILE"
"""The environment variable naming the file in which one machine's spawned ranks meet; unset,
they meet at MASTER_ADDR:MASTER_PORT (several nodes, torchrun)."""

LAUNCHER_STORE = "LUMOS_LAUNCHER_STORE"
"""Set when node 0's `lumos train` process holds the rendezvous store at MASTER_ADDR:MASTER_PORT
itself (lumos.train.run.rendezvous_store): every rank, rank 0 too, joins it as a client."""


def setup_ranks(device_preference: str) -> Ranks:
    """Join the process group when launched with several ranks (our launcher or torchrun)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_preference == "cuda" or (device_preference == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        rendezvous = os.environ.get(RENDEZVOUS_FILE)
        if rendezvous:
            dist.init_process_group(backend, rank=rank, world_size=world_size, init_method=f"file://{rendezvous}")
        elif os.environ.get(LAUNCHER_STORE):
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=default_pg_timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        else:  # torchrun: rank 0 (or torchrun's agent) serves MASTER_ADDR:MASTER_PORT
            dist.init_process_group(backend, rank=rank, world_size=world_size)
    return Ranks(rank, world_size, device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to min_ratio at `total` steps."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: LumosModel, config: TrainConfig) -> torch.optim.Optimizer:
    # Weight decay on matrices only: decaying biases, norms and embeddings hurts and helps nothing.
    # Frozen parameters (config.freeze) stay out: AdamW's decay would move them otherwise.
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        is_matrix = parameter.dim() >= 2 and "embedding" not in name and "table" not in name
        (decay if is_matrix else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.optim.lr, betas=tuple(config.optim.betas))


class _LossModule(torch.nn.Module):
    """DDP synchronizes gradients of what runs through its forward, so the loss is the forward."""

    def __init__(self, model: LumosModel):
        super().__init__()
        self.model = model

    def forward(self, batch: Batch):
        return self.model.loss(batch)


class _InterruptFlag:
    """SIGINT and SIGTERM set a flag instead of raising mid-step; the loop checkpoints and stops."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.raised = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _InterruptFlag:
        try:
            self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        except ValueError:  # not the main thread: leave signals alone
            self._previous = {}
        return self

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)


def fit(plan: FitPlan, log_metrics=None, log_checkpoint=None, report=None) -> FitResult:
    """Train one rank. `log_metrics(step, metrics)`, `log_checkpoint(folder, step)` and `report(line)`
    are called on rank 0 only (tracking and progress live outside the loop)."""
    config = plan.config
    ranks = setup_ranks(config.run.device)
    seed_everything(config.run.seed)
    sequences = open_sequences(plan.workspace, TableRef.parse(plan.data))
    if plan.resume_from:
        model, _ = load_model(Path(plan.resume_from), map_location=ranks.device)
    else:
        model = LumosModel(config.model, sequences.spec)
        if plan.init_weights:
            # Every rank loads the same file before DDP wraps the model: no broadcast needed.
            load_matching(model, plan.init_weights)
    freeze(model, config.freeze)  # before the optimizer is built, so frozen parameters stay out of it
    model = model.to(ranks.device)
    optimizer = build_optimizer(model, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.optim.warmup_steps, config.run.max_steps, config.optim.min_lr_ratio)
    )
    loader = SequenceLoader(
        sequences.snapshot, sequences.spec, plan.micro_batch, split=config.data.train_split, seed=config.run.seed,
        drop_last=True, rank=ranks.rank, world_size=ranks.world_size, num_workers=config.data.loader_workers,
        by_length=config.data.bucket_by_length,
    )
    start_step = 0
    best = _Best(config.run.valid_metric, config.run.patience)
    if plan.resume_from:
        state = load_training_state(Path(plan.resume_from))
        optimizer.load_state_dict(state.optimizer)
        schedule.load_state_dict(state.scheduler)
        loader.load_state_dict({**state.loader, "plan": loader.state_dict()["plan"]})
        restore_rng(state.rng[ranks.rank])  # each rank continues its own dropout and sampling stream
        start_step = state.step
        if state.best:
            best.restore(state.best)  # the best so far and the patience already used survive a resume
    else:
        # Ranks differ in dropout and sampled negatives, like independent replicas; init is
        # identical (seeded above) and DDP broadcasts rank 0's weights regardless.
        torch.manual_seed(config.run.seed + ranks.rank)
    trainer = DistributedDataParallel(_LossModule(model)) if ranks.world_size > 1 else _LossModule(model)
    valid = _valid_loader(plan, sequences, ranks)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if config.run.precision == "bf16" and ranks.device.type == "cuda"
        else nullcontext()
    )

    result = FitResult(step=start_step, interrupted=False)
    batches = iter(loader)
    window = _Window()
    with _InterruptFlag() as interrupt:
        for step in range(start_step, config.run.max_steps):
            model.train()
            step_started = time.perf_counter()
            losses: dict[str, float] = {}
            for micro in range(config.run.grad_accum):
                waited = time.perf_counter()
                batch, batches = _next_batch(batches, loader)
                batch = batch.to(ranks.device, non_blocking=True)
                window.wait += time.perf_counter() - waited
                sync = micro == config.run.grad_accum - 1 or ranks.world_size == 1
                with (nullcontext() if sync else trainer.no_sync()), autocast:
                    total, parts = trainer(batch)
                (total / config.run.grad_accum).backward()
                for task, value in parts.items():
                    losses[task] = losses.get(task, 0.0) + float(value) / config.run.grad_accum
                window.samples += batch.size * ranks.world_size
            # The norm is needed either way (an infinite bar clips nothing): a NaN or inf gradient
            # stops the run before the optimizer step, so no checkpoint ever holds poisoned weights.
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip or math.inf)
            loss = sum(losses.values())
            if _agree(not (math.isfinite(loss) and bool(torch.isfinite(grad_norm))), ranks):
                result.failure = (f"step {step + 1}: the loss ({loss}) or gradient norm ({float(grad_norm)}) is not finite "
                                  f"on at least one rank")
                break
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            window.seconds += time.perf_counter() - step_started
            window.steps += 1
            done = step + 1
            fault_point(f"train.step.{done}")
            fault_point(f"train.step.{done}.rank{ranks.rank}")
            result.step = done
            result.train_losses = _mean_over_ranks(losses, ranks)

            if done % config.run.log_every == 0 or done == config.run.max_steps:
                metrics = {f"train/{task}": value for task, value in result.train_losses.items()}
                metrics["train/loss"] = sum(result.train_losses.values())  # the total, as valid/loss
                metrics.update(window.metrics(ranks, optimizer))
                result.history.append({"step": done, "loss": sum(result.train_losses.values()), "lr": optimizer.param_groups[0]["lr"]})
                result.samples_per_second, result.data_wait_fraction = metrics["samples_per_second"], metrics["data_wait_fraction"]
                if ranks.is_main and log_metrics:
                    log_metrics(done, metrics)
                if ranks.is_main and report:
                    eta = (config.run.max_steps - done) * window.seconds / max(window.steps, 1)
                    report(_progress_line(done, config.run.max_steps, result.train_losses, metrics, eta))
                window = _Window()
            if valid is not None and (done % config.run.eval_every == 0 or done == config.run.max_steps):
                result.valid_losses, result.valid_metrics = _evaluate(model, valid, config, ranks)
                if ranks.is_main and log_metrics:
                    log_metrics(done, {f"valid/{task}": value for task, value in result.valid_losses.items()}
                                | {"valid/loss": sum(result.valid_losses.values())}
                                | {f"valid/{name}": value for name, value in result.valid_metrics.items()})
                if best.update(done, result.valid_metrics):
                    best.checkpoint = str(Path(plan.checkpoint_dir) / "best")
                    _checkpoint(plan, model, optimizer, schedule, loader, done, ranks, log_checkpoint, best, name="best")
                    if ranks.is_main and report:
                        report(f"step {done}: new best valid {best.metric} = {best.value:.4f}")
                result.early_stopped = best.exhausted
            stop = _agree(interrupt.raised, ranks)
            last = done == config.run.max_steps or result.early_stopped
            if done % config.run.checkpoint_every == 0 or last or stop:
                result.checkpoint = _checkpoint(plan, model, optimizer, schedule, loader, done, ranks, log_checkpoint, best)
            if stop:
                result.interrupted = True
                break
            if result.early_stopped:
                if ranks.is_main and report:
                    report(f"step {done}: stopping early, no better valid {best.metric} in {best.patience} evaluations")
                break
    if best.step is not None and not result.interrupted and result.failure is None:
        # The run ends on its best evaluation: eval, promote and infer read the run's checkpoint.
        result.best_step, result.best_value = best.step, best.value
        result.checkpoint = best.checkpoint
        if ranks.is_main and log_checkpoint:
            log_checkpoint(Path(best.checkpoint), best.step)
        if ranks.is_main and log_metrics:
            log_metrics(result.step, {f"valid/best_{best.metric}": best.value, "valid/best_step": best.step})
    if ranks.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return result


@dataclass
class _Best:
    """Tracks the best evaluation of run.valid_metric (larger is better) for early stopping."""

    metric: str | None
    patience: int
    value: float | None = None
    step: int | None = None
    checkpoint: str | None = None
    since_best: int = 0

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Record an evaluation; True when it is a new best (the first one always is)."""
        if self.metric is None:
            return False
        value = metrics[self.metric]
        # NaN (no scored rows) is never a best once there is a number to compare with.
        improved = not math.isnan(value) and (self.value is None or math.isnan(self.value) or value > self.value)
        if self.value is None or improved:
            self.value, self.step, self.since_best = value, step, 0
            return True
        self.since_best += 1
        return False

    def state(self) -> dict:
        """What a checkpoint keeps of the tracker (plain values, loadable with weights_only)."""
        return {"value": self.value, "step": self.step, "checkpoint": self.checkpoint, "since_best": self.since_best}

    def restore(self, state: dict) -> None:
        self.value, self.step, self.checkpoint, self.since_best = (
            state["value"], state["step"], state["checkpoint"], state["since_best"])

    @property
    def exhausted(self) -> bool:
        return bool(self.patience) and self.since_best >= self.patience


@dataclass
class _Window:
    """Counters since the last log line."""

    samples: int = 0
    steps: int = 0
    seconds: float = 0.0
    wait: float = 0.0

    def metrics(self, ranks: Ranks, optimizer) -> dict[str, float]:
        metrics = {
            "lr": optimizer.param_groups[0]["lr"],
            "samples_per_second": self.samples / self.seconds if self.seconds else 0.0,
            "data_wait_fraction": self.wait / self.seconds if self.seconds else 0.0,
        }
        if ranks.device.type == "cuda":
            metrics["peak_memory_mb"] = torch.cuda.max_memory_allocated(ranks.device) / 2**20
        else:
            metrics["peak_memory_mb"] = _peak_rss_mb()
        return metrics


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _next_batch(batches, loader: SequenceLoader):
    """The next batch, starting the next epoch when this one is exhausted."""
    try:
        return next(batches), batches
    except StopIteration:
        batches = iter(loader)  # the loader advanced its epoch when the last one completed
        return next(batches), batches


def _valid_loader(plan: FitPlan, sequences, ranks: Ranks) -> SequenceLoader | None:
    split = plan.config.data.valid_split
    if split is None:
        return None
    return SequenceLoader(
        sequences.snapshot, sequences.spec, plan.micro_batch, split=split, shuffle=False,
        rank=ranks.rank, world_size=ranks.world_size, num_workers=plan.config.data.loader_workers,
    )


@torch.no_grad()
def _evaluate(
    model: LumosModel, loader: SequenceLoader, config: TrainConfig, ranks: Ranks
) -> tuple[dict[str, float], dict[str, float]]:
    """Mean per-task validation loss over the first `eval_batches` batches (all with 0), all ranks,
    and run.valid_metric over the same rows ({} without one)."""
    model.eval()
    rng = capture_rng()  # sampled negatives draw from the global RNG; keep training's stream intact
    sums: dict[str, float] = {}
    count = 0
    target_ranks = []
    for index, batch in enumerate(loader):
        if config.run.eval_batches and index >= config.run.eval_batches:
            break
        batch = batch.to(ranks.device)
        output = model(batch)
        _, parts = model.loss(batch, output)
        for task, value in parts.items():
            sums[task] = sums.get(task, 0.0) + float(value)
        count += 1
        if config.run.valid_metric is not None:
            history = model.history_items(batch)
            target_ranks.append(retrieval.target_ranks(model.score_items(batch, output), batch.next_item, history).cpu())
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batches_yielded": 0})
    restore_rng(rng)
    losses = _mean_over_ranks({task: total / max(count, 1) for task, total in sums.items()}, ranks)
    if config.run.valid_metric is None:
        return losses, {}
    return losses, {config.run.valid_metric: _retrieval_metric(config.run.valid_metric, target_ranks, ranks)}


def _retrieval_metric(name: str, target_ranks: list[torch.Tensor], ranks: Ranks) -> float:
    """One retrieval metric over every rank's scored rows (a row-weighted mean, not a mean of means)."""
    values = retrieval.retrieval_metrics(torch.cat(target_ranks) if target_ranks else torch.empty(0),
                                         ks=_metric_ks(name))
    scored = values["scored_rows"]
    totals = torch.tensor([values[name] * scored if scored else 0.0, float(scored)], dtype=torch.float64, device=ranks.device)
    if ranks.world_size > 1:
        dist.all_reduce(totals)
    return float(totals[0] / totals[1]) if totals[1] else math.nan


def _metric_ks(name: str) -> tuple[int, ...]:
    return (int(name.split("@")[1]),) if "@" in name else ()


def _mean_over_ranks(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    if ranks.world_size == 1 or not values:
        return values
    names = sorted(values)
    tensor = torch.tensor([values[name] for name in names], dtype=torch.float64, device=ranks.device)
    dist.all_reduce(tensor)
    return {name: float(value) / ranks.world_size for name, value in zip(names, tensor.tolist(), strict=True)}


def _agree(flag: bool, ranks: Ranks) -> bool:
    """True on every rank when any rank was interrupted."""
    if ranks.world_size == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=ranks.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


def _checkpoint(
    plan: FitPlan, model, optimizer, schedule, loader, step: int, ranks: Ranks, log_checkpoint, best: _Best,
    name: str | None = None,
) -> str | None:
    """Write (rank 0) and log a resumable checkpoint, in folder step-<step> or `name` (replaced)."""
    folder = None
    rng = [capture_rng()]
    if ranks.world_size > 1:
        rng = [None] * ranks.world_size
        dist.all_gather_object(rng, capture_rng())
    if ranks.is_main:
        state = TrainingState(step=step, optimizer=optimizer.state_dict(), scheduler=schedule.state_dict(),
                              loader=loader.state_dict(), rng=rng, best=best.state())
        folder = save_checkpoint(Path(plan.checkpoint_dir) / (name or f"step-{step:08d}"), model, plan.config, state)
        if log_checkpoint:
            log_checkpoint(folder, step)
    if ranks.world_size > 1:
        dist.barrier()  # no rank runs ahead of a checkpoint it might need on resume
    return str(folder) if folder else None


def _progress_line(step: int, total: int, losses: dict[str, float], metrics: dict[str, float], eta: float) -> str:
    parts = " ".join(f"{task}={value:.4f}" for task, value in losses.items())
    minutes, seconds = divmod(int(eta), 60)
    return (f"step {step}/{total} {parts} lr={metrics['lr']:.2e} {metrics['samples_per_second']:.0f} samples/s "
            f"data-wait {metrics['data_wait_fraction']:.0%} eta {minutes}:{seconds:02d}")
