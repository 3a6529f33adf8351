"""A built plan bound to a model's weights, called like `LumosModel.forward` in eval mode: on the
CPU (`CompiledModel`, numpy in and out through ctypes) or on the GPU (`GpuModel`, CUDA tensors)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from lumos.compile.frontend.lumos_model import batch_tensors
from lumos.compile.runtime.cuda import GpuProgram
from lumos.compile.runtime.native import NativeProgram
from lumos.data.contract import Batch, FeatureSpec
from lumos.train.model import LumosModel, ModelOutput

SEQUENCE_INPUTS = ("mask", "numeric")  # and every tokens.* input: (B, T, ...)
OUTPUTS = ("user_embedding", "item_query", "act_logits", "value_pred")


class CompiledModel:
    """A built plan bound to a model's weights; called like `LumosModel.forward` in eval mode.

    Any batch size and any history length up to the plan's. The batch is symbolic (the kernels
    loop over as many rows as given, up to the plan's batch; larger batches run in chunks);
    shorter histories are padded (padded positions are masked out, so outputs are unchanged).
    A plan whose batch could not be made symbolic pads rows too (dummy rows never mix with real ones).
    A batch with longer histories than the plan runs in PyTorch on `fallback` (with a warning)
    when one is given, else raises ValueError. Not thread-safe: calls share one arena.
    """

    pads_histories = True

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
        return ModelOutput(**{name: torch.from_numpy(out[name]) if name in out else None for name in OUTPUTS})


class GpuModel:
    """A CUDA plan bound to a model's weights on the GPU, called like `LumosModel.forward` in eval
    mode on a batch of up to the plan's rows at the plan's history length (no padding yet); the
    outputs stay on the GPU."""

    pads_histories = False

    def __init__(self, program: GpuProgram, plan: dict, features: FeatureSpec):
        self.program, self.plan, self.features = program, plan, features
        self.batch_size, self.seq_len = plan["batch_size"], plan["seq_len"]
        self.output_shapes = {item["name"]: tuple(item["shape"]) for item in plan["outputs"]}

    def inputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The program's named inputs for `batch`, float32 on the GPU."""
        program_inputs = {name for name, _ in self.program.inputs}
        return {name: tensor.to("cuda", torch.float32) for name, tensor in batch_tensors(batch, self.features).items()
                if name in program_inputs}

    def outputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        named = self.inputs(batch)
        out = self.program(named)
        rows = next(iter(named.values())).shape[0]
        return {name: value.reshape(rows, *self.output_shapes[name][1:]) for name, value in out.items()}

    def __call__(self, batch: Batch) -> ModelOutput:
        out = self.outputs(batch)
        return ModelOutput(**{name: out.get(name) for name in OUTPUTS})


class PlansByLength:
    """A model's plans at several history lengths, called like `LumosModel.forward` in eval mode:
    each batch runs on the shortest plan that holds its histories (the longest plan takes longer
    ones, with its fallback). A plan's cost grows with its length whatever the batch holds, so a
    batch of short histories padded to max_len would do several times the work it needs."""

    def __init__(self, plans: list[CompiledModel]):
        if not plans:
            raise ValueError("no plans")
        self.plans = sorted(plans, key=lambda plan: plan.seq_len)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(plan.seq_len for plan in self.plans)

    def plan_for(self, length: int) -> CompiledModel:
        return next((plan for plan in self.plans if plan.seq_len >= length), self.plans[-1])

    def __call__(self, batch: Batch) -> ModelOutput:
        return self.plan_for(batch.mask.shape[1])(batch)
