"""The pipeline from a primitive graph to a runnable native program: one linear list of passes.

    check → e-graph (algebra and view rules, the cheapest equivalent program extracted: egraph/rewrite.py)
    → horizontal (linear layers on one input as one matmul) → layout (transpose weights)
    → schedule (fuse into kernels) → search (schedule variants by measurement, search.py)
    → plan buffers → render C → build (kernel cache) → load

Each pass takes and returns the `Compilation` it fills in; the graph is checked before and
after, so a pass that breaks an invariant is named at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from lumos.compile.egraph.rewrite import RewriteReport, rewrite_graph
from lumos.compile.ir.graph import LEAF, Graph, Node, check_graph
from lumos.compile.render.c import render_library, tensor_names
from lumos.compile.runtime.kernel_cache import Build, KernelCache
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.schedule.buffers import BufferPlan, plan_buffers
from lumos.compile.schedule.horizontal import fuse_linear_layers
from lumos.compile.schedule.kernels import Kernel, KernelSchedule, schedule
from lumos.compile.schedule.layout import transpose_activations, transpose_weights
from lumos.compile.search.cache import SearchCache
from lumos.compile.search.climb import SearchResult, search_schedules


@dataclass(frozen=True)
class Options:
    cc: str = "gcc"
    cflags: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp")
    reuse_buffers: bool = True
    """Plan intermediates by liveness (False: one buffer each, to measure what reuse saves)."""
    recompute_cheap: bool = True
    """Inline cheap elementwise nodes into each of their consumers instead of storing them."""
    rewrite: bool = True
    """Run the e-graph pass (False: compile the graph as traced, to measure what the rules remove)."""
    fuse_linear_layers: bool = True
    """One matmul for linear layers that read the same input (schedule/horizontal.py; False: measure what it gains)."""
    symbolic_batch: bool = True
    """Trace twice to make the batch dim symbolic (ir.mark_batch): no padding of small batches."""
    transpose_weights: bool = True
    """Store linear weights as (in, out) so that matmuls read them row by row (layout.py)."""
    transpose_activations: bool = True
    """Copy matmul operands read across the output row (attention keys) into a row-wise layout."""
    search_budget_s: float = 0.0
    """Seconds to search kernel schedules by measurement (search.py); 0: the renderer's heuristic.
    The first round (the heuristic, measured) always runs; cached results cost no search."""
    search_cache: bool = True
    """Reuse and store search results under the kernel cache (search/cache.py)."""
    search_seed: int = 0
    register_blocks: bool = True
    """Let the search try the register-blocked matmul micro-kernel (False: measure what it gains;
    then also turn `search_cache` off, since the cache does not tell the two searches apart)."""


@dataclass
class Compilation:
    graph: Graph
    options: Options
    kernels: list[Kernel] = field(default_factory=list)
    materialized: set[Node] = field(default_factory=set)
    buffers: BufferPlan | None = None
    source: str = ""
    build: Build | None = None
    timings: dict[str, float] = field(default_factory=dict)
    example_inputs: Mapping[str, np.ndarray] | None = None
    """Inputs the search verifies and times candidates on (default: random, valid gather ids)."""
    search: SearchResult | None = None
    schedules: dict[str, KernelSchedule] = field(default_factory=dict)
    rewrite: RewriteReport | None = None
    """The e-graph pass: its size, saturation time, the rules that fired, ops before and after."""
    matmuls_merged: int = 0
    """Matmuls that horizontal fusion removed (each merged into another on the same input)."""

    def stats(self) -> dict[str, int]:
        primitive = [node for node in self.graph.nodes if node.op not in LEAF]
        fused = sum(len(kernel.unique_fused) for kernel in self.kernels)
        return {
            "primitive_ops": len(primitive),
            "kernels": len(self.kernels),
            "matmuls_merged": self.matmuls_merged,
            "fused_ops": fused - len(self.kernels),
            "planned_peak_bytes": self.buffers.arena_bytes,
            "unshared_bytes": self.buffers.unshared_bytes,
            "per_node_bytes": self.buffers.per_node_bytes,
        }


def _rewrite(c: Compilation, cache: KernelCache) -> None:
    if c.options.rewrite:
        c.rewrite = rewrite_graph(c.graph)


def _horizontal(c: Compilation, cache: KernelCache) -> None:
    if c.options.fuse_linear_layers:
        c.matmuls_merged = fuse_linear_layers(c.graph)


def _layout(c: Compilation, cache: KernelCache) -> None:
    if c.options.transpose_weights:
        transpose_weights(c.graph)
    if c.options.transpose_activations:
        transpose_activations(c.graph)


def _schedule(c: Compilation, cache: KernelCache) -> None:
    c.kernels, c.materialized = schedule(c.graph, c.options.recompute_cheap)


def _search(c: Compilation, cache: KernelCache) -> None:
    if c.options.search_budget_s <= 0 or not c.kernels:
        return
    store = SearchCache(cache, c.options.cc, c.options.cflags) if c.options.search_cache else None
    c.search = search_schedules(c.graph, c.kernels, c.materialized, cache, c.options.cc, c.options.cflags,
                                c.options.search_budget_s, c.example_inputs, store, c.options.search_seed,
                                register_blocks=c.options.register_blocks)
    c.schedules = c.search.schedules
    c.kernels, c.materialized = c.search.kernels, c.search.materialized


def _plan(c: Compilation, cache: KernelCache) -> None:
    c.buffers = plan_buffers(c.graph, c.kernels, c.options.reuse_buffers)


def _render(c: Compilation, cache: KernelCache) -> None:
    c.source = render_library(c.graph, c.kernels, c.materialized, c.buffers, c.schedules)


def _build(c: Compilation, cache: KernelCache) -> None:
    c.build = cache.build(c.source, c.options.cc, c.options.cflags)


PASSES: list[tuple[str, Callable[[Compilation, KernelCache], None]]] = [
    ("egraph", _rewrite),  # first: layout's copies (x + 0) are what the algebra removes
    ("horizontal", _horizontal),
    ("layout", _layout),
    ("schedule", _schedule),
    ("search", _search),
    ("plan_buffers", _plan),
    ("render_c", _render),
    ("build", _build),
]


def compile_graph(graph: Graph, cache: KernelCache, options: Options | None = None,
                  example_inputs: Mapping[str, np.ndarray] | None = None) -> Compilation:
    return run_passes(PASSES, Compilation(graph, options or Options(), example_inputs=example_inputs), cache)


def run_passes(passes, compilation, cache: KernelCache):
    """Run a target's pass list over `compilation`, timing each pass and checking the graph after it."""
    check_graph(compilation.graph)
    for name, run in passes:
        started = time.perf_counter()
        run(compilation, cache)
        compilation.timings[name] = time.perf_counter() - started
        check_graph(compilation.graph)
    return compilation


def load_program(compilation: Compilation, tensors: Mapping[str, np.ndarray] | None = None) -> NativeProgram:
    """The built library bound to the graph's constant tensors (or `tensors`, the same names)."""
    graph = compilation.graph
    source = tensors if tensors is not None else graph.tensors
    return NativeProgram(
        compilation.build.library,
        [(name, node.shape) for name, node in graph.inputs.items()],
        [(name, node.shape) for name, node in graph.outputs.items()],
        [source[name] for name in tensor_names(graph)],
        compilation.buffers.arena_bytes,
        symbolic_batch=graph.batch is not None,
    )
