"""How much memory a training step takes, and the largest batch that fits.

`estimate_memory` is the analytic table `lumos train --dry-run` prints. `find_batch_size` runs one
forward and backward at growing batch sizes on a worst-case batch (every history at max_len) and
keeps the largest that fits: on GPU until CUDA runs out of memory (or the budget), on CPU until
the step's memory passes the configured budget, taking the larger of the measured peak resident
growth and the analytic estimate (the measurement alone undercounts reused memory).
"""

from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lumos.data.contract import FIRST_TOKEN_ID, OOV_ID, TIME_FEATURES, Batch, FeatureSpec
from lumos.train.model import LumosModel

FLOAT_BYTES = 4


@dataclass(frozen=True)
class MemoryEstimate:
    batch_size: int
    seq_len: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    attention: int
    """Of which the (seq × seq) × heads score and probability matrices of self-attention."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state (AdamW)", self.optimizer),
            ("activations", self.activations),
            ("  of which attention (seq² × heads)", self.attention),
            ("total", self.total),
        ]


def estimate_memory(model: LumosModel, batch_size: int, seq_len: int | None = None) -> MemoryEstimate:
    """fp32 bytes of one training step of `model` at `batch_size` rows of `seq_len` tokens."""
    config, features = model.config, model.features
    T = seq_len if seq_len is not None else features.max_len
    S = T + 1  # the user token
    B, C, F, heads = batch_size, config.d_model, config.d_ff, config.n_heads
    Q = int(features.next_item) + len(features.horizons_days)
    params = model.num_parameters() * FLOAT_BYTES
    # Saved for backward per block: layer norms, q/k/v, attention output and projection, the MLP's
    # input, hidden pre- and post-GELU, and residuals: about 10·C + 2·F numbers per position.
    per_position = 10 * C + 2 * F
    # Attention keeps scores and probabilities (2 · heads · keys) per query for backward.
    encoder_attention = config.encoder_layers * 2 * B * heads * S * S
    decoder_attention = config.decoder_layers * 2 * B * heads * Q * (Q + S)
    embeddings = B * T * C * (len(features.token_categorical) + 2)
    activations = config.encoder_layers * B * S * per_position + config.decoder_layers * 2 * B * Q * per_position
    retrieval = 2 * B * features.item_vocab_size if features.next_item else 0  # logits and their gradient
    attention = (encoder_attention + decoder_attention) * FLOAT_BYTES
    return MemoryEstimate(
        batch_size=B,
        seq_len=T,
        parameters=params,
        gradients=params,
        optimizer=2 * params,
        activations=(activations + embeddings + retrieval) * FLOAT_BYTES + attention,
        attention=attention,
    )


def synthetic_batch(features: FeatureSpec, batch_size: int, seq_len: int, seed: int = 0,
                    full_histories: bool = False) -> Batch:
    """A batch of random but valid ids, values and targets, the same for a given seed.

    Histories are right-padded to random lengths 0..seq_len (the first row full), or all seq_len
    long with full_histories (the worst case the batch-size search measures). Vocabulary ids start
    at 1 (OOV) and time features at 0; padded positions hold 0. The compiler checks its kernels on
    these batches, and tests use them wherever a batch's values do not matter.
    """
    generator = torch.Generator().manual_seed(seed)
    B, T = batch_size, seq_len
    lengths = torch.full((B,), T) if full_histories else torch.randint(0, T + 1, (B,), generator=generator)
    if B:
        lengths[0] = T
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)

    def ids(size: int, low: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(low, max(size, low + 1), shape, generator=generator)

    H = len(features.horizons_days)
    return Batch(
        tokens={name: ids(size, 0 if name in TIME_FEATURES else OOV_ID, (B, T)) * mask
                for name, size in features.token_categorical.items()},
        numeric=torch.randn(B, T, len(features.token_numeric), generator=generator) * 3 * mask[:, :, None],
        mask=mask,
        static_categorical={name: ids(size, 0, (B,)) for name, size in features.static_categorical.items()},
        static_numeric=torch.randn(B, len(features.static_numeric), generator=generator) * 100,
        future=(torch.rand(B, features.future_slots, len(features.future_flags), generator=generator) < 0.3).float(),
        next_item=ids(features.item_vocab_size, FIRST_TOKEN_ID, (B,)) if features.next_item
        else torch.zeros(B, dtype=torch.long),
        act=torch.rand((B, H), generator=generator).round(),
        value=torch.rand((B, H), generator=generator) * 100,
    )


@dataclass
class BatchSizeSearch:
    batch_size: int
    """The largest per-process batch that fit (at least 1)."""
    tried: list[tuple[int, int, bool]] = field(default_factory=list)
    """(batch size, peak bytes measured, fitted) for each try, in order."""
    limit: str = ""
    """What bounded the search: the memory budget, CUDA memory, or max_batch_size."""


def find_batch_size(
    model: LumosModel,
    device: torch.device,
    max_batch_size: int,
    memory_budget_bytes: int,
) -> BatchSizeSearch:
    """Double the batch from 1 while one forward + backward fits; return the largest that did."""
    seq_len = model.features.max_len
    model = model.to(device).train()
    search = BatchSizeSearch(batch_size=1)
    size = 1
    while size <= max_batch_size:
        peak, fitted = _try_step(model, device, size, seq_len, memory_budget_bytes)
        search.tried.append((size, peak, fitted))
        if not fitted:
            search.limit = "CUDA memory" if device.type == "cuda" else f"memory budget {memory_budget_bytes / 2**20:.0f} MiB"
            break
        search.batch_size = size
        size *= 2
    else:
        search.limit = f"max_batch_size {max_batch_size}"
    model.zero_grad(set_to_none=True)
    return search


def _try_step(model: LumosModel, device: torch.device, size: int, seq_len: int, budget: int) -> tuple[int, bool]:
    batch = synthetic_batch(model.features, size, seq_len, full_histories=True).to(device)
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            model.loss(batch)[0].backward()
        except torch.OutOfMemoryError:
            return 0, False
        finally:
            model.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated(device)
        return peak, peak <= budget or budget <= 0
    # CPU: no out-of-memory signal short of the kernel's OOM killer, so compare the step's memory
    # with the budget. The measured peak resident growth undercounts when the allocator reuses
    # memory freed by an earlier try, so the analytic estimate of the same step is a floor.
    _release_free_memory()
    baseline = _resident_bytes()
    counting = _reset_peak_resident()
    model.loss(batch)[0].backward()
    measured = max(_peak_resident_bytes() - baseline, 0) if counting else 0
    model.zero_grad(set_to_none=True)
    estimate = estimate_memory(model, size, seq_len)
    peak = max(measured, estimate.activations + estimate.gradients)
    return peak, peak <= budget


def _release_free_memory() -> None:
    """Hand memory freed by earlier tries back to the OS (glibc), so the next peak is its own."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_bytes(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _resident_bytes() -> int:
    return _status_bytes("VmRSS")


def _peak_resident_bytes() -> int:
    return _status_bytes("VmHWM")


def _reset_peak_resident() -> bool:
    """Reset Linux's peak-RSS counter (VmHWM) for this process; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
