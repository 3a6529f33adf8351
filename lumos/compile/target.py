"""A compile target is a record: its passes, how its source is built, how the result is loaded
and run, and how closely it must match PyTorch. Two exist: CPU (C, gcc and OpenMP, called through
ctypes) and CUDA (CUDA C, NVRTC, launched as one CUDA graph).

The driver (program.py, engine.py, verify.py, plan_store.py) holds no per-target code: it runs a
target's passes, loads with its loader, verifies at its tolerance and stores its plan fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from lumos.compile import passes
from lumos.compile.compilation import Compilation, Options
from lumos.compile.compiled_model import CompiledModel, GpuModel
from lumos.compile.passes import Pass
from lumos.compile.render.c import tensor_names
from lumos.compile.runtime.cuda import GpuProgram, gpu_arch
from lumos.compile.runtime.kernel_cache import SOURCE, Toolchain
from lumos.compile.runtime.native import NativeProgram
from lumos.compile.runtime.nvrtc import FLAGS, nvrtc_version
from lumos.compile.runtime.nvrtc import SOURCE_FILE as CUDA_SOURCE
from lumos.core.errors import UsageError

ATOL = RTOL = 1e-4
"""Both targets compute in fp32 with IEEE math (no fast-math), so both verify at 1e-4."""


@dataclass(frozen=True)
class Target:
    name: str
    """`--target`, the kernel cache's folder and the plan's artifact folder: compile/<name>."""
    device: str
    """Where its programs run and the PyTorch model is checked against them (a torch device)."""
    passes: tuple[tuple[str, Pass], ...]
    """From the traced graph to a built program, in order (passes.py)."""
    toolchain: Callable[[Options], Toolchain]
    """What builds the rendered source, and so what the kernel cache's key holds besides it."""
    load: Callable[[Compilation, Mapping[str, np.ndarray] | None], object]
    """The runtime loader: the built program bound to the graph's constant tensors (or the given ones)."""
    model: Callable[[object, dict, object], object]
    """A loaded program, its plan and the feature spec → a callable like `LumosModel.forward`."""
    runs_here: Callable[[], bool]
    """Whether this machine can run (and so verify) what the target builds."""
    plan_fields: Callable[[Compilation], dict]
    """What the target's plan holds besides the fields every plan has (plan_store.make_plan)."""
    source_file: str
    """The plan's source artifact."""
    atol: float = ATOL
    rtol: float = RTOL
    stored: bool = False
    """Whether its stored plans are loaded back for inference (`lumos infer --engine compiled`)."""


def _load_native(compilation: Compilation, tensors: Mapping[str, np.ndarray] | None = None) -> NativeProgram:
    graph = compilation.graph
    source = tensors if tensors is not None else graph.tensors
    names = tensor_names(graph)
    return NativeProgram(compilation.build.library, *_signature(compilation), [source[name] for name in names],
                         compilation.buffers.arena_bytes, symbolic_batch=graph.batch is not None,
                         storage=graph.storage, tensor_names=names)


def _load_gpu(compilation: Compilation, tensors: Mapping[str, np.ndarray] | None = None) -> GpuProgram:
    graph = compilation.graph
    source = tensors if tensors is not None else graph.tensors
    names = tensor_names(graph)
    return GpuProgram(compilation.build.library.read_bytes(), compilation.cuda.launches, *_signature(compilation),
                      [source[name] for name in names], compilation.buffers.arena_bytes,
                      graph.batch is not None, storage=graph.storage, tensor_names=names)


def _signature(compilation: Compilation) -> tuple[list, list]:
    """The program's (name, shape) inputs and outputs, in the order its entry point takes them."""
    graph = compilation.graph
    return ([(name, node.shape) for name, node in graph.inputs.items()],
            [(name, node.shape) for name, node in graph.outputs.items()])


def _c_plan(compilation: Compilation) -> dict:
    return {
        "kernels": [{"name": k.name, "node": k.node.id, "kind": k.kind, "shape": list(k.node.shape),
                     "ops": len(k.unique_fused), "reads": [n.id for n in k.reads], "origin": k.node.origin}
                    for k in compilation.kernels],
        "launch_order": [k.name for k in compilation.kernels],
        "buffers": [{"node": b.node.id, "offset": b.offset, "bytes": b.bytes, "live": [b.first, b.last]}
                    for b in sorted(compilation.buffers.buffers.values(), key=lambda b: b.first)],
        "cc": compilation.options.cc,
        "cflags": list(compilation.options.cflags),
    }


def _cuda_plan(compilation: Compilation) -> dict:
    return {
        "arch": compilation.options.arch, "nvrtc": nvrtc_version(), "flags": list(FLAGS),
        "launches": [{"name": launch.name, "kind": launch.kind, "block": list(launch.block), "batched": launch.batched,
                      "mult": launch.mult, "per": launch.per, "groups": launch.groups,
                      "buffers": [list(where) for where in launch.buffers]}
                     for launch in compilation.cuda.launches],
    }


def _always() -> bool:
    return True


def _has_gpu() -> bool:
    return gpu_arch() is not None


CPU = Target(
    name="cpu",
    device="cpu",
    passes=(
        ("egraph", passes.rewrite),  # first: layout's copies (x + 0) are what the algebra removes
        ("horizontal", passes.horizontal),
        ("layout", passes.layout),
        ("half_outputs", passes.half_outputs),  # a half output read by other nodes: a copy of its own
        ("schedule", passes.fuse),
        ("programs", passes.programs),  # Options.egraph_fusion: the e-graph's programs, climbed
        ("search", passes.search),
        ("siblings", passes.siblings),  # after the search, which times single-output kernels
        ("plan_buffers", passes.buffers),
        ("render_c", passes.render_c),
        ("build", passes.build_c),
    ),
    toolchain=passes.c_toolchain,
    load=_load_native,
    model=CompiledModel,
    runs_here=_always,
    plan_fields=_c_plan,
    source_file=SOURCE,
    stored=True,
)

CUDA = Target(
    name="cuda",
    device="cuda",
    passes=(
        ("egraph", passes.rewrite),  # the same extracted program as the C target's
        ("layout", passes.layout),
        ("half_outputs", passes.half_outputs),  # a half output read by other nodes: a copy of its own
        ("schedule", passes.fuse),
        ("attention", passes.attention),  # no schedule search yet: it would time kernels on a GPU
        ("products", passes.products),  # a query/key/value projection as one kernel (C: horizontal)
        ("plan_buffers", passes.buffers),
        ("render_cuda", passes.render_cuda),
        ("build", passes.build_cuda),  # NVRTC, through the kernel cache: no GPU needed
    ),
    toolchain=passes.cuda_toolchain,
    load=_load_gpu,
    model=GpuModel,
    runs_here=_has_gpu,
    plan_fields=_cuda_plan,
    source_file=CUDA_SOURCE,
)

TARGETS = {target.name: target for target in (CPU, CUDA)}


def target_named(name: str) -> Target:
    if name not in TARGETS:
        raise UsageError(f"--target {name}: not available; choose from {list(TARGETS)}")
    return TARGETS[name]
