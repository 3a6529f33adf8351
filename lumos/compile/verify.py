"""Checking a compiled model against eager PyTorch, and timing both."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from lumos.compile.frontend.lumos_model import output_names
from lumos.core.errors import LumosError
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.compile.engine import CompileResult

ATOL = RTOL = 1e-4


class VerificationError(LumosError):
    """The compiled model's outputs differ from PyTorch's; the plan is not saved."""


def verify(result: CompileResult, model: LumosModel, seeds: tuple[int, ...] = (1, 2)) -> float:
    """Largest output difference against eager PyTorch on random batches, at the plan's shape and
    at a smaller, padded one; raises VerificationError beyond tolerance."""
    B, T = result.compiled.batch_size, result.compiled.seq_len
    shapes = [(B, T), (max(1, min(B - 1, 3)), max(1, T - 3))]
    worst = 0.0
    was_training = model.training
    model.eval()
    try:
        for seed in seeds:
            for rows, length in shapes:
                batch = synthetic_batch(model.features, rows, length, seed=seed)
                with torch.no_grad():
                    expected = model(batch)
                got = result.compiled(batch)
                for name in output_names(model):
                    want, have = getattr(expected, name).numpy(), getattr(got, name).numpy()
                    if want.shape != have.shape:
                        raise VerificationError(f"{name}: compiled shape {have.shape}, torch {want.shape}")
                    error = float(np.max(np.abs(want - have))) if want.size else 0.0
                    worst = max(worst, error)
                    if not np.allclose(have, want, atol=ATOL, rtol=RTOL):
                        raise VerificationError(
                            f"{name} differs from PyTorch by up to {error:.3g} (tolerance {ATOL} + {RTOL}·|x|) at batch "
                            f"{rows}, sequence {length}; the plan was not saved")
    finally:
        model.train(was_training)
    result.max_error = worst
    return worst


def time_forward(result: CompileResult, model: LumosModel, repeats: int = 5) -> tuple[float, float]:
    """Median milliseconds per forward at the plan's shape: (torch eager, compiled)."""
    batch = synthetic_batch(model.features, result.compiled.batch_size, result.compiled.seq_len, seed=3)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            eager = median_ms(lambda: model(batch), repeats)
        compiled = median_ms(lambda: result.compiled(batch), repeats)
    finally:
        model.train(was_training)
    result.eager_ms, result.compiled_ms = eager, compiled
    return eager, compiled


def median_ms(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)
