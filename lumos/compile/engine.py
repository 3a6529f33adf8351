"""The compiler's API for the CLI and for inference: compile a model, verify it, store its plan.

`compile_model` traces and builds one model for a target (target.py: its passes, build and
runtime), `verify.py` checks it against PyTorch on the target's device, `plan_store.py` writes,
logs and loads plans, and `compile_run` is `lumos compile`: all of it for one training run. Where
the target cannot run here (CUDA without a GPU) it stops after the build with NoGpuError. The
names other modules import from here stay here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lumos.compile.compilation import DEFAULT_ARCH, Options
from lumos.compile.compiled_model import SEQUENCE_INPUTS, CompiledModel  # noqa: F401 (re-exported)
from lumos.compile.frontend.lumos_model import batch_tensors, lower_model
from lumos.compile.plan_store import (  # noqa: F401 (re-exported)
    PLAN_FILE,
    PLAN_FORMAT,
    artifact_dir,
    load_compiled,
    make_plan,
    model_fingerprint,
    model_tensors,
    program_from_plan,
    store_plan,
    write_plan,
)
from lumos.compile.program import compile_graph
from lumos.compile.result import CompileResult
from lumos.compile.runtime.cuda import gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.target import ATOL, CPU, RTOL, TARGETS, Target, target_named  # noqa: F401 (re-exported)
from lumos.compile.verify import VerificationError, median_ms, time_forward, verify  # noqa: F401 (re-exported)
from lumos.core.errors import LumosError, UsageError
from lumos.core.progress import Report
from lumos.core.workspace import Workspace
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel

SEARCH_BUDGET_S = 120.0
"""`lumos compile`'s default schedule-search budget per model (cached results make a rerun fast)."""


class NoGpuError(LumosError):
    """The CUDA kernels were built, but there is no GPU to verify and time them on."""


def check_target(target: str) -> None:
    target_named(target)


def compile_model(model: LumosModel, batch_size: int, seq_len: int, cache: KernelCache,
                  options: Options | None = None, report: Report = lambda _: None, target: Target = CPU) -> CompileResult:
    """Trace, lower, fuse, plan, render and build `model` at (batch_size, seq_len) for `target`,
    and load it where this machine runs the target (`CompileResult.compiled`, else None)."""
    options = options or Options(arch=gpu_arch() or DEFAULT_ARCH)
    if batch_size < 1 or seq_len < 1:
        raise UsageError("--batch and --seq must be at least 1")
    if seq_len > model.max_len:
        raise UsageError(f"--seq {seq_len} exceeds the model's max_len {model.max_len}")
    started = time.perf_counter()
    report(f"tracing the model at batch {batch_size}, sequence {seq_len}")
    graph = lower_model(model, batch_size, seq_len, symbolic_batch=options.symbolic_batch)
    traced = time.perf_counter()
    toolchain = target.toolchain(options)
    searching = f"searching schedules ({options.search_budget_s:.0f} s budget), " if (
        options.search_budget_s > 0 and "search" in dict(target.passes)) else ""
    report(f"{len(graph.nodes)} IR nodes; fusing, {searching}planning buffers and building with {toolchain.name}")
    example = {name: tensor.detach().cpu().float().numpy()
               for name, tensor in batch_tensors(synthetic_batch(model.features, batch_size, seq_len, seed=5),
                                                 model.features).items() if name in graph.inputs}
    compilation = compile_graph(graph, cache, options, example_inputs=example, target=target)
    plan = make_plan(compilation, model, batch_size, seq_len)
    compiled = target.model(target.load(compilation, None), plan, model.features) if target.runs_here() else None
    seconds = {"trace": traced - started, **compilation.timings, "total": time.perf_counter() - started}
    return CompileResult(compiled, compilation, plan, seconds=seconds)


# ---------------------------------------------------------------------------------------------
# `lumos compile`


