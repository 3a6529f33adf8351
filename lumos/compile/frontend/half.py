"""Half precision: a bfloat16 or float16 module stored in its own dtype, computed in float32.

The IR computes in float32 only, and it need not do more: widening a half value is exact. So a
half-precision module is lowered from its float32 copy (same graph, same values), and the program
keeps at its boundary what the module has there (ir/graph.py: Storage): its half weights are held
in their dtype (half the bytes of the float32 copy), its half inputs are read and its half outputs
written in their dtype. The kernels do the conversions where they load and store those buffers
(render/cstyle.py, the headers' lumos_from_<dtype> / lumos_to_<dtype>): bfloat16 widened by
shifting its bits into a float's top half, float16 by integer work on its bits (F16C's
vcvtph2ps for vectors), and stores rounded to nearest even. Arithmetic and accumulation are float32 throughout, and every
intermediate is a float32 buffer: nothing is rounded between ops.

No cast op in the IR: converting loads and stores in the kernels is what keeps the weights half in
memory and in the loops that read them (a cast op at the boundary would widen every weight into a
float32 buffer at each call, or once, which is the float32 copy again). A `.to(dtype)` inside
the model stays a no-op, like every dtype change.

What the program computes is the float32 copy's result rounded once, at its half outputs:
verified against the float32 copy within that rounding (ir/graph.py: ROUNDING). Eager in half
precision rounds after every op, so the two differ by half precision's own error: `TOLERANCE` per
dtype is what the tests hold them to.

A partitioned module (part eager, part compiled) is exported and cut as it is, in its dtype: its
eager ops run in half precision, as in eager, and each partition is a half module of its own,
compiled the same way (export.compile_module). The old way, the float32 copy called through
`HalfPrecision` (half inputs widened and outputs narrowed by PyTorch at each call, weights held in
float32), remains for a target that does not store half buffers itself (`native_half`).

A half kernel's C names its half buffers, so its search cache key (search.climb.kernel_key) is
apart from its float32 twin's: each is searched for its own loads and stores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from lumos.compile.ir.graph import Graph, Storage
from lumos.compile.target import CPU, CUDA, Target
from lumos.core.errors import UsageError

HALF = (torch.bfloat16, torch.float16)

TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}
"""atol = rtol against eager in the same dtype (bfloat16 keeps 8 significant bits: 3.9e-3 per
rounding, float16 11 bits: 4.9e-4; a few layers of rounding add up to several of them)."""


def half_dtype(module: nn.Module, example_inputs: Sequence) -> torch.dtype | None:
    """The half dtype the module's floating weights or inputs hold, if any (a mix of two half
    dtypes is refused)."""
    tensors = [*module.parameters(), *module.buffers(), *(x for x in example_inputs if isinstance(x, torch.Tensor))]
    found = {tensor.dtype for tensor in tensors if tensor.dtype in HALF}
    if len(found) > 1:
        raise UsageError("the module mixes bfloat16 and float16; compile it in one of them")
    return found.pop() if found else None


def native_half(target: Target) -> bool:
    """Whether the target stores half buffers itself (else the module runs as its float32 copy):
    both do, the C target and the CUDA one (its kernels built by NVRTC and run on the CPU in the
    tests; on a GPU by the gpu-marked tests)."""
    return target in (CPU, CUDA)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def half_storage(module: nn.Module, example_inputs: Sequence, output_dtypes: list[torch.dtype | None],
                 graph: Graph, used: list[int]) -> Storage:
    """What the program lowered from `module`'s float32 copy stores half: each weight the module
    holds in a half dtype (by its name in the graph), each input given in one (`used`: the
    argument each graph input is), each output eager returns in one."""
    held = {name: tensor.dtype for name, tensor in [*module.named_parameters(), *module.named_buffers()]}
    return Storage(
        inputs={name: dtype_name(example_inputs[index].dtype) for index, name in zip(used, graph.inputs, strict=True)
                if example_inputs[index].dtype in HALF},
        outputs={f"output{index}": dtype_name(dtype) for index, dtype in enumerate(output_dtypes)
                 if dtype in HALF and f"output{index}" in graph.outputs},
        tensors={name: dtype_name(held[name]) for name in graph.tensors if held.get(name) in HALF},
    )


def release_float32_weights(graph: Graph) -> None:
    """Drop the float32 values of the weights the loaded program holds half (the compile needed
    them; keeping them would hold the float32 copy after all)."""
    graph.tensors = {name: value for name, value in graph.tensors.items() if name not in graph.storage.tensors}


def stored_array(value: torch.Tensor) -> np.ndarray:
    """A tensor as the C program takes it: a half one in its dtype (bfloat16 as its bits, which
    numpy cannot name), any other as float32."""
    value = value.detach().cpu()
    if value.dtype is torch.bfloat16:
        return value.contiguous().view(torch.int16).numpy().view(np.uint16)
    if value.dtype is torch.float16:
        return value.contiguous().numpy()
    return value.to(torch.float32).numpy()


def from_stored(array: np.ndarray) -> torch.Tensor:
    """A program's output as a tensor (bfloat16 bits back to bfloat16), sharing its memory."""
    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def widened(value):
    """A half tensor as float32; anything else as it is."""
    return value.float() if isinstance(value, torch.Tensor) and value.dtype in HALF else value


def float32_copy(module: nn.Module) -> nn.Module:
    """A copy of the module whose half weights and buffers are float32 (other dtypes kept)."""
    twin = copy.deepcopy(module)
    for tensor in (*twin.parameters(), *twin.buffers()):
        if tensor.dtype in HALF:
            tensor.data = tensor.data.float()
    return twin


class HalfPrecision:
    """A program compiled from a module's float32 copy, called like the half-precision module:
    half inputs widened, each tensor output returned in the dtype eager gave it (the old way, where
    half storage is not: a partitioned module)."""

    def __init__(self, compiled: Callable, output_dtypes: list[torch.dtype | None]):
        self.compiled, self.output_dtypes = compiled, output_dtypes

    def __call__(self, *inputs):
        flat, spec = pytree.tree_flatten(self.compiled(*(widened(value) for value in inputs)))
        return pytree.tree_unflatten([value.to(dtype) if dtype is not None else value
                                      for value, dtype in zip(flat, self.output_dtypes, strict=True)], spec)

    def __getattr__(self, name: str):  # the compiled program's attributes (batch, max_error, eager_ops ...)
        if name == "compiled":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)


def eager_output_dtypes(module: nn.Module, example_inputs: Sequence) -> list[torch.dtype | None]:
    """The dtype of each tensor in the module's flattened output (None for a non-tensor), from one
    eager run on the example."""
    with torch.no_grad():
        leaves = pytree.tree_leaves(module(*example_inputs))
    return [leaf.dtype if isinstance(leaf, torch.Tensor) else None for leaf in leaves]
