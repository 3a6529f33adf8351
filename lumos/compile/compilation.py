"""What the passes share: the options of a compile and the `Compilation` that its passes fill in.

One `Options` and one `Compilation` for every target (target.py): a field that only one target's
passes read says so, and stays at its default for the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from lumos.compile.egraph.rewrite import RewriteReport
from lumos.compile.ir.graph import LEAF, Graph, Node
from lumos.compile.render.cuda import CudaProgram
from lumos.compile.runtime.kernel_cache import Build
from lumos.compile.schedule.buffers import BufferPlan
from lumos.compile.schedule.kernels import Kernel, KernelSchedule
from lumos.compile.search.climb import SearchResult

DEFAULT_ARCH = "sm_80"
"""Architecture to build CUDA for when no GPU says which (Ampere; PTX for it JIT-compiles on newer GPUs)."""


@dataclass(frozen=True)
class Options:
    # Every target.
    rewrite: bool = True
    """Run the e-graph pass (False: compile the graph as traced, to measure what the rules remove)."""
    recompute_cheap: bool = True
    """Inline cheap elementwise nodes into each of their consumers instead of storing them."""
    reuse_buffers: bool = True
    """Plan intermediates by liveness (False: one buffer each, to measure what reuse saves)."""
    symbolic_batch: bool = True
    """Trace twice to make the batch dim symbolic (ir.mark_batch): no padding of small batches."""
    transpose_weights: bool = True
    """Store linear weights as (in, out) so that matmuls read them row by row (layout.py)."""
    transpose_activations: bool = True
    """Copy matmul operands read across the output row (attention keys) into a row-wise layout."""

    # The C target.
    cc: str = "gcc"
    cflags: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp")
    fuse_linear_layers: bool = True
    """One matmul for linear layers that read the same input (schedule/horizontal.py; False: measure what it gains)."""
    search_budget_s: float = 0.0
    """Seconds to search kernel schedules by measurement (search.py); 0: the renderer's heuristic.
    The first round (the heuristic, measured) always runs; cached results cost no search."""
    search_cache: bool = True
    """Reuse and store search results under the kernel cache (search/cache.py)."""
    search_seed: int = 0
    multi_output: bool = False
    """Join sibling row statistics (a layer norm's mean and variance) into one kernel with several
    outputs (schedule/siblings.py). Off by default: the same values bit for bit, but no faster
    on both benchmark models' layer norms (benchmarks/layer_norm_stats.py; README, Compile)."""
    egraph_fusion: bool = False
    """Let the e-graph propose the program (egraph/programs.py: fusions, recomputations and sibling
    kernels the scheduler does not make) and the search pick among the extracted programs by
    measurement (search/genome.py, a quarter of `search_budget_s`; without a budget, the proposals
    are only reported). Off by default: not yet measured faster on the benchmark models."""
    register_blocks: bool = True
    """Let the search try the register-blocked matmul micro-kernel (False: measure what it gains;
    then also turn `search_cache` off, since the cache does not tell the two searches apart)."""

    # The CUDA target.
    arch: str = DEFAULT_ARCH
    """GPU architecture, sm_XX: the device's compute capability where there is one."""
    fuse_attention: bool = True
    """Compute each attention with one online-softmax kernel (no score matrix stored)."""
    join_products: bool = True
    """Matrix products of one value (a query/key/value projection) as one tiled kernel with an
    output each: the products rule's proposals (egraph/programs.py), lowered by
    schedule/products.py (False: proposed but not kept, a kernel each, to measure what it gains)."""


@dataclass
class Compilation:
    graph: Graph
    options: Options
    target: str = "cpu"
    """The name of the target (target.py) whose passes fill this in."""
    kernels: list[Kernel] = field(default_factory=list)
    materialized: set[Node] = field(default_factory=set)
    buffers: BufferPlan | None = None
    source: str = ""
    """The rendered program: the C library, or the CUDA kernels."""
    cuda: CudaProgram | None = None
    """The CUDA target's rendering: each kernel's source by name, and the launches in order with
    their blocks and buffers (in C the library's driver launches them)."""
    build: Build | None = None
    timings: dict[str, float] = field(default_factory=dict)
    example_inputs: Mapping[str, np.ndarray] | None = None
    """Inputs the search verifies and times candidates on (default: random, valid gather ids)."""
    search: SearchResult | None = None
    schedules: dict[str, KernelSchedule] = field(default_factory=dict)
    rewrite: RewriteReport | None = None
    """The e-graph pass: its size, saturation time, the rules that fired, ops before and after."""
    matmuls_merged: int | None = None
    """Matmuls that horizontal fusion removed (each merged into another on the same input); None
    where the target has no horizontal pass."""
    attention: int | None = None
    """How many attentions run as one online-softmax kernel; None where the target has no attention pass."""
    programs: dict | None = None
    """With Options.egraph_fusion: what the e-graph proposed beyond the scheduler, the programs
    timed and the one kept (search/genome.py: ProgramSearch.report). On the CUDA target: the
    products rule's proposals and whether each is kept (genome.py: proposals_report)."""
    products_joined: list[str] | None = None
    """The kernels that compute several matrix products of one value (schedule/products.py);
    None where the target has no products pass."""
    joins: set | None = None
    """With Options.egraph_fusion: the sibling kernel pairs (earlier node, later node) the chosen
    program joins, after the schedule search (which times single-output kernels)."""

    def stats(self) -> dict[str, int]:
        primitive = [node for node in self.graph.nodes if node.op not in LEAF]
        fused = sum(len(kernel.unique_fused) for kernel in self.kernels)
        merged = {} if self.matmuls_merged is None else {"matmuls_merged": self.matmuls_merged}
        stats = {"primitive_ops": len(primitive), "kernels": len(self.kernels), **merged,
                 "fused_ops": fused - len(self.kernels), "planned_peak_bytes": self.buffers.arena_bytes,
                 "unshared_bytes": self.buffers.unshared_bytes, "per_node_bytes": self.buffers.per_node_bytes}
        if self.attention is not None:
            stats["attention_kernels"] = self.attention
        if self.products_joined is not None:
            stats["joined_product_kernels"] = len(self.products_joined)
        for launch in self.cuda.launches if self.cuda else []:
            stats[f"{launch.kind}_kernels"] = stats.get(f"{launch.kind}_kernels", 0) + 1
        return stats
