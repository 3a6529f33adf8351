"""What compiling one model gives: the built program bound to the model, its compilation and
plan, and what verifying and timing it found. Below engine, verify and plan_store, which all
take it, so that imports among them run one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from lumos.compile.compilation import Compilation
from lumos.compile.compiled_model import CompiledModel, GpuModel
from lumos.compile.target import TARGETS, Target


@dataclass
class CompileResult:
    compiled: CompiledModel | GpuModel | None
    """Called like the model; None where this machine cannot run the target (CUDA without a GPU)."""
    compilation: Compilation
    plan: dict
    max_error: float = float("nan")
    eager_ms: float = float("nan")
    compiled_ms: float = float("nan")
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> Target:
        return TARGETS[self.compilation.target]