@dataclass
class CompileSummary:
    run_id: str
    target: str
    batch_size: int
    seq_len: int
    stats: dict[str, int]
    max_error: float
    eager_ms: float
    compiled_ms: float
    cache_hit: bool
    seconds: dict[str, float]
    artifact: str
    library: str
    search: list[dict] = field(default_factory=list)
    """Per distinct kernel: rules fired, candidates tried, baseline, best and worst times (search.py)."""
    search_rounds: int = 0
    search_cache_hit: bool = False
    attention: dict | None = None
    """What the attention rules found (online softmax) and whether the fused kernels were kept."""
    search_confirmed: dict | None = None
    """Whole-call ms without and with the search's choices, and whether they were kept."""
    egraph: dict | None = None
    """The e-graph pass (egraph/rewrite.py): e-nodes, e-classes, saturation time, rules fired, ops before and after."""
    cost_model: dict | None = None
    """How the cost model ranked the candidates against their measured times (search/cost_model.py)."""
    fusion: dict | None = None
    """The fusion choices the e-graph offered, each tried as a whole call, and which were kept (search.py)."""
    programs: dict | None = None
    """With --egraph-fusion: the fusions the e-graph proposed that the scheduler does not make, the
    programs timed, and which were kept (search/genome.py). On the CUDA target: the products
    rule's joins and whether each was kept."""


def compile_run(workspace: Workspace, run_id: str, target: str = "cpu", batch_size: int = 256,
                seq_len: int | None = None, options: Options | None = None,
                report: Report = lambda _: None, search_budget_s: float = SEARCH_BUDGET_S,
                egraph_fusion: bool = False) -> CompileSummary:
    """Compile a training run's model, verify it against PyTorch, store the plan on the run.

    For a target this machine cannot run (CUDA without a GPU) it builds everything, then raises
    NoGpuError: only the target's device can verify a plan, and an unverified one is not stored."""
    from lumos.train.trained_model import load_training_run

    chosen = target_named(target)
    settings = workspace.settings.compile
    options = options or Options(cc=settings.cc, cflags=tuple(settings.cflags), search_budget_s=search_budget_s,
                                 arch=gpu_arch() or DEFAULT_ARCH, egraph_fusion=egraph_fusion)
    model = load_training_run(workspace, run_id).model
    model.eval()
    seq_len = seq_len or model.features.max_len
    result = compile_model(model, batch_size, seq_len, KernelCache.for_workspace(workspace, target), options, report, chosen)
    if result.compiled is None:
        raise NoGpuError(no_gpu_message(result))
    report(f"verifying against PyTorch on the {chosen.device.upper()}")
    verify(result, model)
    report("timing")
    time_forward(result, model)
    artifact = store_plan(workspace, run_id, result)
    build = result.compilation.build
    search = result.compilation.search
    return CompileSummary(run_id, target, batch_size, seq_len, result.compilation.stats(), result.max_error,
                          result.eager_ms, result.compiled_ms, build.hit, result.seconds, artifact, str(build.library),
                          search.report() if search else [], search.rounds if search else 0,
                          bool(search and search.cache_hit), search.attention if search else None,
                          search.confirmed if search else None,
                          result.compilation.rewrite.as_dict() if result.compilation.rewrite else None,
                          search.cost_model if search else None, search.fusion if search else None,
                          result.compilation.programs)


def no_gpu_message(result: CompileResult) -> str:
    compilation = result.compilation
    return (f"built {len(compilation.cuda.launches)} CUDA kernels for {compilation.options.arch} with NVRTC "
            f"{result.plan['nvrtc']} (kernel cache {compilation.build.library.parent}), but this machine has no CUDA GPU "
            "to verify and time them on, so no plan was stored; run `lumos compile --target cuda` where "
            "`lumos doctor` shows a GPU")


def clear_cache(workspace: Workspace, target: str = "cpu") -> int:
    return KernelCache.for_workspace(workspace, target).clear()
