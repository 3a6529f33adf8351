"""The CUDA target's pipeline: from a primitive graph to PTX, one linear list of passes.

    check → e-graph (egraph/rewrite.py, as the C target) → layout (transpose weights) → schedule (fuse into kernels) → attention (online-softmax
    kernels, egraph/attention.py) → plan buffers → render CUDA → build (NVRTC, kernel cache)

The same fusion and buffer plan as the C target (program.py); no schedule search yet (kernels
are timed only on a GPU, which the search would need). None of it needs a GPU: the result is
PTX that `runtime/cuda.py` loads where one exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lumos.compile.egraph.attention import find_attention, fuse_attention
from lumos.compile.egraph.rewrite import RewriteReport, rewrite_graph
from lumos.compile.ir.graph import LEAF, Graph, Node
from lumos.compile.program import run_passes
from lumos.compile.render.cuda import CudaProgram, render_program
from lumos.compile.runtime.kernel_cache import Build, KernelCache
from lumos.compile.schedule.buffers import BufferPlan, plan_buffers
from lumos.compile.schedule.kernels import Kernel, schedule
from lumos.compile.schedule.layout import transpose_activations, transpose_weights

DEFAULT_ARCH = "sm_80"
"""Architecture to build for when no GPU says which (Ampere; PTX for it JIT-compiles on newer GPUs)."""


@dataclass(frozen=True)
class CudaOptions:
    arch: str = DEFAULT_ARCH
    """GPU architecture, sm_XX: the device's compute capability where there is one."""
    fuse_attention: bool = True
    """Compute each attention with one online-softmax kernel (no score matrix stored)."""
    recompute_cheap: bool = True
    rewrite: bool = True
    """Put the graph through the e-graph's algebra and view rules first, as the C target does."""


@dataclass
class CudaCompilation:
    graph: Graph
    options: CudaOptions
    kernels: list[Kernel] = field(default_factory=list)
    materialized: set[Node] = field(default_factory=set)
    attention: int = 0
    """How many attentions run as one online-softmax kernel."""
    buffers: BufferPlan | None = None
    program: CudaProgram | None = None
    build: Build | None = None
    rewrite: RewriteReport | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def stats(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for launch in self.program.launches:
            kinds[launch.kind] = kinds.get(launch.kind, 0) + 1
        primitive = [node for node in self.graph.nodes if node.op not in LEAF]
        fused = sum(len(kernel.unique_fused) for kernel in self.kernels)
        return {"primitive_ops": len(primitive), "kernels": len(self.kernels), "fused_ops": fused - len(self.kernels),
                "planned_peak_bytes": self.buffers.arena_bytes, "unshared_bytes": self.buffers.unshared_bytes,
                "per_node_bytes": self.buffers.per_node_bytes, "attention_kernels": self.attention,
                **{f"{kind}_kernels": count for kind, count in kinds.items()}}


def _rewrite(c: CudaCompilation, cache: KernelCache) -> None:
    if c.options.rewrite:
        c.rewrite = rewrite_graph(c.graph)


def _layout(c: CudaCompilation, cache: KernelCache) -> None:
    transpose_weights(c.graph)
    transpose_activations(c.graph)


def _schedule(c: CudaCompilation, cache: KernelCache) -> None:
    c.kernels, c.materialized = schedule(c.graph, c.options.recompute_cheap)


def _attention(c: CudaCompilation, cache: KernelCache) -> None:
    if not c.options.fuse_attention:
        return
    matches, _ = find_attention(c.graph)
    if matches:
        c.kernels, c.materialized, used = fuse_attention(c.graph, c.materialized, matches)
        c.attention = len(used)


def _plan(c: CudaCompilation, cache: KernelCache) -> None:
    c.buffers = plan_buffers(c.graph, c.kernels)


def _render(c: CudaCompilation, cache: KernelCache) -> None:
    c.program = render_program(c.graph, c.kernels, c.materialized, c.buffers)


def _build(c: CudaCompilation, cache: KernelCache) -> None:
    c.build = cache.build_cuda(c.program.source, c.options.arch)


PASSES: list[tuple[str, Callable[[CudaCompilation, KernelCache], None]]] = [
    ("egraph", _rewrite),  # the same extracted program as the C target's
    ("layout", _layout),
    ("schedule", _schedule),
    ("attention", _attention),
    ("plan_buffers", _plan),
    ("render_cuda", _render),
    ("build", _build),  # NVRTC, through the kernel cache
]


def compile_cuda_graph(graph: Graph, cache: KernelCache, options: CudaOptions | None = None) -> CudaCompilation:
    return run_passes(PASSES, CudaCompilation(graph, options or CudaOptions()), cache)
