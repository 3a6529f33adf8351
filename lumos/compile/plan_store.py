"""Plans on disk and on the training run: written, logged to MLflow, loaded and built again.

A *plan* is everything needed to run a compiled model again without tracing it: the generated
source, the inputs, outputs and constant tensors in the program's order, the (batch, sequence)
shape it was built for, and what its target adds (C: the buffer plan, the launch order, the
compiler; CUDA: the launches, the architecture and NVRTC). It is stored as the artifacts
`compile/<target>/seq-<n>/plan.json` and the source (`library.c`, `kernels.cu`) of the training run
(registered model versions point at their run), one folder per history length compiled: a run may
hold plans at several lengths, and each batch runs on the shortest that holds it (`PlansByLength`).
Only the C target's plans are loaded back yet (`Target.stored`). Weights
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

import numpy as np
import torch

from lumos.compile.compilation import Compilation, Options
from lumos.compile.compiled_model import CompiledModel, PlansByLength
from lumos.compile.ir.graph import LITERAL_PREFIX
from lumos.compile.render.c import tensor_names
from lumos.compile.result import CompileResult
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.schedule.horizontal import weight_value
from lumos.compile.target import CPU, TARGETS, target_named
from lumos.core.errors import LumosError
from lumos.core.faults import fault_point
from lumos.core.settings import CompileSettings
from lumos.core.workspace import Workspace
from lumos.train.model import LumosModel

PLAN_FILE = "plan.json"
PLAN_FORMAT = 1  # bump when the plan fields or the driver signature (runtime.py) change

SEQ_FOLDER = "seq-"
TAG_LENGTHS = "seq="


def artifact_dir(target: str, seq_len: int | None = None) -> str:
    """compile/<target>, or within it the folder of the plan built for histories of `seq_len`."""
    return f"compile/{target}" if seq_len is None else f"compile/{target}/{SEQ_FOLDER}{seq_len}"


def model_fingerprint(model: LumosModel) -> str:
    described = {"config": dataclasses.asdict(model.config), "features": dataclasses.asdict(model.features)}
    return "sha256:" + hashlib.sha256(json.dumps(described, sort_keys=True, default=list).encode()).hexdigest()


def model_tensors(model: LumosModel) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def make_plan(compilation: Compilation, model: LumosModel, batch_size: int, seq_len: int) -> dict:
    graph = compilation.graph
    tensors = []
    for name in tensor_names(graph):
        value = graph.tensors[name]
        entry = {"name": name, "shape": list(value.shape)}
        if name.startswith(LITERAL_PREFIX):
            entry["data"] = base64.b64encode(np.ascontiguousarray(value, np.float32).tobytes()).decode()
        tensors.append(entry)
    return {
        "format": PLAN_FORMAT,
        "target": compilation.target,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "symbolic_batch": graph.batch is not None,
        "model_fingerprint": model_fingerprint(model),
        "inputs": [{"name": name, "shape": list(node.shape)} for name, node in graph.inputs.items()],
        "outputs": [{"name": name, "node_shape": list(node.shape), "shape": list(graph.output_shapes[name])}
                    for name, node in graph.outputs.items()],
        "tensors": tensors,
        "arena_bytes": compilation.buffers.arena_bytes,
        "stats": compilation.stats(),
        "source_sha256": hashlib.sha256(compilation.source.encode()).hexdigest(),
        **TARGETS[compilation.target].plan_fields(compilation),
    }


def write_plan(folder: Path, result: CompileResult) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / result.target.source_file).write_text(result.compilation.source)
    (folder / PLAN_FILE).write_text(json.dumps(result.plan, indent=1))
    return folder


def program_from_plan(folder: Path, model: LumosModel, cache: KernelCache,
                      local: CompileSettings | None = None) -> CompiledModel | None:
    """A stored C plan built (through the cache) and bound to `model`'s weights; None if it does not fit.

    The library is built with this host's compiler and flags (`local`), never with the `cc` and
    `cflags` recorded in the plan: a plan is data from elsewhere, and its flags (`-march=native`
    of the compiling host, or any command a plan could name) must not decide what runs here.
    Unset, `local` is the default CompileSettings.
    """
    local = local or CompileSettings()
    plan = json.loads((folder / PLAN_FILE).read_text())
    source = (folder / CPU.source_file).read_text()
    if plan.get("format") != PLAN_FORMAT or plan.get("model_fingerprint") != model_fingerprint(model):
        return None
    if hashlib.sha256(source.encode()).hexdigest() != plan["source_sha256"]:
        raise LumosError(f"{folder / CPU.source_file} does not match its plan (sha256); recompile with lumos compile")
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
    build = cache.build(source, CPU.toolchain(Options(cc=local.cc, cflags=tuple(local.cflags))))
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
    destination = artifact_dir(target, seq_len)
    with tempfile.TemporaryDirectory(prefix="lumos-plan-") as scratch:
        folder = write_plan(Path(scratch) / "plan", result)
        # One file at a time, the plan last, then the tag: an upload killed anywhere leaves a
        # folder the tag does not name, and load_compiled reads only the folders it names.
        client.log_artifact(run_id, str(folder / result.target.source_file), destination)
        fault_point("compile.upload")  # test hook: lumos.core.faults
        client.log_artifact(run_id, str(folder / PLAN_FILE), destination)
    tag = f"{COMPILE_TAG_PREFIX}{target}"
    stored = sorted({*tagged_lengths(client.get_run(run_id).data.tags.get(tag)), seq_len})
    client.set_tag(run_id, tag, f"{TAG_LENGTHS}{','.join(map(str, stored))}")
    return destination


def tagged_lengths(tag: str | None) -> list[int]:
    """The history lengths whose plans a run's compile tag names (`seq=6,12`): uploaded whole."""
    if not tag or not tag.startswith(TAG_LENGTHS):
        return []
    return [int(length) for length in tag.removeprefix(TAG_LENGTHS).split(",") if length]


def load_compiled(workspace: Workspace, run_id: str, model: LumosModel, target: str = "cpu") -> PlansByLength | None:
    """The stored, verified plans of this training run (artifacts of the run, one per history length)
    built into a runnable model, or None when no plan exists or the stored plans were made for a
    different model."""
    import mlflow

    from lumos.core.runs import COMPILE_TAG_PREFIX
    from lumos.core.tracking import tracking_client

    if not target_named(target).stored:
        return None
    try:
        run = tracking_client(workspace).get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None
    lengths = tagged_lengths(run.data.tags.get(f"{COMPILE_TAG_PREFIX}{target}"))
    if not lengths:
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
                 for plan in (folder / f"{SEQ_FOLDER}{length}" / PLAN_FILE for length in lengths)]
        plans = [plan for plan in plans if plan is not None]
        return PlansByLength(plans) if plans else None
