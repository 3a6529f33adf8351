"""`lumos compile --target cuda`: build a run's model into CUDA kernels, then verify and time it on the GPU.

Without a GPU it goes as far as it can — trace, fuse, render every kernel and compile it with
NVRTC (into the kernel cache, for sm_80 unless [compile] says otherwise) — and then stops with
NoGpuError (exit 1: a runtime failure, not bad input; the same command succeeds where a GPU is,
and no plan is stored, since only a GPU can verify one). On a GPU: the kernels are built for its
architecture, run by runtime/cuda.py, checked against the PyTorch model on the same GPU in fp32
(1e-4), timed with CUDA events, and the plan (kernels.cu, plan.json) is stored as the artifacts
compile/cuda of the training run.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lumos.compile.cuda_program import DEFAULT_ARCH, CudaCompilation, CudaOptions, compile_cuda_graph
from lumos.compile.frontend.lumos_model import batch_tensors, lower_model, output_names
from lumos.compile.plan_store import artifact_dir, model_fingerprint, model_tensors
from lumos.compile.render.c import tensor_names
from lumos.compile.runtime.cuda import GpuProgram, gpu_arch
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.runtime.nvrtc import FLAGS, nvrtc_version
from lumos.compile.schedule.layout import TRANSPOSED
from lumos.compile.verify import ATOL, RTOL, VerificationError
from lumos.core.errors import LumosError
from lumos.core.workspace import Workspace
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel

PLAN_FILE = "plan.json"
SOURCE_FILE = "kernels.cu"


class NoGpuError(LumosError):
    """The CUDA kernels were built, but there is no GPU to verify and time them on."""


@dataclass
class CudaResult:
    compilation: CudaCompilation
    program: GpuProgram | None
    seconds: dict[str, float]


def compile_cuda_model(model: LumosModel, batch_size: int, seq_len: int, cache: KernelCache,
                       arch: str | None = None, report=lambda _: None) -> CudaResult:
    """Trace, fuse, render and build `model` for the GPU here (or `arch`); binds it to the GPU
    when there is one."""
    started = time.perf_counter()
    here = gpu_arch()
    arch = arch or here or DEFAULT_ARCH
    report(f"tracing the model at batch {batch_size}, sequence {seq_len}")
    graph = lower_model(model, batch_size, seq_len, symbolic_batch=True)
    traced = time.perf_counter()
    report(f"{len(graph.nodes)} IR nodes; fusing, rendering CUDA and compiling it with NVRTC {nvrtc_version()} for {arch}")
    compilation = compile_cuda_graph(graph, cache, CudaOptions(arch))
    program = None
    if here is not None:
        program = GpuProgram(compilation.build.library.read_bytes(), compilation.program.launches,
                             [(name, node.shape) for name, node in graph.inputs.items()],
                             [(name, node.shape) for name, node in graph.outputs.items()],
                             [graph.tensors[name] for name in tensor_names(graph)],
                             compilation.buffers.arena_bytes, graph.batch is not None)
    seconds = {"trace": traced - started, **compilation.timings, "total": time.perf_counter() - started}
    return CudaResult(compilation, program, seconds)


def gpu_outputs(result: CudaResult, model: LumosModel, batch) -> dict[str, torch.Tensor]:
    """The compiled program's outputs for a batch, shaped as the model's."""
    graph = result.compilation.graph
    named = {name: tensor.to("cuda", torch.float32) for name, tensor in batch_tensors(batch, model.features).items()
             if name in graph.inputs}
    out = result.program(named)
    rows = next(iter(named.values())).shape[0]
    return {name: value.reshape(rows, *graph.output_shapes[name][1:]) for name, value in out.items()}


def verify_gpu(result: CudaResult, model: LumosModel, seeds: tuple[int, ...] = (1, 2)) -> float:
    """Largest difference from the PyTorch model on the same GPU (fp32) at the plan's shape and a
    smaller one; raises VerificationError beyond 1e-4."""
    graph = result.compilation.graph
    rows_full, length = next(iter(graph.inputs.values())).shape[:2]
    model = model.to("cuda").eval()
    worst = 0.0
    for seed in seeds:
        for rows in (rows_full, max(1, min(rows_full - 1, 3))):
            batch = synthetic_batch(model.features, rows, length, seed=seed).to("cuda")
            with torch.no_grad():
                expected = model(batch)
            got = gpu_outputs(result, model, batch)
            for name in output_names(model):
                want, have = getattr(expected, name).float(), got[name]
                error = float((want - have).abs().max()) if want.numel() else 0.0
                worst = max(worst, error)
                if not torch.allclose(have, want, atol=ATOL, rtol=RTOL):
                    raise VerificationError(f"{name} differs from PyTorch on the GPU by up to {error:.3g} at batch {rows}; "
                                            "the plan was not saved")
    return worst


def time_gpu(result: CudaResult, model: LumosModel, repeats: int = 20) -> tuple[float, float]:
    """Median ms per forward on the GPU at the plan's shape, by CUDA events: (torch eager, Lumos CUDA)."""
    graph = result.compilation.graph
    rows, length = next(iter(graph.inputs.values())).shape[:2]
    batch = synthetic_batch(model.features, rows, length, seed=3).to("cuda")
    named = {name: tensor.to("cuda", torch.float32) for name, tensor in batch_tensors(batch, model.features).items()
             if name in graph.inputs}
    model = model.to("cuda").eval()
    times = []
    with torch.no_grad():
        model(batch)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times)), result.program.time_ms(named, repeats)


