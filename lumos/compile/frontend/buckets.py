"""Dynamic sizes without a compile per size: one program per size bucket, inputs padded up to it.

Dynamo hands the backend a graph with symbolic sizes (torch.compile(dynamic=True), or after a
second shape). The compiler's programs have static shapes (a symbolic batch aside), so each new
sequence length used to cost a compile. Here each symbolic size is rounded up to its bucket
(`bucket`): the program is compiled once at the bucket's sizes, a call's tensors are padded up to
them and its outputs sliced back to their real sizes (the graph's symbolic output shapes,
evaluated at the call's sizes).

Padding is with zeros: a padded token is id 0, a padded attention-mask position 0 (masked out,
as a Hugging Face model masks its own padding), a padded feature 0. It is exact only where no
output position the caller keeps reads a padded position, or reads it masked out: a causal model,
a per-position MLP, a model given a mask that is 0 at padding (BERT's attention_mask). A
bidirectional encoder without a mask is not (the padded keys take their share of the softmax). So
each new size's first call is checked against eager on the unpadded inputs; a difference makes the
graph fall back to a program per size (`Buckets.exact`), as before.

The work done is the bucket's: up to twice the real length's (the price of no recompile; a
runtime loop bound in the kernels would not pay it, but the kernel IR has one only for the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sympy
import torch

MIN_BUCKET = 16
"""The smallest bucket of a size other than dim 0: lengths 1 to 16 share one program."""


def bucket(size: int, dim: int, upper: int | None) -> int:
    """The size a program is compiled at for `size`: the declared maximum where there is one
    (`torch._dynamo.mark_dynamic(x, dim, max=...)`: one program for every size), else the next
    power of two, at least MIN_BUCKET except in dim 0 (a batch, usually given at its real size:
    padded rows would be work for nothing)."""
    if upper is not None and size <= upper:
        return upper
    power = 1 << max(size - 1, 0).bit_length()
    return power if dim == 0 else max(power, MIN_BUCKET)


@dataclass
class Buckets:
    """Where a dynamo graph's symbolic sizes are (input dims, size arguments, output dims), and
    what is known of padding it."""

    input_dims: dict[int, list[tuple[int, sympy.Symbol]]]
    """Per input slot, its symbolic dims (dim, symbol)."""
    size_args: dict[int, sympy.Expr]
    """Per size argument's slot, its expression in the symbols."""
    output_dims: list[list[tuple[int, sympy.Symbol]] | None]
    """Per flat output, its symbolic dims (None: not a tensor)."""
    uppers: dict[sympy.Symbol, int] = field(default_factory=dict)
    """Declared maxima (mark_dynamic)."""
    exact: bool = False
    """Padding changed a result, or a program could not be built at the padded sizes: one program per size."""
    checked: set[tuple] = field(default_factory=set)
    """The real sizes whose padded results were compared with eager."""

    @classmethod
    def of(cls, graph: torch.fx.GraphModule) -> Buckets | None:
        """The graph's symbolic sizes, or None where padding cannot serve it: an input dim or an
        output dim that is an expression (a flattened (B·T) dim is not a prefix of its bucket's),
        an output that is no tensor."""
        placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
        input_dims, size_args, uppers = {}, {}, {}
        for slot, node in enumerate(placeholders):
            value = node.meta.get("example_value")
            if isinstance(value, torch.SymInt):
                size_args[slot] = value.node.expr
                _note_upper(value, uppers)
            elif isinstance(value, torch.Tensor):
                dims = _symbolic_dims(value.shape, uppers)
                if dims is None:
                    return None
                if dims:
                    input_dims[slot] = dims
        output = next(node for node in graph.graph.nodes if node.op == "output")
        output_dims = []
        for leaf in torch.utils._pytree.tree_leaves(output.args[0]):
            value = leaf.meta.get("example_value") if isinstance(leaf, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor):
                return None
            dims = _symbolic_dims(value.shape, uppers)
            if dims is None:
                return None
            output_dims.append(dims)
        if not input_dims:
            return None
        symbols = {symbol for dims in input_dims.values() for _, symbol in dims}
        if any(not expr.free_symbols <= symbols for expr in size_args.values()) or \
                any(symbol not in symbols for dims in output_dims for _, symbol in dims):
            return None
        return cls(input_dims, size_args, output_dims, uppers)

    def sizes(self, inputs: Sequence) -> dict[sympy.Symbol, int]:
        """Each symbol's value in a call."""
        return {symbol: int(inputs[slot].shape[dim]) for slot, dims in self.input_dims.items() for dim, symbol in dims}

    def bucketed(self, sizes: dict[sympy.Symbol, int]) -> dict[sympy.Symbol, int]:
        dim_of = {symbol: dim for dims in self.input_dims.values() for dim, symbol in reversed(dims)}
        return {symbol: bucket(size, dim_of[symbol], self.uppers.get(symbol)) for symbol, size in sizes.items()}

    def padded(self, inputs: Sequence, sizes: dict[sympy.Symbol, int]) -> list:
        """The call's arguments at the bucket's `sizes`: tensors padded with zeros at the end of
        each symbolic dim, size arguments evaluated."""
        args = list(inputs)
        for slot, dims in self.input_dims.items():
            tensor = inputs[slot]
            for dim, symbol in dims:
                extra = sizes[symbol] - tensor.shape[dim]
                if extra > 0:
                    zeros = tensor.new_zeros((*tensor.shape[:dim], extra, *tensor.shape[dim + 1:]))
                    tensor = torch.cat([tensor, zeros], dim)
            args[slot] = tensor
        for slot, expr in self.size_args.items():
            args[slot] = int(expr.xreplace(sizes))
        return args

    def sliced(self, outputs, sizes: dict[sympy.Symbol, int]):
        """The padded program's outputs cut back to the call's real `sizes`."""
        flat, spec = torch.utils._pytree.tree_flatten(outputs)
        cut = []
        for value, dims in zip(flat, self.output_dims, strict=True):
            index = [slice(None)] * value.ndim
            for dim, symbol in dims:
                index[dim] = slice(0, sizes[symbol])
            cut.append(value[tuple(index)])
        return torch.utils._pytree.tree_unflatten(cut, spec)


def _symbolic_dims(shape, uppers: dict) -> list[tuple[int, sympy.Symbol]] | None:
    """(dim, symbol) for each symbolic dim; None when one is an expression of symbols."""
    dims = []
    for dim, size in enumerate(shape):
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            if expr.is_number:  # specialized: static
                continue
            if not isinstance(expr, sympy.Symbol):
                return None
            dims.append((dim, expr))
            _note_upper(size, uppers)
    return dims


def _note_upper(size: torch.SymInt, uppers: dict) -> None:
    shape_env, expr = size.node.shape_env, size.node.expr
    upper = shape_env.var_to_range[expr].upper if isinstance(expr, sympy.Symbol) and expr in shape_env.var_to_range else None
    if isinstance(upper, sympy.Integer):  # unbounded is torch's int_oo, no Integer
        uppers[expr] = int(upper)
