"""Checking a compiled model against eager PyTorch on the target's device, and timing both."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from lumos.compile.frontend.lumos_model import output_names
from lumos.compile.result import CompileResult
from lumos.core.errors import LumosError
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel


class VerificationError(LumosError):
    """The compiled model's outputs differ from PyTorch's; the plan is not saved."""


def verify(result: CompileResult, model: LumosModel, seeds: tuple[int, ...] = (1, 2)) -> float:
    """Largest output difference against eager PyTorch on random batches on the target's device,
    at the plan's shape and at a smaller one (shorter histories too, padded, where the compiled
    model pads them); raises VerificationError beyond the target's tolerance."""
    target, compiled = result.target, result.compiled
    B, T = compiled.batch_size, compiled.seq_len
    shapes = [(B, T), (max(1, min(B - 1, 3)), max(1, T - 3) if compiled.pads_histories else T)]
    worst = 0.0
    was_training = model.training
    model.to(target.device).eval()
    try:
        for seed in seeds:
            for rows, length in shapes:
                batch = synthetic_batch(model.features, rows, length, seed=seed).to(target.device)
                with torch.no_grad():
                    expected = model(batch)
                got = compiled(batch)
                for name in output_names(model):
                    want, have = getattr(expected, name).float(), getattr(got, name)
                    if want.shape != have.shape:
                        raise VerificationError(f"{name}: compiled shape {tuple(have.shape)}, torch {tuple(want.shape)}")
                    error = float((want - have).abs().max()) if want.numel() else 0.0
                    worst = max(worst, error)
                    if not torch.allclose(have, want, atol=target.atol, rtol=target.rtol):
                        raise VerificationError(
                            f"{name} differs from PyTorch by up to {error:.3g} (tolerance {target.atol} + "
                            f"{target.rtol}·|x|) at batch {rows}, sequence {length}; the plan was not saved")
    finally:
        model.train(was_training)
    result.max_error = worst
    return worst


def time_forward(result: CompileResult, model: LumosModel, repeats: int | None = None) -> tuple[float, float]:
    """Median milliseconds per forward at the plan's shape: (torch eager, compiled). On the CPU by
    the wall clock (5 repeats), on the GPU by CUDA events (20 repeats; the compiled side is one
    replay of its CUDA graph, inputs already there)."""
    batch = synthetic_batch(model.features, result.compiled.batch_size, result.compiled.seq_len, seed=3)
    was_training = model.training
    model.eval()
    try:
        if result.target.device == "cuda":
            eager, compiled = _time_on_gpu(result, model, batch.to("cuda"), repeats or 20)
        else:
            with torch.no_grad():
                eager = median_ms(lambda: model(batch), repeats or 5)
            compiled = median_ms(lambda: result.compiled(batch), repeats or 5)
    finally:
        model.train(was_training)
    result.eager_ms, result.compiled_ms = eager, compiled
    return eager, compiled


def _time_on_gpu(result: CompileResult, model: LumosModel, batch, repeats: int) -> tuple[float, float]:
    model.to("cuda")
    times = []
    with torch.no_grad():
        model(batch)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times)), result.compiled.program.time_ms(result.compiled.inputs(batch), repeats)


def median_ms(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)
