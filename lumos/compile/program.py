"""The pipeline from a primitive graph to a runnable native program: a target's linear list of passes.

    check → e-graph (algebra and view rules, the cheapest equivalent program extracted: egraph/rewrite.py)
    → horizontal (C: linear layers on one input as one matmul) → layout (transpose weights)
    → schedule (fuse into kernels) → programs (C, Options.egraph_fusion: the e-graph's fusion
    proposals, egraph/programs.py, and a measured climb over them, search/genome.py)
    → search (C: schedule variants by measurement, search/)
    or attention (CUDA: online-softmax kernels, egraph/attention.py)
    → products (CUDA: matrix products of one value, a query/key/value projection, as one tiled
    kernel with an output each: the e-graph's products rule proposes, schedule/products.py lowers)
    → siblings (C, Options.multi_output or the chosen program's joins: a layer norm's statistics
    as one kernel with two outputs)
    → plan buffers → render (C or CUDA) → build (gcc or NVRTC, through the kernel cache) → load

Each pass (passes.py) takes and returns the `Compilation` it fills in; the graph is checked before
and after, so a pass that breaks an invariant is named at once. Which passes run, how the source
is built and how the result is loaded is the target's (target.py). None of it needs a GPU: the
CUDA target's result is PTX that `runtime/cuda.py` loads where one exists.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import numpy as np

from lumos.compile.compilation import DEFAULT_ARCH, Compilation, Options
from lumos.compile.ir.graph import Graph, check_graph
from lumos.compile.passes import Pass
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import CPU, TARGETS, Target

__all__ = ["DEFAULT_ARCH", "Compilation", "Options", "compile_graph", "load_program", "run_passes"]


def compile_graph(graph: Graph, cache: KernelCache, options: Options | None = None,
                  example_inputs: Mapping[str, np.ndarray] | None = None, target: Target = CPU) -> Compilation:
    compilation = Compilation(graph, options or Options(), target.name, example_inputs=example_inputs)
    return run_passes(target.passes, compilation, cache)


def run_passes(passes: Iterable[tuple[str, Pass]], compilation: Compilation, cache: KernelCache) -> Compilation:
    """Run a target's pass list over `compilation`, timing each pass and checking the graph after it."""
    check_graph(compilation.graph)
    for name, run in passes:
        started = time.perf_counter()
        run(compilation, cache)
        compilation.timings[name] = time.perf_counter() - started
        check_graph(compilation.graph)
    return compilation


def load_program(compilation: Compilation, tensors: Mapping[str, np.ndarray] | None = None):
    """The built program bound to the graph's constant tensors (or `tensors`, the same names), by
    its target's runtime: a NativeProgram (C) or a GpuProgram (CUDA)."""
    return TARGETS[compilation.target].load(compilation, tensors)
