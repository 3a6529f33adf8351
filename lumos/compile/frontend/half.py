"""Half precision: a bfloat16 or float16 module is compiled as its float32 copy.

The IR has one dtype, float32, and C has no native bfloat16 arithmetic. So a half-precision
module is computed in float32 from end to end: its weights are widened once, when compiled (held
in float32: twice the bytes of the module's own), its half inputs are widened at each call and
its outputs narrowed back to the dtype eager returns, by PyTorch at the program's boundary
(`torch.Tensor.float` / `.to`: exact widening, round-to-nearest-even narrowing). Nothing in the
kernels reads or writes a half: no bf16 storage, no AVX-512 BF16 or CUDA half arithmetic.

What the program computes is the float32 copy's result, checked against the float32 copy at 1e-4
like any compile (`compile_module`'s verification). Eager in half precision rounds after every op,
so the two differ by half precision's own error: `TOLERANCE` per dtype is what the tests hold them to.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils import _pytree as pytree

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
    half inputs widened, each tensor output returned in the dtype eager gave it."""

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
