"""This machine's fused multiply-add peak, measured by a standalone kernel: the yardstick for the
compiler's matmul GFLOP/s (benchmarks/compile.py reports its matmul kernels against it).

    python benchmarks/fma_peak.py [--threads N] [--seconds 1.0] [--out benchmarks/results/fma_peak.json]

The kernel is C, built by the same gcc with the same flags as the Lumos kernels (-O3
-march=native -fopenmp): every thread runs 12 independent chains of vector FMAs (enough to hide
the FMA latency on both FMA ports), 8 and 16 floats wide, with no memory traffic. It counts
2 flops per lane per FMA. The best of five timed runs per width is the peak; the wider vector
needs AVX-512 (on AMD Zen 4 it is executed as two 256-bit halves, so both widths should agree).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import tempfile
import time
from pathlib import Path

from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import BuildError, KernelCache, gcc

ROOT = Path(__file__).resolve().parent.parent
CHAINS = 12

SOURCE = """
#include <omp.h>
typedef float vec __attribute__((vector_size(WIDTH * 4)));

float fma_chains(long iterations, int threads) {
    float sink = 0.0f;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        vec acc[CHAINS], a, b;
        for (int lane = 0; lane < WIDTH; lane++) { a[lane] = 0.999999f; b[lane] = 1e-7f * (lane + 1); }
        for (int chain = 0; chain < CHAINS; chain++) acc[chain] = b * (float)(chain + omp_get_thread_num());
        for (long i = 0; i < iterations; i++) {
            #pragma GCC unroll 12
            for (int chain = 0; chain < CHAINS; chain++) acc[chain] = acc[chain] * a + b;
        }
        for (int chain = 0; chain < CHAINS; chain++) sink += acc[chain][0];
    }
    return sink;
}
"""


def build(width: int, folder: Path) -> ctypes.CDLL:
    """Built as the Lumos kernels are: through a kernel cache, with the default compiler and flags."""
    options = Options()
    source = f"#define WIDTH {width}\n#define CHAINS {CHAINS}\n" + SOURCE
    library = KernelCache(folder, "cpu").build(source, gcc(options.cc, options.cflags)).library
    kernel = ctypes.CDLL(str(library)).fma_chains
    kernel.argtypes, kernel.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_float
    return kernel


def peak_gflops(kernel, width: int, threads: int, seconds: float) -> float:
    """Best of five runs of about `seconds` each."""
    iterations = 1 << 16
    while True:  # calibrate: a run of about `seconds`
        began = time.perf_counter()
        kernel(iterations, threads)
        if time.perf_counter() - began > seconds / 4:
            break
        iterations *= 2
    iterations = int(iterations * seconds / max(time.perf_counter() - began, 1e-6))
    best = 0.0
    for _ in range(5):
        began = time.perf_counter()
        kernel(iterations, threads)
        elapsed = time.perf_counter() - began
        best = max(best, 2 * width * CHAINS * iterations * threads / elapsed / 1e9)
    return best


def measure(threads: int, seconds: float = 1.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="lumos-fma-") as folder:
        widths = {}
        for width in (8, 16):
            try:
                widths[width] = peak_gflops(build(width, Path(folder)), width, threads, seconds)
            except (BuildError, OSError) as error:  # no such vectors on this CPU
                print(f"  {width}-wide vectors: not built ({error})")
    return {"threads": threads, "gflops_by_width": widths, "peak_gflops": max(widths.values()),
            "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seconds", type=float, default=1.0, help="Length of each timed run.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fma_peak.json")
    args = parser.parse_args()
    result = measure(args.threads, args.seconds)
    for width, gflops in result["gflops_by_width"].items():
        print(f"{width:2d}-wide FMA chains, {args.threads} threads: {gflops:7.1f} GFLOP/s")
    print(f"peak {result['peak_gflops']:.1f} GFLOP/s ({result['peak_gflops'] / args.threads:.1f} per thread); "
          f"load average {', '.join(f'{x:.2f}' for x in result['load_average'])}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
