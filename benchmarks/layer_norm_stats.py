"""A layer norm's row statistics: which variance to compute, and one kernel or two (Options.multi_output).

Accuracy: a layer norm's output over rows of 1000 + randn (a large mean: where a one-pass
variance cancels) and of randn, against torch's layer norm in float64, for four ways to get the
variance in float32, each emulated in numpy one element at a time:
  two-pass   mean = Σx / n, then Σ(x − mean)² / n (what the compiler does, in one kernel or two);
  welford    a running mean and M2, updated per element (one pass, a division per element);
  one-pass   Σx and Σx², E[x²] − E[x]²;
  shifted    Σ(x − K) and Σ(x − K)² with K the row's first element (one pass, shifted mean);
and the compiled layer norm itself, against torch float32 and float64.

Speed: the compiled layer norm at the benchmark models' shapes (rows of 64; quickstart 256 × 101
rows, SASRec-size 256 × 51), with the sibling statistics joined into one kernel and not: the time
of the statistics kernels (the driver's timed variant: from the start to the barrier before the
normalizing kernel) and of the whole call, in rounds taken alternately; medians per round, then
the median and range over rounds.

    python benchmarks/layer_norm_stats.py --rounds 7 --calls 30
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from lumos.compile.ir.graph import Graph
from lumos.compile.ir.hl_ops import Tensor, mark_output
from lumos.compile.program import Options, compile_graph, load_program
from lumos.compile.runtime.kernel_cache import KernelCache

WIDTH = 64
EPS = 1e-5


def _two_pass(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    total = np.zeros(x.shape[0], np.float32)
    for k in range(x.shape[1]):
        total += x[:, k]
    mean = total / np.float32(x.shape[1])
    squares = np.zeros_like(total)
    for k in range(x.shape[1]):
        squares += (x[:, k] - mean) ** 2
    return mean, squares / np.float32(x.shape[1])


def _welford(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, m2 = np.zeros(x.shape[0], np.float32), np.zeros(x.shape[0], np.float32)
    for k in range(x.shape[1]):
        delta = x[:, k] - mean
        mean += delta / np.float32(k + 1)
        m2 += delta * (x[:, k] - mean)
    return mean, m2 / np.float32(x.shape[1])


def _one_pass(x: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    total, squares = np.zeros(x.shape[0], np.float32), np.zeros(x.shape[0], np.float32)
    for k in range(x.shape[1]):
        y = x[:, k] - shift
        total += y
        squares += y * y
    n = np.float32(x.shape[1])
    mean = total / n
    return shift + mean, np.maximum(squares / n - mean * mean, np.float32(0))


VARIANCES = {
    "two-pass": _two_pass,
    "welford": _welford,
    "one-pass": lambda x: _one_pass(x, np.zeros(x.shape[0], np.float32)),
    "shifted": lambda x: _one_pass(x, x[:, 0].copy()),
}


def _layer_norm_graph(rows: int) -> Graph:
    graph = Graph()
    x = Tensor.input(graph, "x", (rows, WIDTH))
    weight, bias = Tensor.input(graph, "w", (WIDTH,)), Tensor.input(graph, "b", (WIDTH,))
    mark_output(graph, "y", x.layer_norm(weight, bias, EPS))
    graph.prune()
    return graph


def _inputs(rows: int, offset: float, seed: int = 0) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    return {"x": (generator.standard_normal((rows, WIDTH)) + offset).astype(np.float32),
            "w": generator.standard_normal(WIDTH).astype(np.float32),
            "b": generator.standard_normal(WIDTH).astype(np.float32)}


def accuracy(cache: KernelCache, rows: int = 4096) -> None:
    graph = _layer_norm_graph(rows)
    program = load_program(compile_graph(graph, cache, Options(multi_output=True)))
    print(f"max |layer norm − torch float64| over {rows} rows of {WIDTH} (torch float32 alongside)")
    for offset in (0.0, 1000.0):
        inputs = _inputs(rows, offset)
        exact = {name: torch.from_numpy(value).double() for name, value in inputs.items()}
        truth = F.layer_norm(exact["x"], (WIDTH,), exact["w"], exact["b"], EPS).numpy()
        single = {name: torch.from_numpy(value) for name, value in inputs.items()}
        torch32 = F.layer_norm(single["x"], (WIDTH,), single["w"], single["b"], EPS).numpy()
        x = inputs["x"]
        errors = {"torch float32": np.abs(torch32 - truth).max()}
        for name, variance in VARIANCES.items():
            mean, var = variance(x)
            y = (x - mean[:, None]) / np.sqrt(var[:, None] + np.float32(EPS)) * inputs["w"] + inputs["b"]
            errors[name] = np.abs(y - truth).max()
        got = program(inputs)["y"].reshape(rows, WIDTH)
        errors["compiled (joined)"] = np.abs(got - truth).max()
        errors["compiled vs torch float32"] = np.abs(got - torch32).max()
        print(f"  x = {offset:g} + randn: " + ", ".join(f"{name} {error:.2e}" for name, error in errors.items()))


def speed(cache: KernelCache, rounds: int, calls: int, threads: int) -> None:
    for model, rows in (("quickstart", 256 * 101), ("SASRec-size", 256 * 51)):
        graph = _layer_norm_graph(rows)
        inputs = _inputs(rows, 1000.0)
        programs = {}
        for joined in (False, True):
            compilation = compile_graph(graph, cache, Options(multi_output=joined))
            program = load_program(compilation)
            program.threads = threads
            programs[joined] = (program, len(compilation.kernels))
        results: dict[bool, dict[str, list[float]]] = {joined: {"stats": [], "call": []} for joined in programs}
        for _ in range(rounds):
            for joined, (program, kernels) in programs.items():
                for _ in range(3):  # warm-up
                    program.kernel_seconds(inputs, kernels)
                per_call = np.array([program.kernel_seconds(inputs, kernels) for _ in range(calls)])
                results[joined]["stats"].append(float(np.median(per_call[:, :-1].sum(1))) * 1e3)
                results[joined]["call"].append(float(np.median(per_call.sum(1))) * 1e3)
        print(f"{model} layer norm, {rows} rows of {WIDTH}, {threads} threads, {rounds} rounds × {calls} calls "
              "(median of rounds, [min – max]):")
        for joined, (_, kernels) in programs.items():
            label = "joined (1 statistics kernel)" if joined else "separate (2 statistics kernels)"
            stats, call = results[joined]["stats"], results[joined]["call"]
            print(f"  {label:32s} {kernels} kernels: statistics {np.median(stats):.3f} ms [{min(stats):.3f} – "
                  f"{max(stats):.3f}], whole call {np.median(call):.3f} ms [{min(call):.3f} – {max(call):.3f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lumos-layer-norm-") as folder:
        cache = KernelCache(folder, "cpu")
        accuracy(cache)
        speed(cache, args.rounds, args.calls, args.threads)


if __name__ == "__main__":
    main()
