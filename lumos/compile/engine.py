"""The compiler's API for the CLI and for inference: compile a model, verify it, store its plan.

`compile_model` traces and builds one model (program.py's passes), `verify.py` checks it against
PyTorch, `plan_store.py` writes, logs and loads plans, and `compile_run` is `lumos compile`: all
of it for one training run. The CUDA target (cuda_program.py) stops after NVRTC where no GPU
exists (`compile_run_cuda`). The names other modules import from here stay here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lumos.compile.cache import KernelCache
from lumos.compile.compiled_model import SEQUENCE_INPUTS, CompiledModel  # noqa: F401 (re-exported)
from lumos.compile.frontend import batch_tensors, lower_model
from lumos.compile.plan_store import (  # noqa: F401 (re-exported)
    PLAN_FILE,
    PLAN_FORMAT,
    SOURCE_FILE,
    artifact_dir,
    load_compiled,
    make_plan,
    model_fingerprint,
    model_tensors,
    program_from_plan,
    store_plan,
    write_plan,
)
from lumos.compile.program import Compilation, Options, compile_graph, load_program
from lumos.compile.verify import ATOL, RTOL, VerificationError, median_ms, time_forward, verify  # noqa: F401 (re-exported)
from lumos.core.errors import UsageError
from lumos.core.progress import Report
from lumos.core.workspace import Workspace
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel

TARGETS = ("cpu", "cuda")
SEARCH_BUDGET_S = 120.0
"""`lumos compile`'s default schedule-search budget per model (cached results make a rerun fast)."""


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise UsageError(f"--target {target}: not available; choose from {list(TARGETS)}")


@dataclass
class CompileResult:
    compiled: CompiledModel
    compilation: Compilation
    plan: dict
    max_error: float = float("nan")
    eager_ms: float = float("nan")
    compiled_ms: float = float("nan")
    seconds: dict[str, float] = field(default_factory=dict)


def compile_model(model: LumosModel, batch_size: int, seq_len: int, cache: KernelCache,
                  options: Options | None = None, report: Report = lambda _: None) -> CompileResult:
    """Trace, lower, fuse, plan, render and build `model` at (batch_size, seq_len)."""
    options = options or Options()
    if batch_size < 1 or seq_len < 1:
        raise UsageError("--batch and --seq must be at least 1")
    if seq_len > model.max_len:
        raise UsageError(f"--seq {seq_len} exceeds the model's max_len {model.max_len}")
    started = time.perf_counter()
    report(f"tracing the model at batch {batch_size}, sequence {seq_len}")
    graph = lower_model(model, batch_size, seq_len, symbolic_batch=options.symbolic_batch)
    traced = time.perf_counter()
    report(f"{len(graph.nodes)} IR nodes; fusing, searching schedules ({options.search_budget_s:.0f} s budget), "
           "planning buffers and building" if options.search_budget_s > 0 else
           f"{len(graph.nodes)} IR nodes; fusing, planning buffers and building")
    example = {name: tensor.detach().cpu().float().numpy()
               for name, tensor in batch_tensors(synthetic_batch(model.features, batch_size, seq_len, seed=5),
                                                 model.features).items() if name in graph.inputs}
    compilation = compile_graph(graph, cache, options, example_inputs=example)
    plan = make_plan(compilation, model, batch_size, seq_len, cache.target)
    compiled = CompiledModel(load_program(compilation), plan, model.features)
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
    """How the cost model ranked the candidates against their measured times (cost_model.py)."""
    fusion: dict | None = None
    """The fusion choices the e-graph offered, each tried as a whole call, and which were kept (search.py)."""


def compile_run(workspace: Workspace, run_id: str, target: str = "cpu", batch_size: int = 256,
                seq_len: int | None = None, options: Options | None = None,
                report: Report = lambda _: None, search_budget_s: float = SEARCH_BUDGET_S) -> CompileSummary:
    """Compile a training run's model, verify it against PyTorch, store the plan on the run."""
    from lumos.train.trained_model import load_training_run

    check_target(target)
    settings = workspace.settings.compile
    options = options or Options(cc=settings.cc, cflags=tuple(settings.cflags), search_budget_s=search_budget_s)
    model = load_training_run(workspace, run_id).model
    model.eval()
    seq_len = seq_len or model.features.max_len
    if target == "cuda":
        return compile_run_cuda(workspace, run_id, model, batch_size, seq_len, report)
    result = compile_model(model, batch_size, seq_len, KernelCache.for_workspace(workspace, target), options, report)
    report("verifying against PyTorch")
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
                          search.cost_model if search else None, search.fusion if search else None)


def compile_run_cuda(workspace: Workspace, run_id: str, model: LumosModel, batch_size: int, seq_len: int,
                     report: Report = lambda _: None) -> CompileSummary:
    """The CUDA target (cuda_engine.py): build with NVRTC; on a GPU verify, time and store the
    plan; without one raise NoGpuError once the kernels are built."""
    from lumos.compile import cuda_engine

    if batch_size < 1 or seq_len < 1 or seq_len > model.max_len:
        raise UsageError(f"--batch {batch_size} --seq {seq_len}: both at least 1, --seq at most the model's max_len {model.max_len}")
    cache = KernelCache.for_workspace(workspace, "cuda")
    result = cuda_engine.compile_cuda_model(model, batch_size, seq_len, cache, report=report)
    if result.program is None:
        raise cuda_engine.NoGpuError(cuda_engine.no_gpu_message(result, cache))
    report("verifying against PyTorch on the GPU")
    max_error = cuda_engine.verify_gpu(result, model)
    report("timing with CUDA events")
    eager_ms, compiled_ms = cuda_engine.time_gpu(result, model)
    plan = cuda_engine.cuda_plan(result, model, batch_size, seq_len)
    artifact = cuda_engine.store_cuda_plan(workspace, run_id, result, plan)
    build = result.compilation.build
    return CompileSummary(run_id, "cuda", batch_size, seq_len, result.compilation.stats(), max_error, eager_ms,
                          compiled_ms, build.hit, result.seconds, artifact, str(build.library))


def clear_cache(workspace: Workspace, target: str = "cpu") -> int:
    return KernelCache.for_workspace(workspace, target).clear()
