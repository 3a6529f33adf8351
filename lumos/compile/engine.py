"""The compiler's API for the CLI and for inference: compile a model, verify it, store and load plans.

A *plan* is everything needed to run a compiled model again without tracing it: the generated C
(kernels and driver), the inputs, outputs and constant tensors in the driver's order, the buffer
plan and the launch order, and the (batch, sequence) shape it was built for. It is stored as the
artifacts `compile/<target>/plan.json` and `compile/<target>/library.c` of the training run
(registered model versions point at their run). Weights are not copied into it: they are bound
from the model when the plan is loaded, and a fingerprint of the model's config and feature spec
makes sure the plan fits the model.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lumos.compile.cache import KernelCache
from lumos.compile.frontend import batch_tensors, lower_model, output_names
from lumos.compile.ir import LITERAL_PREFIX
from lumos.compile.layout import TRANSPOSED
from lumos.compile.program import Compilation, Options, compile_graph, load_program
from lumos.compile.render_c import tensor_names
from lumos.compile.runtime import NativeProgram
from lumos.core.errors import LumosError, UsageError
from lumos.core.settings import CompileSettings
from lumos.core.workspace import Workspace
from lumos.data.contract import Batch, FeatureSpec
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel, ModelOutput

PLAN_FILE = "plan.json"
SOURCE_FILE = "library.c"
PLAN_FORMAT = 1  # bump when the plan fields or the driver signature (runtime.py) change
TARGETS = ("cpu",)
SEQUENCE_INPUTS = ("mask", "numeric")  # and every tokens.* input: (B, T, ...)
ATOL = RTOL = 1e-4
SEARCH_BUDGET_S = 120.0
"""`lumos compile`'s default schedule-search budget per model (cached results make a rerun fast)."""

Report = Callable[[str], None]


class VerificationError(LumosError):
    """The compiled model's outputs differ from PyTorch's; the plan is not saved."""


def artifact_dir(target: str) -> str:
    return f"compile/{target}"


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise UsageError(f"--target {target}: not available yet; choose from {list(TARGETS)}")


def model_fingerprint(model: LumosModel) -> str:
    described = {"config": dataclasses.asdict(model.config), "features": dataclasses.asdict(model.features)}
    return "sha256:" + hashlib.sha256(json.dumps(described, sort_keys=True, default=list).encode()).hexdigest()


def model_tensors(model: LumosModel) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


# ---------------------------------------------------------------------------------------------
# The runnable model