def cuda_plan(result: CudaResult, model: LumosModel, batch_size: int, seq_len: int) -> dict:
    compilation = result.compilation
    graph = compilation.graph
    weights = model_tensors(model)
    return {
        "format": 1, "target": "cuda", "arch": compilation.options.arch, "nvrtc": nvrtc_version(), "flags": list(FLAGS),
        "batch_size": batch_size, "seq_len": seq_len, "symbolic_batch": graph.batch is not None,
        "model_fingerprint": model_fingerprint(model),
        "inputs": [{"name": name, "shape": list(node.shape)} for name, node in graph.inputs.items()],
        "outputs": [{"name": name, "node_shape": list(node.shape), "shape": list(graph.output_shapes[name])}
                    for name, node in graph.outputs.items()],
        "tensors": [{"name": name, "shape": list(graph.tensors[name].shape), "weight": name.removesuffix(TRANSPOSED) in weights}
                    for name in tensor_names(graph)],
        "launches": [{"name": launch.name, "kind": launch.kind, "block": list(launch.block), "batched": launch.batched,
                      "mult": launch.mult, "per": launch.per, "groups": launch.groups,
                      "buffers": [list(where) for where in launch.buffers]}
                     for launch in compilation.program.launches],
        "arena_bytes": compilation.buffers.arena_bytes,
        "stats": compilation.stats(),
        "source_sha256": hashlib.sha256(compilation.program.source.encode()).hexdigest(),
    }


def store_cuda_plan(workspace: Workspace, run_id: str, result: CudaResult, plan: dict) -> str:
    from lumos.core.runs import COMPILE_TAG_PREFIX
    from lumos.core.tracking import tracking_client

    client = tracking_client(workspace)
    with tempfile.TemporaryDirectory(prefix="lumos-plan-") as scratch:
        folder = Path(scratch) / "plan"
        folder.mkdir()
        (folder / SOURCE_FILE).write_text(result.compilation.program.source)
        (folder / PLAN_FILE).write_text(json.dumps(plan, indent=1))
        client.log_artifacts(run_id, str(folder), artifact_dir("cuda"))
    client.set_tag(run_id, f"{COMPILE_TAG_PREFIX}cuda", f"batch={plan['batch_size']} seq={plan['seq_len']} "
                   f"kernels={len(plan['launches'])} arch={plan['arch']}")
    return artifact_dir("cuda")


def no_gpu_message(result: CudaResult, cache: KernelCache) -> str:
    compilation = result.compilation
    return (f"built {len(compilation.program.launches)} CUDA kernels for {compilation.options.arch} with NVRTC "
            f"{nvrtc_version()} (kernel cache {compilation.build.library.parent}), but this machine has no CUDA GPU "
            "to verify and time them on, so no plan was stored; run `lumos compile --target cuda` where "
            "`lumos doctor` shows a GPU")
