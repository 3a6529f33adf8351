"""Half precision stored natively against the old widening path, on a small nn.TransformerEncoderLayer.

    python benchmarks/half.py [--dtype bfloat16] [--width 64] [--heads 4] [--seq 32] [--batch 8]
                              [--repeats 50] [--threads 1] [--search-budget 0]
                              [--out benchmarks/results/half.json]

One TransformerEncoderLayer (batch_first, feed-forward 4·width, no dropout) in --dtype, random
weights, compiled by `compile_module` on the C target three ways: `native` (frontend/half.py:
weights, input and output stored in the dtype, widened and rounded by the kernels), `widened` (the
old path: the float32 copy compiled, its input widened and its output narrowed by PyTorch at each
call, weights held in float32) and `float32` (the module itself in float32, for the time half
precision costs). Eager PyTorch in the dtype and in float32 are timed alongside.

Reports the weight bytes each compiled program holds (its bound constant tensors), the median ms
per call over --repeats calls taken round-robin (every engine sees the same background load), and
each one's largest difference from eager in the same dtype. Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from lumos.compile.frontend.export import compile_module
from lumos.compile.frontend.half import HalfPrecision, eager_output_dtypes, float32_copy, widened

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def encoder_layer(width: int, heads: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True).eval()


def weight_bytes(compiled) -> int:
    program = compiled.compiled.program if isinstance(compiled, HalfPrecision) else compiled.program
    return sum(array.nbytes for array in program.tensors)


def median_ms(engines: dict, x: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in engines}
    with torch.no_grad():
        for name, run in engines.items():  # warm-up
            run(x[name])
        for _ in range(repeats):
            for name, run in engines.items():
                began = time.perf_counter()
                run(x[name])
                times[name].append((time.perf_counter() - began) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--search-budget", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/half.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]

    wide_module = encoder_layer(args.width, args.heads)
    module = float32_copy(wide_module).to(dtype)
    x = torch.randn(args.batch, args.seq, args.width).to(dtype)
    budget = args.search_budget
    native = compile_module(module, [x], strict=True, search_budget=budget)
    widening = HalfPrecision(compile_module(float32_copy(module), [widened(x)], strict=True, search_budget=budget),
                             eager_output_dtypes(module, [x]))
    float32 = compile_module(wide_module, [x.float()], strict=True, search_budget=budget)

    engines = {"native": native, "widened": widening, "float32": float32, "eager": module, "eager_float32": wide_module}
    given = {name: x.float() if name in ("float32", "eager_float32") else x for name in engines}
    ms = median_ms(engines, given, args.repeats)
    with torch.no_grad():
        want = module(x).float()
        error = {name: float((engines[name](given[name]).float() - want).abs().max()) for name in ("native", "widened")}
    result = {
        "model": f"nn.TransformerEncoderLayer(width {args.width}, {args.heads} heads, feed-forward {4 * args.width})",
        "dtype": args.dtype, "batch": args.batch, "seq": args.seq, "threads": args.threads,
        "search_budget_s": budget, "repeats": args.repeats,
        "weights": sum(p.numel() for p in module.parameters()),
        "weight_bytes": {"native": weight_bytes(native), "widened": weight_bytes(widening), "float32": weight_bytes(float32)},
        "ms": ms, "max_error_vs_eager": error,
        "note": "a shared machine: the times are medians of round-robin calls, their ratios the finding",
    }
    print(f"{result['model']} in {args.dtype}, batch {args.batch} × {args.seq}, {args.threads} thread(s)")
    for name in engines:
        held = result["weight_bytes"].get(name)
        print(f"  {name:14s} {ms[name]:8.3f} ms" + (f"  weights {held:,} bytes" if held is not None else "")
              + (f"  max |Δ| vs eager {error[name]:.3g}" if name in error else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
