"""A cost model: a kernel's time predicted from the bytes it moves and the flops it does, at this
machine's measured rates, so that the search tries the likeliest candidates first.

    predicted ms = flops / (peak FLOP/s · efficiency of the schedule) + bytes / memory bandwidth

The rates are measured once per process (a float32 matrix product for the FLOP/s, a large copy for
the bandwidth). Bytes are the buffers a kernel reads and writes, the same for every schedule of
one kernel (they tell programs apart: a fused attention never writes its scores). The schedule
decides how much of the peak a matrix product reaches: a block of rows × columns summed in vector
registers reuses every load most, a row-wise loop with register tiles less, dot products least.
Those efficiencies are priors, not measurements; `spearman` says how well the ranking held
(`--explain` reports it), and only measured times ever choose.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np

from lumos.compile.ir.graph import LEAF, is_matmul, is_product_sum
from lumos.compile.schedule.buffers import FLOAT_BYTES
from lumos.compile.schedule.kernels import Kernel, KernelSchedule


@dataclass(frozen=True)
class Rates:
    flops: float
    """Floating-point operations per second of a float32 matrix product on every core."""
    bandwidth: float
    """Bytes per second of a copy far larger than the caches (read + write)."""


@functools.cache
def machine_rates() -> Rates:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 384, 384), dtype=np.float32)
    src = np.ones(8 << 20, np.float32)  # 32 MiB
    dst = np.empty_like(src)
    flops, bandwidth = 0.0, 0.0
    for _ in range(3):  # best of three: the machine is shared
        began = time.perf_counter()
        a @ b
        flops = max(flops, 2 * 384**3 / (time.perf_counter() - began))
        began = time.perf_counter()
        np.copyto(dst, src)
        bandwidth = max(bandwidth, 2 * src.nbytes / (time.perf_counter() - began))
    return Rates(flops, bandwidth)


def kernel_flops(kernel: Kernel) -> int:
    """2·M·N·K of the matrix products a kernel computes (0 for the rest), each product once:
    `fused` lists a node once per path to it (a fused attention's score product 5 times, which put
    its GFLOP/s at 2.5 times the truth)."""
    return sum(2 * node.views[0].shape[node.arg] * node.size for node in kernel.unique_fused if is_matmul(node))


def kernel_work(kernel: Kernel) -> tuple[float, float]:
    """(flops, bytes): matrix products plus one op per element of every other fused node; every
    buffer read once and the output written once."""
    matmul = kernel_flops(kernel)  # a fused attention's q·kᵀ too: computed inside, never stored
    fused = kernel.unique_fused
    products = {node.srcs[0] for node in fused if is_product_sum(node)}
    elementwise = sum(node.size for node in fused if node.op not in LEAF and node not in products
                      and not is_product_sum(node))
    moved = (sum(node.size for node in kernel.reads) + kernel.node.size) * FLOAT_BYTES
    return float(matmul + elementwise), float(moved)


def efficiency(kernel: Kernel, schedule: KernelSchedule) -> float:
    """The fraction of peak FLOP/s a schedule is expected to reach (a prior; see the module doc)."""
    if kernel.kind == "attention":
        # All keys in one block (tile 0, up to 128) and the renderer's default query block (8 at
        # a head of 16) were fastest on the quickstart model: a smaller key block pays a rescaling.
        value = 0.15 * (0.8 if schedule.tile else 1.0) * (1.0 + 0.1 * min(schedule.rows or 8, 8))
    elif kernel.kind == "reduce" and kernel_flops(kernel):
        if schedule.rows:
            value = 0.7 * min(1.0, schedule.rows * (schedule.tile or 16) / 64)
        elif schedule.interchange is True:
            value = 0.35 if schedule.tile else 0.2
        elif schedule.interchange is False:
            value = 0.08
        else:
            value = 0.25
        value *= 1.1 if schedule.unroll else 1.0
    else:
        value = 0.3 * (1.2 if schedule.simd else 1.0)
    value *= 1.4 if schedule.lanes == 16 else 1.0  # 16-float vectors: twice the FMAs per instruction
    value *= 0.99 if schedule.wide else 1.0  # no prior either way: timed right after its 8-float twin
    return value * (0.9 if schedule.collapse else 1.0)  # only the outer loop shared: fewer, larger chunks


def predict_ms(kernel: Kernel, schedule: KernelSchedule, rates: Rates | None = None) -> float:
    rates = rates or machine_rates()
    flops, moved = kernel_work(kernel)
    return 1000 * (flops / (rates.flops * efficiency(kernel, schedule)) + moved / rates.bandwidth)


def _ranks(values) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    values = np.asarray(values, float)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(predicted, measured) -> float | None:
    """Spearman's rank correlation (None under three pairs or when either side is constant)."""
    if len(predicted) < 3:
        return None
    a, b = _ranks(predicted), _ranks(measured)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def ranking_report(pairs_by_kernel: dict[str, list[tuple[float, float]]]) -> dict:
    """How well predicted ms ranked measured ms: within each kernel's candidates (what orders the
    search), averaged, and over every candidate of every kernel."""
    def correlation(pairs):
        return spearman([p for p, _ in pairs], [m for _, m in pairs])

    within = [r for pairs in pairs_by_kernel.values() if (r := correlation(pairs)) is not None]
    ranked = [pairs for pairs in pairs_by_kernel.values() if len(pairs) >= 2]
    # The predicted-best candidate within 5% of the measured best: the climb's first step was right.
    hits = sum(min(pairs)[1] <= 1.05 * min(m for _, m in pairs) for pairs in ranked)
    pooled = [pair for pairs in pairs_by_kernel.values() for pair in pairs]
    rates = machine_rates()
    return {"spearman_within": float(np.mean(within)) if within else None, "groups": len(within),
            "spearman_all": correlation(pooled), "measured": len(pooled),
            "top1": hits / len(ranked) if ranked else None, "ranked_kernels": len(ranked),
            "gflops": rates.flops / 1e9, "gbytes": rates.bandwidth / 1e9}
