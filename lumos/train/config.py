"""The training recipe (`train.toml`): data, model, optimizer and run settings, all frozen dataclasses."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from lumos.core.config import require_valid
from lumos.train.model import ModelConfig

RETRIEVAL_METRIC = re.compile(r"(hr|ndcg)@[1-9][0-9]*|mrr")


@dataclass(frozen=True)
class DataConfig:
    table: str = "quickstart.sequences"
    """The sequences table, dataset.sequences[@version]; without a version the latest is used and
    the exact version is recorded. `--data` overrides it."""
    train_split: str = "train"
    """Rows of this split train the model."""
    valid_split: str | None = "valid"
    """Rows of this split give the validation loss; unset to skip validation."""
    loader_workers: int | None = None
    """Threads that build batches; unset means a share of the CPUs."""
    bucket_by_length: bool = False
    """Training batches of similar history length (the loader's by_length: sorted within each
    chunk, the batches shuffled). Far less padding on skewed histories, but each step then sees
    users of one length band; off by default, since it changes what the model learns from."""

    def __post_init__(self) -> None:
        require_valid([("loader_workers", "must be 0 or more")] if self.loader_workers is not None and self.loader_workers < 0 else [])


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases, norms and embeddings)."""
    betas: tuple[float, ...] = (0.9, 0.98)
    """AdamW betas."""
    warmup_steps: int = 50
    """Linear warm-up from 0 to lr over this many optimizer steps."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at lr * min_lr_ratio at the last step."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""

    def __post_init__(self) -> None:
        problems = []
        # NaN passes every comparison's "else": check finiteness first, or nan slips through.
        if not math.isfinite(self.lr) or self.lr <= 0:
            problems.append(("lr", f"must be a finite positive number, got {self.lr}"))
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            problems.append(("weight_decay", f"must be a finite number, 0 or more, got {self.weight_decay}"))
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):  # False for NaN
            problems.append(("betas", "must be two numbers in [0, 1)"))
        if self.warmup_steps < 0:
            problems.append(("warmup_steps", "must be 0 or more"))
        if not 0 <= self.min_lr_ratio <= 1:  # False for NaN
            problems.append(("min_lr_ratio", "must be between 0 and 1"))
        if not math.isfinite(self.grad_clip) or self.grad_clip < 0:
            problems.append(("grad_clip", f"must be 0 (off) or a finite positive number, got {self.grad_clip}"))
        require_valid(problems)


@dataclass(frozen=True)
class RunConfig:
    batch_size: int | Literal["auto"] = 128
    """Global batch size (summed over ranks and accumulation steps), or "auto": the largest that fits
    (GPU memory, or memory_budget_mb on CPU), found by trying growing sizes before training."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    max_steps: int = 300
    """Optimizer steps to train."""
    eval_every: int = 50
    """Compute the validation loss every this many steps (and at the end)."""
    eval_batches: int = 20
    """Validation batches per evaluation (0 means the whole split)."""
    log_every: int = 10
    """Log metrics every this many steps."""
    checkpoint_every: int = 100
    """Write a resumable checkpoint every this many steps (and at the end)."""
    seed: int = 0
    """Seeds model init, sampling, dropout and the loader's shuffle."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when available, else CPU."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """bf16 autocast (GPU only; CPU runs in fp32)."""
    memory_budget_mb: int = 2048
    """CPU only: the memory one training step may use when batch_size = "auto"."""
    max_batch_size: int = 4096
    """The largest batch size the "auto" search tries."""
    valid_metric: str | None = None
    """A retrieval metric (hr@<k>, ndcg@<k> or mrr) computed on the valid split at every evaluation:
    next item ranked over the full item vocabulary, history items excluded. When set, the checkpoint
    of the best evaluation is kept as "best" and is the run's checkpoint when training ends."""
    patience: int = 0
    """With valid_metric: stop after this many evaluations in a row without a new best (early
    stopping); 0 trains all max_steps."""
    experiment: str = "lumos-train"
    """MLflow experiment of the run."""
    run_name: str | None = None
    """MLflow run name; unset lets MLflow choose."""

    def __post_init__(self) -> None:
        problems = []
        if self.batch_size != "auto" and self.batch_size < 1:
            problems.append(("batch_size", 'must be positive or "auto"'))
        for name in ("grad_accum", "max_steps", "eval_every", "log_every", "checkpoint_every", "memory_budget_mb", "max_batch_size"):
            if getattr(self, name) < 1:
                problems.append((name, "must be at least 1"))
        if self.eval_batches < 0:
            problems.append(("eval_batches", "must be 0 (all) or more"))
        if self.valid_metric is not None and not RETRIEVAL_METRIC.fullmatch(self.valid_metric):
            problems.append(("valid_metric", f"must be hr@<k>, ndcg@<k> or mrr, got {self.valid_metric!r}"))
        if self.patience < 0:
            problems.append(("patience", "must be 0 (off) or more"))
        if self.patience and self.valid_metric is None:
            problems.append(("patience", "early stopping needs run.valid_metric, e.g. \"ndcg@10\""))
        require_valid(problems)


@dataclass(frozen=True)
class TrainConfig:
    """A whole training recipe; the resolved config is logged with the run and saved beside every checkpoint."""

    data: DataConfig = field(default_factory=DataConfig)
    """Which table and splits to train on."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW with warm-up and cosine decay."""
    run: RunConfig = field(default_factory=RunConfig)
    """Batching, length, cadence, seed, device and tracking."""
    init_from: str | None = None
    """Start from a trained model's weights (`--init-from`): a training run id, NAME@alias or
    NAME/VERSION. Tensors that match by name and shape are loaded, new ones (a head the parent did
    not train) are initialised as usual, a shape mismatch is an error; the data's vocabularies must
    number tokens as the parent's did. The logged config names the resolved run id."""
    freeze: tuple[str, ...] = ()
    """Parameter-name prefixes kept fixed (requires_grad off, out of the optimizer), matched at a
    dot: "encoder" is every encoder block, "token_embeddings.item" the item table. Usually with
    init_from, to train a new head on a pretrained encoder."""

    def __post_init__(self) -> None:
        problems = []
        if self.run.valid_metric is not None and self.data.valid_split is None:
            problems.append(("run.valid_metric", "needs data.valid_split"))
        if self.run.valid_metric is not None and "retrieval" not in self.model.heads:
            problems.append(("run.valid_metric", "needs the retrieval head in model.heads"))
        if self.init_from is not None and not self.init_from.strip():
            problems.append(("init_from", "must name a training run id, NAME@alias or NAME/VERSION"))
        if any(not prefix.strip(". ") for prefix in self.freeze):
            problems.append(("freeze", "holds an empty prefix; name parameter prefixes such as \"encoder\""))
        require_valid(problems)
