"""Forward time of the Lumos model at batch 256: torch eager, torch.compile (inductor), Lumos compiled.

    python benchmarks/compile.py [--batch 256] [--repeats 10] [--skip-inductor] [--out benchmarks/results/compile.json]

Two models: the quickstart model (lumos/quickstart/train.toml's [model], feature sizes as the
quickstart data gives them) and a SASRec-sized one (width 64, 2 heads, 2 layers, sequence 50,
about 1,700 items). Random weights and inputs; inference mode; medians over --repeats calls after a
warm-up, taken round-robin so that every engine sees the same background load. Also reports the Lumos compile time with a cold and a warm kernel cache, its planned
peak memory against one buffer per node, and its largest difference from eager.

GFLOP/s counts the matrix products (2·M·N·K each, from the primitive graph), which dominate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lumos.compile.cache import KernelCache
from lumos.compile.engine import compile_model, median_ms, verify
from lumos.compile.frontend import _Forward, batch_tensors, example_batch, input_names
from lumos.compile.ir import Graph, Op
from lumos.core.config import load_config
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.features import FeatureSpec
from lumos.train.model import LumosModel, ModelConfig

ROOT = Path(__file__).resolve().parent.parent

QUICKSTART_FEATURES = FeatureSpec(
    token_categorical={"item": 502, "event_type": 6, "cat_device": 5, "cat_category": 10, "hour": 24, "weekday": 7,
                       "gap_bucket": 16},
    token_numeric=("value", "age_days"),
    static_categorical={"user_country": 8, "user_age_bucket": 7},
    static_numeric=("user_tenure_days",),
    future_flags=("holiday", "sale"),
    horizons_days=(7,),
    max_len=100,
)
SASREC_FEATURES = FeatureSpec(token_categorical={"item": 1702}, token_numeric=(), max_len=50)
SASREC_CONFIG = ModelConfig(d_model=64, n_heads=2, encoder_layers=2, decoder_layers=1, d_ff=64, dropout=0.0,
                            max_len=50, heads=("retrieval",))


def matmul_flops(graph: Graph) -> int:
    """2·M·N·K over every sum of a product (the matrix products of the graph)."""
    return sum(2 * node.views[0].shape[node.arg] * node.size for node in graph.nodes
               if node.op is Op.SUM and node.srcs[0].op is Op.MUL and node.views[0].shape[node.arg] > 1)


def bench_model(name: str, model: LumosModel, batch_size: int, repeats: int, inductor: bool) -> dict:
    model.eval()
    seq_len = model.features.max_len
    batch = example_batch(model.features, batch_size, seq_len, seed=3)
    result = {"model": name, "batch": batch_size, "seq": seq_len, "parameters": model.num_parameters()}
    print(f"== {name}: batch {batch_size}, sequence {seq_len}, {model.num_parameters():,} parameters", flush=True)

    engines = {"eager": lambda: model(batch)}
    if inductor:
        wrapper = _Forward(model)
        named = batch_tensors(batch, model.features)
        args = [named[key] for key in input_names(model.features)]
        compiled = torch.compile(wrapper)
        started = time.perf_counter()
        with torch.no_grad():
            compiled(*args)
        result["inductor_compile_s"] = time.perf_counter() - started
        engines["inductor"] = lambda: compiled(*args)

    with tempfile.TemporaryDirectory(prefix="lumos-bench-kernels-") as folder:
        cache = KernelCache(folder, "cpu")
        cold = compile_model(model, batch_size, seq_len, cache)
        warm = compile_model(model, batch_size, seq_len, cache)
        assert warm.compilation.build.hit
        result["max_error"] = verify(cold, model, seeds=(1,))
        engines["lumos"] = lambda: cold.compiled(batch)
        # Round-robin: on a shared machine every engine sees the same background load.
        with torch.no_grad():
            times = {engine: [] for engine in engines}
            for call in engines.values():  # warm-up
                call()
                call()
            for _ in range(repeats):
                for engine, call in engines.items():
                    times[engine].append(median_ms(call, 1, warmup=0))
        for engine, values in times.items():
            result[f"{engine}_ms"] = statistics.median(values)
            result[f"{engine}_best_ms"] = min(values)  # least disturbed by other load
        stats = cold.compilation.stats()
    print(f"  torch eager      {result['eager_ms']:8.2f} ms", flush=True)
    if inductor:
        print(f"  torch.compile    {result['inductor_ms']:8.2f} ms  (compiled in {result['inductor_compile_s']:.0f} s)")
    result.update({
        "lumos_compile_cold_s": cold.seconds["total"], "lumos_compile_warm_s": warm.seconds["total"],
        "lumos_build_cold_s": cold.seconds["build"], "lumos_build_warm_s": warm.seconds["build"],
        "lumos_trace_s": cold.seconds["trace"], **stats,
    })
    flops = matmul_flops(cold.compilation.graph)
    result["matmul_gflop"] = flops / 1e9
    for engine in ("eager", "inductor", "lumos"):
        if f"{engine}_ms" in result:
            result[f"{engine}_gflops"] = flops / (result[f"{engine}_ms"] / 1000) / 1e9
    result["lumos_vs_eager"] = result["eager_ms"] / result["lumos_ms"]
    if "inductor_ms" in result:
        result["lumos_vs_inductor"] = result["inductor_ms"] / result["lumos_ms"]
    print(f"  lumos compiled   {result['lumos_ms']:8.2f} ms  ({result['lumos_vs_eager']:.2f}x eager"
          + (f", {result['lumos_vs_inductor']:.2f}x inductor" if "inductor_ms" in result else "") + ")")
    print("  best of runs     " + ", ".join(f"{engine} {result[f'{engine}_best_ms']:.2f} ms" for engine in engines))
    print(f"  matmul GFLOP/s   eager {result['eager_gflops']:.1f}"
          + (f", inductor {result['inductor_gflops']:.1f}" if "inductor_gflops" in result else "")
          + f", lumos {result['lumos_gflops']:.1f}  ({result['matmul_gflop']:.2f} GFLOP per forward)")
    print(f"  kernels {stats['kernels']} from {stats['primitive_ops']} primitive ops; planned peak "
          f"{stats['planned_peak_bytes'] / 2**20:.1f} MiB vs {stats['per_node_bytes'] / 2**20:.1f} MiB one buffer per node "
          f"({stats['unshared_bytes'] / 2**20:.1f} MiB without reuse)")
    print(f"  compile: cold {result['lumos_compile_cold_s']:.1f} s (gcc {result['lumos_build_cold_s']:.1f} s), warm "
          f"{result['lumos_compile_warm_s']:.1f} s (cache hit, {result['lumos_build_warm_s'] * 1000:.0f} ms); "
          f"max |diff| vs eager {result['max_error']:.1e}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--skip-inductor", action="store_true", help="Leave out torch.compile (slow to build).")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compile.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    train = load_config(TrainConfig, RECIPES / "train.toml")
    models = [
        ("quickstart", LumosModel(train.model, QUICKSTART_FEATURES)),
        ("sasrec", LumosModel(SASREC_CONFIG, SASREC_FEATURES)),
    ]
    results = [bench_model(name, model, args.batch, args.repeats, not args.skip_inductor) for name, model in models]
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads()},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