class CompiledModel:
    """A built plan bound to a model's weights; called like `LumosModel.forward` in eval mode.

    Any batch size and any history length up to the plan's. The batch is symbolic (the kernels
    loop over as many rows as given, up to the plan's batch; larger batches run in chunks);
    shorter histories are padded (padded positions are masked out, so outputs are unchanged).
    A plan whose batch could not be made symbolic pads rows too (dummy rows never mix with real ones).
    A batch with longer histories than the plan runs in PyTorch on `fallback` (with a warning)
    when one is given, else raises ValueError. Not thread-safe: calls share one arena.
    """

    def __init__(self, program: NativeProgram, plan: dict, features: FeatureSpec, fallback: LumosModel | None = None):
        self.program, self.plan, self.features, self.fallback = program, plan, features, fallback
        self.batch_size, self.seq_len = plan["batch_size"], plan["seq_len"]
        self.output_shapes = {item["name"]: tuple(item["shape"]) for item in plan["outputs"]}

    def run_arrays(self, named: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Named float32 inputs (any rows, history up to the plan's) → named outputs: rows are padded
        up to the plan's batch or run in chunks of it, histories padded to its length."""
        rows, length = named["mask"].shape
        if length > self.seq_len:
            raise ValueError(f"history length {length} exceeds the plan's {self.seq_len}; compile with --seq {length}")
        chunks = []
        for start in range(0, rows, self.batch_size):
            part = {name: self._pad(name, value[start:start + self.batch_size]) for name, value in named.items()
                    if name in self.program_inputs}
            out = self.program(part)
            count = min(self.batch_size, rows - start)
            chunks.append({name: value.reshape(-1, *self.output_shapes[name][1:])[:count] for name, value in out.items()})
        if not chunks:
            return {name: np.zeros((0, *shape[1:]), np.float32) for name, shape in self.output_shapes.items()}
        return {name: np.concatenate([chunk[name] for chunk in chunks]) for name in chunks[0]}

    @property
    def program_inputs(self) -> set[str]:
        return {name for name, _ in self.program.inputs}

    def _pad(self, name: str, value: np.ndarray) -> np.ndarray:
        value = np.asarray(value, np.float32)
        rows = 0 if self.plan["symbolic_batch"] else self.batch_size - value.shape[0]
        pads = [(0, rows)] + [(0, 0)] * (value.ndim - 1)
        if name in SEQUENCE_INPUTS or name.startswith("tokens."):
            pads[1] = (0, self.seq_len - value.shape[1])
        return np.pad(value, pads) if any(after for _, after in pads) else value

    def __call__(self, batch: Batch) -> ModelOutput:
        if batch.mask.shape[1] > self.seq_len and self.fallback is not None:
            warnings.warn(f"history length {batch.mask.shape[1]} exceeds the compiled plan's {self.seq_len}; "
                          "running this batch in PyTorch", stacklevel=2)
            was_training = self.fallback.training
            self.fallback.eval()
            try:
                with torch.no_grad():
                    return self.fallback(batch)
            finally:
                self.fallback.train(was_training)
        named = {name: tensor.detach().cpu().float().numpy() for name, tensor in batch_tensors(batch, self.features).items()}
        out = self.run_arrays(named)
        fields = {name: torch.from_numpy(out[name]) if name in out else None
                  for name in ("user_embedding", "item_query", "act_logits", "value_pred")}
        return ModelOutput(**fields)


# ---------------------------------------------------------------------------------------------
# Compile, verify, time


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


def verify(result: CompileResult, model: LumosModel, seeds: tuple[int, ...] = (1, 2)) -> float:
    """Largest output difference against eager PyTorch on random batches, at the plan's shape and
    at a smaller, padded one; raises VerificationError beyond tolerance."""
    B, T = result.compiled.batch_size, result.compiled.seq_len
    shapes = [(B, T), (max(1, min(B - 1, 3)), max(1, T - 3))]
    worst = 0.0
    was_training = model.training
    model.eval()
    try:
        for seed in seeds:
            for rows, length in shapes:
                batch = synthetic_batch(model.features, rows, length, seed=seed)
                with torch.no_grad():
                    expected = model(batch)
                got = result.compiled(batch)
                for name in output_names(model):
                    want, have = getattr(expected, name).numpy(), getattr(got, name).numpy()
                    if want.shape != have.shape:
                        raise VerificationError(f"{name}: compiled shape {have.shape}, torch {want.shape}")
                    error = float(np.max(np.abs(want - have))) if want.size else 0.0
                    worst = max(worst, error)
                    if not np.allclose(have, want, atol=ATOL, rtol=RTOL):
                        raise VerificationError(
                            f"{name} differs from PyTorch by up to {error:.3g} (tolerance {ATOL} + {RTOL}·|x|) at batch "
                            f"{rows}, sequence {length}; the plan was not saved")
    finally:
        model.train(was_training)
    result.max_error = worst
    return worst


def time_forward(result: CompileResult, model: LumosModel, repeats: int = 5) -> tuple[float, float]:
    """Median milliseconds per forward at the plan's shape: (torch eager, compiled)."""
    batch = synthetic_batch(model.features, result.compiled.batch_size, result.compiled.seq_len, seed=3)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            eager = median_ms(lambda: model(batch), repeats)
        compiled = median_ms(lambda: result.compiled(batch), repeats)
    finally:
        model.train(was_training)
    result.eager_ms, result.compiled_ms = eager, compiled
    return eager, compiled


def median_ms(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------
# Plans


def make_plan(compilation: Compilation, model: LumosModel, batch_size: int, seq_len: int, target: str) -> dict:
    graph, buffers = compilation.graph, compilation.buffers
    tensors = []
    for name in tensor_names(graph):
        value = graph.tensors[name]
        entry = {"name": name, "shape": list(value.shape)}
        if name.startswith(LITERAL_PREFIX):
            entry["data"] = base64.b64encode(np.ascontiguousarray(value, np.float32).tobytes()).decode()
        tensors.append(entry)
    return {
        "format": PLAN_FORMAT,
        "target": target,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "symbolic_batch": graph.batch is not None,
        "model_fingerprint": model_fingerprint(model),
        "inputs": [{"name": name, "shape": list(node.shape)} for name, node in graph.inputs.items()],
        "outputs": [{"name": name, "node_shape": list(node.shape), "shape": list(graph.output_shapes[name])}
                    for name, node in graph.outputs.items()],
        "tensors": tensors,
        "kernels": [{"name": k.name, "node": k.node.id, "kind": k.kind, "shape": list(k.node.shape),
                     "ops": len({id(n) for n in k.fused}), "reads": [n.id for n in k.reads], "origin": k.node.origin}
                    for k in compilation.kernels],
        "launch_order": [k.name for k in compilation.kernels],
        "buffers": [{"node": b.node.id, "offset": b.offset, "bytes": b.bytes, "live": [b.first, b.last]}
                    for b in sorted(buffers.buffers.values(), key=lambda b: b.first)],
        "arena_bytes": buffers.arena_bytes,
        "stats": compilation.stats(),
        "source_sha256": hashlib.sha256(compilation.source.encode()).hexdigest(),
        "cc": compilation.options.cc,
        "cflags": list(compilation.options.cflags),
    }


def write_plan(folder: Path, result: CompileResult) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SOURCE_FILE).write_text(result.compilation.source)
    (folder / PLAN_FILE).write_text(json.dumps(result.plan, indent=1))
    return folder


def program_from_plan(folder: Path, model: LumosModel, cache: KernelCache,
                      local: CompileSettings | None = None) -> CompiledModel | None:
    """A stored plan built (through the cache) and bound to `model`'s weights; None if it does not fit.

    The library is built with this host's compiler and flags (`local`), never with the `cc` and
    `cflags` recorded in the plan: a plan is data from elsewhere, and its flags (`-march=native`
    of the compiling host, or any command a plan could name) must not decide what runs here.
    Unset, `local` is the default CompileSettings.
    """
    local = local or CompileSettings()
    plan = json.loads((folder / PLAN_FILE).read_text())
    source = (folder / SOURCE_FILE).read_text()
    if plan.get("format") != PLAN_FORMAT or plan.get("model_fingerprint") != model_fingerprint(model):
        return None
    if hashlib.sha256(source.encode()).hexdigest() != plan["source_sha256"]:
        raise LumosError(f"{folder / SOURCE_FILE} does not match its plan (sha256); recompile with lumos compile")
    weights = model_tensors(model)
    tensors = []
    for entry in plan["tensors"]:
        if "data" in entry:
            value = np.frombuffer(base64.b64decode(entry["data"]), np.float32).reshape(entry["shape"])
        else:
            name = entry["name"].removesuffix(TRANSPOSED)
            weight = weights[name].detach().cpu().float()
            value = (weight.T if entry["name"].endswith(TRANSPOSED) else weight).contiguous().numpy()
            if list(value.shape) != entry["shape"]:
                return None
        tensors.append(value)
    build = cache.build(source, local.cc, tuple(local.cflags))
    program = NativeProgram(
        build.library,
        [(item["name"], tuple(item["shape"])) for item in plan["inputs"]],
        [(item["name"], tuple(item["node_shape"])) for item in plan["outputs"]],
        tensors,
        plan["arena_bytes"],
        symbolic_batch=plan["symbolic_batch"],
    )
    return CompiledModel(program, plan, model.features, fallback=model)


def store_plan(workspace: Workspace, run_id: str, result: CompileResult) -> str:
    """Log the plan as artifacts of the training run; returns the artifact path."""
    from lumos.core.runs import COMPILE_TAG_PREFIX
    from lumos.core.tracking import tracking_client

    target = result.plan["target"]
    client = tracking_client(workspace)
    with tempfile.TemporaryDirectory(prefix="lumos-plan-") as scratch:
        folder = write_plan(Path(scratch) / "plan", result)
        client.log_artifacts(run_id, str(folder), artifact_dir(target))
    client.set_tag(run_id, f"{COMPILE_TAG_PREFIX}{target}",
                   f"batch={result.plan['batch_size']} seq={result.plan['seq_len']} kernels={len(result.plan['kernels'])}")
    return artifact_dir(target)


def load_compiled(workspace: Workspace, run_id: str, model: LumosModel, target: str = "cpu") -> CompiledModel | None:
    """The stored, verified plan for this training run (artifact of the run) built into a runnable
    model, or None when no plan exists or the stored plan was made for a different model."""
    import mlflow

    from lumos.core.runs import COMPILE_TAG_PREFIX
    from lumos.core.tracking import tracking_client

    if target not in TARGETS:
        return None
    try:
        run = tracking_client(workspace).get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None
    if f"{COMPILE_TAG_PREFIX}{target}" not in run.data.tags:
        return None
    with tempfile.TemporaryDirectory(prefix="lumos-plan-") as scratch:
        try:
            folder = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_dir(target),
                                                              dst_path=scratch, tracking_uri=workspace.mlflow_tracking_uri))
        except (mlflow.exceptions.MlflowException, OSError):
            return None
        if not (folder / PLAN_FILE).is_file():
            return None
        # The library comes from the kernel cache, so the downloaded files are not needed afterwards.
        return program_from_plan(folder, model, KernelCache.for_workspace(workspace, target), workspace.settings.compile)


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
    from lumos.core.runs import download_checkpoint
    from lumos.train.checkpoint import load_model

    check_target(target)
    settings = workspace.settings.compile
    options = options or Options(cc=settings.cc, cflags=tuple(settings.cflags), search_budget_s=search_budget_s)
    model, _ = load_model(download_checkpoint(workspace, run_id, "--run"))
    model.eval()
    seq_len = seq_len or model.features.max_len
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


def clear_cache(workspace: Workspace, target: str = "cpu") -> int:
    return KernelCache.for_workspace(workspace, target).clear()
