"""Plans on disk and on the training run: written, logged to MLflow, loaded and built again.

A *plan* is everything needed to run a compiled model again without tracing it: the generated C
(kernels and driver), the inputs, outputs and constant tensors in the driver's order, the buffer
plan and the launch order, and the (batch, sequence) shape it was built for. It is stored as the
artifacts `compile/<target>/seq-<n>/plan.json` and `.../library.c` of the training run (registered
model versions point at their run), one folder per history length compiled: a run may hold plans
at several lengths, and each batch runs on the shortest that holds it (`PlansByLength`). Weights
are not copied into it: they are bound from the model when the plan is loaded, and a fingerprint
of the model's config and feature spec makes sure the plan fits the model.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from lumos.compile.compiled_model import CompiledModel, PlansByLength
from lumos.compile.ir.graph import LITERAL_PREFIX
from lumos.compile.program import Compilation
from lumos.compile.render.c import tensor_names
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.schedule.horizontal import weight_value
from lumos.core.errors import LumosError
from lumos.core.settings import CompileSettings
from lumos.core.workspace import Workspace
from lumos.train.model import LumosModel

if TYPE_CHECKING:
    from lumos.compile.engine import CompileResult

PLAN_FILE = "plan.json"
SOURCE_FILE = "library.c"
PLAN_FORMAT = 1  # bump when the plan fields or the driver signature (runtime.py) change
STORED_TARGETS = ("cpu",)
"""Targets whose plans are stored on the run and loaded back (the CUDA plan is not yet: it is
only verified on a GPU, which this code has not run on)."""


SEQ_FOLDER = "seq-"


def artifact_dir(target: str, seq_len: int | None = None) -> str:
    """compile/<target>, or within it the folder of the plan built for histories of `seq_len`."""
    return f"compile/{target}" if seq_len is None else f"compile/{target}/{SEQ_FOLDER}{seq_len}"


def model_fingerprint(model: LumosModel) -> str:
    described = {"config": dataclasses.asdict(model.config), "features": dataclasses.asdict(model.features)}
    return "sha256:" + hashlib.sha256(json.dumps(described, sort_keys=True, default=list).encode()).hexdigest()


def model_tensors(model: LumosModel) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


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
                     "ops": len(k.unique_fused), "reads": [n.id for n in k.reads], "origin": k.node.origin}
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
            value = weight_value(entry["name"], weights)
            if value is None or list(value.shape) != entry["shape"]:
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

    target, seq_len = result.plan["target"], result.plan["seq_len"]
    client = tracking_client(workspace)
    with tempfile.TemporaryDirectory(prefix="lumos-plan-") as scratch:
        folder = write_plan(Path(scratch) / "plan", result)
        client.log_artifacts(run_id, str(folder), artifact_dir(target, seq_len))
    folders = [item.path.rsplit("/", 1)[1] for item in client.list_artifacts(run_id, artifact_dir(target)) if item.is_dir]
    stored = sorted(int(name.removeprefix(SEQ_FOLDER)) for name in folders if name.startswith(SEQ_FOLDER))
    client.set_tag(run_id, f"{COMPILE_TAG_PREFIX}{target}", f"seq={','.join(map(str, stored))}")
    return artifact_dir(target, seq_len)


def load_compiled(workspace: Workspace, run_id: str, model: LumosModel, target: str = "cpu") -> PlansByLength | None:
    """The stored, verified plans of this training run (artifacts of the run, one per history length)
    built into a runnable model, or None when no plan exists or the stored plans were made for a
    different model."""
    import mlflow

    from lumos.core.runs import COMPILE_TAG_PREFIX
    from lumos.core.tracking import tracking_client

    if target not in STORED_TARGETS:
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
        # The libraries come from the kernel cache, so the downloaded files are not needed afterwards.
        cache = KernelCache.for_workspace(workspace, target)
        plans = [program_from_plan(plan.parent, model, cache, workspace.settings.compile)
                 for plan in sorted(folder.glob(f"{SEQ_FOLDER}*/{PLAN_FILE}"))]
        plans = [plan for plan in plans if plan is not None]
        return PlansByLength(plans) if plans else None
