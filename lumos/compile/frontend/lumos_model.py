"""Frontend: the Lumos model's inference forward, through torch.export, lowered to primitives.

torch.export traces `LumosModel.forward` (eval mode, so dropout is the identity) at one concrete
(batch, sequence) shape into aten ops; each aten op has one lowering below, written with the
high-level ops of ir/hl_ops.py. An aten op without a lowering stops the compile with a message naming
the op and the model code it came from.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lumos.compile.ir import hl_ops
from lumos.compile.ir.graph import LITERAL_PREFIX, Graph, check_graph, mark_batch, prod
from lumos.compile.ir.hl_ops import MASKED, Tensor, attention, cat, mark_output
from lumos.core.errors import LumosError
from lumos.data.contract import Batch, FeatureSpec
from lumos.train.memory import synthetic_batch
from lumos.train.model import LumosModel

OUTPUTS = ("user_embedding", "item_query", "act_logits", "value_pred")


class UnsupportedOp(LumosError):
    """The model uses a torch op the compiler cannot lower."""


# ---------------------------------------------------------------------------------------------
# Inputs: a Batch as named, flat float32 arrays


def input_names(features: FeatureSpec) -> list[str]:
    return (["mask", "numeric", "static_numeric", "future"]
            + [f"tokens.{name}" for name in features.token_categorical]
            + [f"static.{name}" for name in features.static_categorical])


def batch_tensors(batch: Batch, features: FeatureSpec) -> dict[str, torch.Tensor]:
    """The model inputs of a batch by name (targets are not inputs)."""
    named = {"mask": batch.mask, "numeric": batch.numeric, "static_numeric": batch.static_numeric,
             "future": batch.future}
    named.update({f"tokens.{name}": batch.tokens[name] for name in features.token_categorical})
    named.update({f"static.{name}": batch.static_categorical[name] for name in features.static_categorical})
    return named


def batch_from_tensors(named: dict[str, torch.Tensor], features: FeatureSpec) -> Batch:
    B = named["mask"].shape[0]
    H = len(features.horizons_days)
    empty = named["mask"].new_zeros
    return Batch(
        tokens={name: named[f"tokens.{name}"] for name in features.token_categorical},
        numeric=named["numeric"], mask=named["mask"],
        static_categorical={name: named[f"static.{name}"] for name in features.static_categorical},
        static_numeric=named["static_numeric"], future=named["future"],
        next_item=empty(B, dtype=torch.int64), act=empty(B, H, dtype=torch.float32),
        value=empty(B, H, dtype=torch.float32),
    )


def output_names(model: LumosModel) -> list[str]:
    present = {"user_embedding": True, "item_query": model.item_projection is not None,
               "act_logits": model.act_head is not None, "value_pred": model.value_head is not None}
    return [name for name in OUTPUTS if present[name]]


class _Forward(nn.Module):
    """The model's forward over flat, named tensors, returning its present outputs as a tuple."""

    def __init__(self, model: LumosModel):
        super().__init__()
        self.model = model
        self.names = input_names(model.features)
        self.outputs = output_names(model)

    def forward(self, *tensors):
        output = self.model(batch_from_tensors(dict(zip(self.names, tensors, strict=True)), self.model.features))
        return tuple(getattr(output, name) for name in self.outputs)


# ---------------------------------------------------------------------------------------------
# Lowering


@dataclass
class _Lowering:
    graph: Graph
    fx_node: torch.fx.Node

    def where(self) -> str:
        return describe(self.fx_node)


def describe(fx_node: torch.fx.Node) -> str:
    """`aten.op in module path (file:line: code)`: where an fx node came from in the model."""
    stack = fx_node.meta.get("nn_module_stack") or {}
    module = next(reversed(stack.values()))[0] if stack else ""
    module = module.removeprefix("model.").removeprefix("model")
    trace = (fx_node.meta.get("stack_trace") or "").strip().splitlines()
    frames = []
    for index, line in enumerate(trace):
        if line.strip().startswith("File "):
            code = trace[index + 1].strip() if index + 1 < len(trace) else ""
            frames.append(f"{line.strip().removeprefix('File ')}: {code}")
    # The innermost frame in the model's own code, not in torch's modules; never the compiler's
    # own frames (the torch.compile backend's re-trace, where dynamo recorded none).
    frames = [frame for frame in frames if "/lumos/compile/" not in frame]
    own = [frame for frame in frames if "/torch/" not in frame]
    location = (own or frames or [""])[-1]
    parts = [f"{fx_node.target}"] + ([f"in {module}"] if module else []) + ([f"({location})"] if location else [])
    return " ".join(parts)


def _sizes(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _dtype(fx_arg) -> torch.dtype | None:
    val = fx_arg.meta.get("val") if isinstance(fx_arg, torch.fx.Node) else None
    return getattr(val, "dtype", None)


def _slice(x: Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> Tensor:
    size = x.shape[dim]
    start, end, _ = slice(start, end).indices(size)
    return x.slice(dim, start, max(start, end), step)


def _split(x: Tensor, split_size, dim: int = 0) -> tuple[Tensor, ...]:
    size = x.shape[dim]
    sizes = [split_size] * (size // split_size) + ([size % split_size] if size % split_size else []) \
        if isinstance(split_size, int) else list(split_size)
    parts, start = [], 0
    for length in sizes:
        parts.append(x.slice(dim, start, start + length))
        start += length
    return tuple(parts)


def _sdpa(lower: _Lowering, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **_):
    if dropout_p > 0:
        raise UnsupportedOp(f"attention dropout {dropout_p} (put the model in eval mode): {lower.where()}")
    if is_causal:  # torch's causal mask: query i sees keys 0..i (top-left aligned)
        return attention(q, k, v, _literal(lower, np.tril(np.ones(q.shape[-2:-1] + k.shape[-2:-1], np.float32))), scale)
    if attn_mask is None:
        return attention(q, k, v, None, scale)
    if _dtype(lower.fx_node.args[3] if len(lower.fx_node.args) > 3 else lower.fx_node.kwargs["attn_mask"]) is torch.bool:
        return attention(q, k, v, attn_mask, scale)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return ((q.matmul(k.transpose(-1, -2)) * scale + attn_mask).softmax(-1)).matmul(v)


def _layer_norm(lower: _Lowering, x, normalized_shape, weight=None, bias=None, eps=1e-5, *_):
    if len(normalized_shape) != 1:
        raise UnsupportedOp(f"layer_norm over {len(normalized_shape)} dims is not supported: {lower.where()}")
    return x.layer_norm(weight, bias, eps)


def _dropout(lower: _Lowering, x, p=0.0, train=False):
    if train and p > 0:
        raise UnsupportedOp(f"dropout in training mode (put the model in eval mode): {lower.where()}")
    return x


def _arange(lower: _Lowering, *args, **_):
    values = np.arange(*args, dtype=np.float32)
    name = f"{LITERAL_PREFIX}{lower.fx_node.name}"
    return Tensor.constant(lower.graph, name, values)


def _full_like(value: float):
    def make(lower: _Lowering, x, size, **_):
        return Tensor.full(lower.graph, value, _sizes(size))
    return make


def _sum(lower: _Lowering, x, dims=None, keepdim=False, **_):
    dims = list(range(x.ndim)) if not dims else list(dims)
    return x.sum(dims, keepdim)


def _mean(lower: _Lowering, x, dims=None, keepdim=False, **_):
    dims = list(range(x.ndim)) if not dims else list(dims)
    return x.mean(dims, keepdim)


def _binary(method: Callable) -> Callable:
    def lower_binary(lower: _Lowering, a, b, alpha=1, **_):
        if alpha != 1:
            b = b * alpha
        if not isinstance(a, Tensor):
            a = Tensor.full(lower.graph, float(a))
        return method(a, b)
    return lower_binary


def _div(lower: _Lowering, a, b, rounding_mode=None):
    if rounding_mode is not None:
        raise UnsupportedOp(f"division with rounding_mode={rounding_mode!r} is not supported: {lower.where()}")
    return a / b


def _identity(lower: _Lowering, x, *args, **kwargs):
    return x


# -- general modules (frontend/export.py): comparisons, 0/1 logic, constants, core-aten composites


def _finite(value: float) -> float:
    """±inf fill values (masks) as ±MASKED: the IR selects by c*a + (1-c)*b, where 0·inf would be NaN."""
    return max(min(float(value), -MASKED), MASKED)


def _equal(a, b) -> Tensor:
    return a.eq(b)


def _boolean(lowering: Callable) -> Callable:
    """Logic on 0/1 floats is right only for bool operands (not for the bits of an integer)."""
    def lower_boolean(lower: _Lowering, *args, **kwargs):
        for fx_arg in lower.fx_node.args:
            if isinstance(fx_arg, torch.fx.Node) and _dtype(fx_arg) is not torch.bool:
                raise UnsupportedOp(f"{lower.fx_node.target} on {_dtype(fx_arg)} (only bool is supported): {lower.where()}")
        return lowering(*args, **kwargs)
    return lower_boolean


def _literal(lower: _Lowering, values: np.ndarray) -> Tensor:
    return Tensor.constant(lower.graph, f"{LITERAL_PREFIX}{lower.fx_node.name}", values)


def _triangle(keep: Callable) -> Callable:
    """tril/triu: the input times a 0/1 literal of its last two dims."""
    def lower_triangle(lower: _Lowering, x, diagonal=0):
        rows, cols = x.shape[-2:]
        return x * _literal(lower, keep(np.ones((rows, cols), np.float32), diagonal))
    return lower_triangle


def _eye(lower: _Lowering, n, m=None, **_):
    return _literal(lower, np.eye(n, n if m is None else m, dtype=np.float32))


def _native_layer_norm(lower: _Lowering, x, normalized_shape, weight, bias, eps):
    """(normalized, mean, 1/std) as aten gives them; the statistics are pruned when unused."""
    out = _layer_norm(lower, x, normalized_shape, weight, bias, eps)
    mean = x.mean(-1, keepdim=True)
    return out, mean, (x.var(-1, keepdim=True) + eps).sqrt().recip()


def _var(lower: _Lowering, x, dims=None, correction=None, keepdim=False):
    dims = list(range(x.ndim)) if not dims else [d % x.ndim for d in dims]
    correction = 1 if correction is None else correction
    if len(dims) != 1:
        raise UnsupportedOp(f"variance over {len(dims)} dims is not supported: {lower.where()}")
    return x.var(dims[0], keepdim, int(correction))


def _pow(lower: _Lowering, x, exponent):
    if exponent == 0.5:
        return x.sqrt()
    if exponent == -0.5:
        return x.sqrt().recip()
    if float(exponent).is_integer() and 1 <= abs(exponent) <= 4:
        out = x
        for _ in range(int(abs(exponent)) - 1):
            out = out * x
        return out if exponent > 0 else out.recip()
    raise UnsupportedOp(f"x ** {exponent} (only ±0.5 and integers up to ±4): {lower.where()}")


def _matmul_add(lower: _Lowering, bias, a, b, beta=1, alpha=1):
    """addmm / baddbmm: beta·bias + alpha·(a @ b)."""
    product = a.matmul(b)
    return (product if alpha == 1 else product * alpha) + (bias if beta == 1 else bias * beta)


def _flatten(x: Tensor, start: int = 0, end: int = -1) -> Tensor:
    start, end = start % max(x.ndim, 1), end % max(x.ndim, 1)
    return x.reshape(x.shape[:start] + (-1,) + x.shape[end + 1:])


def _log_softmax(x: Tensor, dim: int) -> Tensor:
    shifted = x - x.max(dim, keepdim=True)
    return shifted - shifted.exp().sum(dim, keepdim=True).log()


def _per_axis(value, axes: int) -> tuple[int, ...]:
    """A conv argument given once for every spatial axis, or per axis."""
    values = [value] if isinstance(value, int) else list(value)
    return tuple(int(v) for v in (values * axes if len(values) == 1 else values))


def _conv(lower: _Lowering, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """conv1d/2d/3d: ir/hl_ops.py's conv (im2col in views and a matmul); "same" pads the extra
    zero of an odd total at the end, as torch does."""
    spatial = weight.ndim - 2
    unbatched = x.ndim == spatial + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride, dilation = _per_axis(stride, spatial), _per_axis(dilation, spatial)
    if padding == "valid":
        pads = ((0, 0),) * spatial
    elif padding == "same":
        totals = [step * (size - 1) for step, size in zip(dilation, weight.shape[2:], strict=True)]
        pads = tuple((total // 2, total - total // 2) for total in totals)
    else:
        pads = tuple((p, p) for p in _per_axis(padding, spatial))
    out = hl_ops.conv(x, weight, bias, stride, pads, dilation, int(groups))
    return out.squeeze(0) if unbatched else out


def _convolution(lower: _Lowering, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise UnsupportedOp(f"transposed convolution is not supported: {lower.where()}")
    return _conv(lower, x, weight, bias, stride, padding, dilation, groups)


def _batch_norm_no_training(lower: _Lowering, x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch norm in eval mode (what export makes of nn.BatchNormNd), per channel (dim 1):
    (x - running mean) / sqrt(running var + eps) · weight + bias; aten's two saved statistics
    are empty in eval mode."""
    channel = (-1,) + (1,) * (x.ndim - 2)  # (C, 1, ...): broadcast over the batch and spatial dims
    out = (x - running_mean.reshape(channel)) * (running_var.reshape(channel) + float(eps)).sqrt().recip()
    if weight is not None:
        out = out * weight.reshape(channel)
    if bias is not None:
        out = out + bias.reshape(channel)
    empty = Tensor.full(lower.graph, 0.0, (0,))
    return out, empty, empty


def _pool(lower: _Lowering, x: Tensor, spatial: int, reduce: str, kernel_size, stride, padding, dilation,
          ceil_mode: bool) -> tuple[Tensor, tuple]:
    """hl_ops.pool with torch's arguments (a stride of [] is the kernel's; unbatched inputs too),
    and the window's (kernel, stride, padding, dilation); ceil_mode only where it gives the floor's sizes."""
    kernel = _per_axis(kernel_size, spatial)
    stride = _per_axis(stride, spatial) if stride else kernel
    padding, dilation = _per_axis(padding, spatial), _per_axis(dilation, spatial)
    window = (kernel, stride, padding, dilation)
    if ceil_mode and any(_pooled_size(size, *dims, ceil=True) != _pooled_size(size, *dims, ceil=False)
                         for size, *dims in zip(x.shape[-spatial:], *window, strict=True)):
        raise UnsupportedOp(f"pooling with ceil_mode and a partial last window: {lower.where()}")
    unbatched = x.ndim == spatial + 1
    out = hl_ops.pool(x.unsqueeze(0) if unbatched else x, *window, reduce)
    return (out.squeeze(0) if unbatched else out), window


def _max_pool(spatial: int) -> Callable:
    def lower_max_pool(lower: _Lowering, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _pool(lower, x, spatial, "max", kernel_size, stride, padding, dilation, ceil_mode)[0]
    return lower_max_pool


def _avg_pool(spatial: int) -> Callable:
    def lower_avg_pool(lower: _Lowering, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                       count_include_pad=True, divisor_override=None):
        total, (kernel, stride, padding, _) = _pool(lower, x, spatial, "sum", kernel_size, stride, padding, 1,
                                                     ceil_mode)
        if divisor_override or count_include_pad or not any(padding):
            return total * (1.0 / (divisor_override or prod(kernel)))
        inside = Tensor.full(lower.graph, 1.0, x.shape)  # each window's count of elements inside the input
        return total / _pool(lower, inside, spatial, "sum", kernel, stride, padding, 1, False)[0]
    return lower_avg_pool


def _pooled_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool) -> int:
    """torch's pooling output size: the last window must start inside the input or its left padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    return out - 1 if ceil and (out - 1) * stride >= size + padding else out


def _adaptive_avg_pool(spatial: int) -> Callable:
    """adaptive_avg_poolNd where each output size divides the input's: windows of size/out, at
    stride size/out, as a reshape (a view) and a mean."""
    def lower_adaptive(lower: _Lowering, x, output_size):
        sizes = x.shape[-spatial:]
        outs = _per_axis(output_size, spatial)
        if any(size % out for size, out in zip(sizes, outs, strict=True)):
            raise UnsupportedOp(f"adaptive pooling from {sizes} to {outs} (not a whole window each): {lower.where()}")
        lead = x.ndim - spatial
        split = x.reshape(x.shape[:lead] + tuple(v for size, out in zip(sizes, outs, strict=True) for v in (out, size // out)))
        return split.mean([lead + 2 * d + 1 for d in range(spatial)])  # (..., out1, window1, out2, window2 ...)
    return lower_adaptive


def _ids(lower: _Lowering, *fx_args) -> None:
    """Index tensors must be integers (a bool mask selects a data-dependent number of elements)."""
    for fx_arg in fx_args:
        for item in fx_arg if isinstance(fx_arg, list | tuple) else [fx_arg]:
            dtype = _dtype(item)
            if dtype is not None and (dtype.is_floating_point or dtype is torch.bool):
                raise UnsupportedOp(f"indexing by a {dtype} tensor (only integer indices): {lower.where()}")


def _index(lower: _Lowering, x, indices):
    _ids(lower, lower.fx_node.args[1])
    return hl_ops.index(x, indices)


def _index_select(lower: _Lowering, x, dim, ids):
    _ids(lower, lower.fx_node.args[2])
    return hl_ops.index(x, [None] * (dim % x.ndim) + [ids])


def _index_put(lower: _Lowering, x, indices, values, accumulate=False):
    """x[indices] = values: integer indices through hl_ops.index_put; one bool mask with a single
    value (x[mask] = 0, the common case) is a select."""
    masks = [fx_arg for fx_arg in lower.fx_node.args[1] if _dtype(fx_arg) is torch.bool]
    if not masks:
        _ids(lower, lower.fx_node.args[1])
        return hl_ops.index_put(x, indices, values, bool(accumulate))
    mask = [index for index in indices if index is not None]
    if len(mask) != 1 or len(masks) != 1 or prod(values.shape) != 1:
        raise UnsupportedOp(f"index_put with a bool mask takes one mask and one value: {lower.where()}")
    (mask,) = mask
    start = next(d for d, index in enumerate(indices) if index is not None)
    mask = mask.reshape((1,) * start + mask.shape + (1,) * (x.ndim - start - mask.ndim))
    value = values.reshape(())
    return x + mask * value if accumulate else mask.where(value, x)


EMBEDDING_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def _embedding_bag(lower: _Lowering, table, ids, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """(output, None, None, None): aten's bookkeeping outputs (offset2bag, bag sizes, argmax
    indices) serve the backward and are left out."""
    padding_idx = None if padding_idx is None or padding_idx < 0 else int(padding_idx)
    out = hl_ops.embedding_bag(table, ids, offsets, EMBEDDING_BAG_MODES[int(mode)], per_sample_weights,
                               padding_idx, bool(include_last_offset))
    return out, None, None, None


LOWERINGS: dict[str, Callable] = {
    # arithmetic
    "aten.add.Tensor": _binary(operator.add),
    "aten.add.Scalar": _binary(operator.add),
    "aten.sub.Tensor": _binary(operator.sub),
    "aten.sub.Scalar": _binary(operator.sub),
    "aten.rsub.Scalar": lambda lower, a, b, alpha=1: (a * -alpha) + b,
    "aten.mul.Tensor": _binary(operator.mul),
    "aten.mul.Scalar": _binary(operator.mul),
    "aten.div.Tensor": _div,
    "aten.div.Scalar": _div,
    "aten.neg.default": lambda lower, x: -x,
    "aten.abs.default": lambda lower, x: x.abs(),
    "aten.sign.default": lambda lower, x: x.sign(),
    "aten.exp.default": lambda lower, x: x.exp(),
    "aten.log.default": lambda lower, x: x.log(),
    "aten.log1p.default": lambda lower, x: x.log1p(),
    "aten.expm1.default": lambda lower, x: x.exp() - 1.0,
    "aten.sqrt.default": lambda lower, x: x.sqrt(),
    "aten.rsqrt.default": lambda lower, x: x.sqrt().recip(),
    "aten.reciprocal.default": lambda lower, x: x.recip(),
    "aten.sin.default": lambda lower, x: x.sin(),
    "aten.tanh.default": lambda lower, x: x.tanh(),
    "aten.sigmoid.default": lambda lower, x: 1.0 / ((-x).exp() + 1.0),
    "aten.relu.default": lambda lower, x: x.relu(),
    "aten.gelu.default": lambda lower, x, approximate="none": x.gelu(approximate),
    "aten.clamp.default": lambda lower, x, min=None, max=None: x.clamp(min, max),
    "aten.clamp_min.default": lambda lower, x, min: x.clamp(min, None),
    "aten.maximum.default": lambda lower, a, b: a.maximum(b),
    "aten.minimum.default": lambda lower, a, b: a.minimum(b),
    "aten.lt.Tensor": lambda lower, a, b: a < b,
    "aten.lt.Scalar": lambda lower, a, b: a < b,
    "aten.gt.Tensor": lambda lower, a, b: a > b,
    "aten.gt.Scalar": lambda lower, a, b: a > b,
    "aten.logical_not.default": lambda lower, x: 1.0 - x,
    # Booleans are 0/1 floats in the IR, so "and" is a product (the causal & padding mask).
    "aten.__and__.Tensor": lambda lower, a, b: a * b,
    "aten.bitwise_and.Tensor": lambda lower, a, b: a * b,
    "aten.logical_and.default": lambda lower, a, b: a * b,
    "aten.where.self": lambda lower, c, a, b: c.where(a, b),
    "aten.masked_fill.Scalar": lambda lower, x, mask, value: x.masked_fill(mask, max(float(value), MASKED)),
    # reductions and composites
    "aten.sum.dim_IntList": _sum,
    "aten.sum.default": _sum,
    "aten.mean.dim": _mean,
    "aten.amax.default": lambda lower, x, dims, keepdim=False: _amax(x, dims, keepdim),
    "aten.softmax.int": lambda lower, x, dim, *_: x.softmax(dim),
    "aten._softmax.default": lambda lower, x, dim, *_: x.softmax(dim),
    "aten.linear.default": lambda lower, x, w, b=None: x.linear(w, b),
    "aten.matmul.default": lambda lower, a, b: a.matmul(b),
    "aten.mm.default": lambda lower, a, b: a.matmul(b),
    "aten.bmm.default": lambda lower, a, b: a.matmul(b),
    "aten.embedding.default": lambda lower, table, ids, *_: table.embedding(ids),
    "aten.layer_norm.default": _layer_norm,
    "aten.scaled_dot_product_attention.default": _sdpa,
    "aten.dropout.default": _dropout,
    # constants
    "aten.tril_indices.default": lambda lower, row, col, offset=0, **_: _literal(lower, np.stack(np.tril_indices(row, offset, col))),
    "aten.triu_indices.default": lambda lower, row, col, offset=0, **_: _literal(lower, np.stack(np.triu_indices(row, offset, col))),
    "aten.arange.default": lambda lower, end, **kw: _arange(lower, end),
    "aten.arange.start": lambda lower, start, end, **kw: _arange(lower, start, end),
    "aten.arange.start_step": lambda lower, start, end, step=1, **kw: _arange(lower, start, end, step),
    "aten.new_ones.default": _full_like(1.0),
    "aten.new_zeros.default": _full_like(0.0),
    # movement: views only
    "aten.view.default": lambda lower, x, size: x.reshape(_sizes(size)),
    "aten.reshape.default": lambda lower, x, size: x.reshape(_sizes(size)),
    "aten._unsafe_view.default": lambda lower, x, size: x.reshape(_sizes(size)),
    "aten.expand.default": lambda lower, x, size, **_: x.expand(_sizes(size)),
    "aten.permute.default": lambda lower, x, dims: x.permute(tuple(dims)),
    "aten.transpose.int": lambda lower, x, a, b: x.transpose(a, b),
    "aten.t.default": lambda lower, x: x.transpose(0, 1),
    "aten.unsqueeze.default": lambda lower, x, dim: x.unsqueeze(dim),
    "aten.squeeze.dim": lambda lower, x, dim: x.squeeze(dim),
    "aten.squeeze.dims": lambda lower, x, dims: _squeeze_dims(x, dims),
    "aten.select.int": lambda lower, x, dim, index: x.select(dim, index),
    "aten.slice.Tensor": lambda lower, x, dim=0, start=None, end=None, step=1: _slice(x, dim, start, end, step),
    "aten.split.Tensor": lambda lower, x, size, dim=0: _split(x, size, dim),
    "aten.split_with_sizes.default": lambda lower, x, sizes, dim=0: _split(x, list(sizes), dim),
    "aten.cat.default": lambda lower, tensors, dim=0: cat(_cat_parts(tensors), dim),
    "aten.stack.default": lambda lower, tensors, dim=0: cat([t.unsqueeze(dim) for t in tensors], dim),
    # dtype changes and copies: one dtype in the IR
    "aten.to.dtype": _identity,
    "aten._to_copy.default": _identity,
    "aten.type_as.default": _identity,
    "aten.contiguous.default": _identity,
    "aten.clone.default": _identity,
    "aten.alias.default": _identity,
    "aten.detach.default": _identity,
    # general modules (frontend/export.py)
    "aten.eq.Scalar": lambda lower, a, b: _equal(a, b),
    "aten.eq.Tensor": lambda lower, a, b: _equal(a, b),
    "aten.ne.Scalar": lambda lower, a, b: 1.0 - _equal(a, b),
    "aten.ne.Tensor": lambda lower, a, b: 1.0 - _equal(a, b),
    "aten.ge.Scalar": lambda lower, a, b: 1.0 - (a < b),
    "aten.ge.Tensor": lambda lower, a, b: 1.0 - (a < b),
    "aten.le.Scalar": lambda lower, a, b: 1.0 - (a > b),
    "aten.le.Tensor": lambda lower, a, b: 1.0 - (a > b),
    "aten.__or__.Tensor": _boolean(lambda a, b: a + b - a * b),
    "aten.bitwise_or.Tensor": _boolean(lambda a, b: a + b - a * b),
    "aten.logical_or.default": _boolean(lambda a, b: a + b - a * b),
    "aten.bitwise_not.default": _boolean(lambda x: 1.0 - x),
    "aten.any.dim": _boolean(lambda x, dim, keepdim=False: x.max(dim, keepdim)),
    "aten.masked_fill.Tensor": lambda lower, x, mask, value: x.masked_fill(mask, value),
    "aten.erf.default": lambda lower, x: x.erf(),
    "aten.cos.default": lambda lower, x: (x + math.pi / 2).sin(),
    "aten.silu.default": lambda lower, x: x / ((-x).exp() + 1.0),
    "aten.square.default": lambda lower, x: x * x,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.mean.default": _mean,
    "aten.var.correction": _var,
    "aten.var.dim": lambda lower, x, dims=None, unbiased=True, keepdim=False: _var(lower, x, dims, int(unbiased), keepdim),
    "aten.native_layer_norm.default": _native_layer_norm,
    "aten.log_softmax.int": lambda lower, x, dim, *_: _log_softmax(x, dim),
    "aten._log_softmax.default": lambda lower, x, dim, *_: _log_softmax(x, dim),
    "aten.addmm.default": _matmul_add,
    "aten.baddbmm.default": _matmul_add,
    "aten.full.default": lambda lower, size, value, **_: Tensor.full(lower.graph, _finite(value), _sizes(size)),
    "aten.ones.default": lambda lower, size, **_: Tensor.full(lower.graph, 1.0, _sizes(size)),
    "aten.zeros.default": lambda lower, size, **_: Tensor.full(lower.graph, 0.0, _sizes(size)),
    "aten.full_like.default": lambda lower, x, value, **_: Tensor.full(lower.graph, _finite(value), x.shape),
    "aten.ones_like.default": lambda lower, x, **_: Tensor.full(lower.graph, 1.0, x.shape),
    "aten.zeros_like.default": lambda lower, x, **_: Tensor.full(lower.graph, 0.0, x.shape),
    "aten.scalar_tensor.default": lambda lower, value, **_: Tensor.full(lower.graph, _finite(value)),
    "aten.eye.default": _eye,
    "aten.tril.default": _triangle(np.tril),
    "aten.triu.default": _triangle(np.triu),
    "aten.unbind.int": lambda lower, x, dim=0: tuple(x.select(dim, i) for i in range(x.shape[dim])),
    "aten.unflatten.int": lambda lower, x, dim, sizes: x.reshape(
        x.shape[:dim % x.ndim] + _sizes(sizes) + x.shape[dim % x.ndim + 1:]),
    "aten.flatten.using_ints": lambda lower, x, start=0, end=-1: _flatten(x, start, end),
    "aten.lift_fresh_copy.default": _identity,
    # more ops (issue 64): convolution, indexing, bags, scans, scatters, in views and existing primitives
    "aten.convolution.default": _convolution,
    "aten.conv1d.default": _conv,
    "aten.conv2d.default": _conv,
    "aten.conv3d.default": _conv,
    "aten.conv1d.padding": _conv,
    "aten.conv2d.padding": _conv,
    "aten.conv3d.padding": _conv,
    "aten.index.Tensor": _index,
    "aten.index_select.default": _index_select,
    "aten.gather.default": lambda lower, x, dim, ids, sparse_grad=False: hl_ops.take_along(x, dim, ids),
    "aten.embedding_bag.default": _embedding_bag,
    "aten.embedding_bag.padding_idx": _embedding_bag,
    "aten._embedding_bag.default": _embedding_bag,
    "aten.cumsum.default": lambda lower, x, dim, **_: x.cumsum(dim),
    "aten.index_add.default": lambda lower, x, dim, ids, source, alpha=1: hl_ops.index_add(x, dim, ids, source, alpha),
    "aten.scatter_add.default": lambda lower, x, dim, ids, source: hl_ops.scatter_add(x, dim, ids, source),
    "aten.index_put.default": _index_put,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm_no_training,
    "aten.max_pool1d.default": _max_pool(1),
    "aten.max_pool2d.default": _max_pool(2),
    "aten.avg_pool1d.default": _avg_pool(1),
    "aten.avg_pool2d.default": _avg_pool(2),
    "aten.adaptive_avg_pool1d.default": _adaptive_avg_pool(1),
    "aten.adaptive_avg_pool2d.default": _adaptive_avg_pool(2),
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool(2),
    "<built-in function getitem>": lambda lower, values, index: values[index],
}
# nn.TransformerEncoder's nested-tensor path (a padding mask in eval mode, no grad): nothing dense to
# lower it to. Its fused dense kernels are decomposed before lowering (frontend/fast_path.py).
FAST_PATH_OPS = {"aten._nested_tensor_from_mask.default", "aten._nested_tensor_from_mask_left_aligned.default"}
FAST_PATH_HINT = ("this is PyTorch's nested-tensor fast path of nn.TransformerEncoder (a padding mask in eval mode "
                  "without grad); compile_module exports the math path instead")
IGNORED = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default"}


def _amax(x: Tensor, dims, keepdim: bool) -> Tensor:
    for dim in sorted((d % x.ndim for d in dims), reverse=True):
        x = x.max(dim, keepdim)
    return x


def _squeeze_dims(x: Tensor, dims) -> Tensor:
    for dim in sorted((d % x.ndim for d in dims), reverse=True):
        x = x.squeeze(dim)
    return x


# ---------------------------------------------------------------------------------------------
# torch.export → IR


def export_model(model: LumosModel, batch_size: int, seq_len: int):
    """The model's inference forward as a torch.export program at (batch_size, seq_len)."""
    wrapper = _Forward(model)
    example = batch_tensors(synthetic_batch(model.features, batch_size, seq_len), model.features)
    args = tuple(example[name] for name in wrapper.names)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return torch.export.export(wrapper, args, strict=False), wrapper.outputs
    finally:
        model.train(was_training)


def lower_model(model: LumosModel, batch_size: int, seq_len: int, symbolic_batch: bool = False) -> Graph:
    """The model's inference forward at (batch_size, seq_len) as a primitive graph; with
    `symbolic_batch`, traced once more at one more row to find the batch dims (ir.mark_batch)."""
    if seq_len > model.max_len:
        raise ValueError(f"sequence length {seq_len} exceeds the model's max_len {model.max_len}")
    program, outputs = export_model(model, batch_size, seq_len)
    graph = lower_program(program, input_names(model.features), outputs)
    if symbolic_batch and batch_size > 1:
        twin_program, _ = export_model(model, batch_size + 1, seq_len)
        mark_batch(graph, lower_program(twin_program, input_names(model.features), outputs))
    return graph


def lower_program(program, inputs: list[str], output_names: list[str]) -> Graph:
    """An exported program as a primitive graph; `inputs` names its user inputs in order."""
    graph = Graph()
    env: dict[torch.fx.Node, object] = {}
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    user_inputs = iter(inputs)
    for fx_node in program.graph.nodes:
        if fx_node.op == "placeholder":
            env[fx_node] = _placeholder(graph, program, specs[fx_node.name], fx_node, user_inputs)
        elif fx_node.op == "call_function":
            env[fx_node] = _lower_call(graph, fx_node, env)
        elif fx_node.op == "output":
            results = fx_node.args[0]
            for name, result in zip(output_names, results, strict=True):
                if not isinstance(result, torch.fx.Node):
                    continue  # a constant output (None, a number): not the graph's to compute
                if not isinstance(env[result], Tensor):
                    raise UnsupportedOp(f"output {name} is not a tensor")
                mark_output(graph, name, env[result])
        else:
            raise UnsupportedOp(f"fx node kind {fx_node.op!r} ({fx_node.target}) is not supported")
    graph.prune()
    check_graph(graph)
    return graph


def _cat_parts(tensors) -> list[Tensor]:
    """torch.cat skips 1-D empty tensors whatever the dim (a legacy rule that Hugging Face's KV
    cache relies on: it starts as `torch.tensor([])`)."""
    return [t for t in tensors if t.shape != (0,)] or list(tensors)


def can_lower(fx_node: torch.fx.Node) -> bool:
    """Whether the table lowers this call_function node: its lowering is tried on a scratch graph
    whose inputs have the node's input shapes (a lowering refuses some arguments, as dropout in
    training mode, so the op's name alone does not say)."""
    target = str(fx_node.target)
    if target in IGNORED:
        return True
    if target not in LOWERINGS:
        return False
    graph = Graph()
    env = {arg: _scratch_value(graph, arg.name, arg.meta.get("val")) for arg in fx_node.all_input_nodes}
    try:
        _lower_call(graph, fx_node, env)
    except UnsupportedOp:
        return False
    return True


def _scratch_value(graph: Graph, name: str, value) -> object:
    """A stand-in for an fx node's value: an input of its shape for a tensor, a tuple of them for
    a tuple (split's result), the value itself otherwise."""
    if isinstance(value, torch.Tensor):
        return Tensor.input(graph, name, tuple(int(size) for size in value.shape))
    if isinstance(value, (tuple, list)):
        return tuple(_scratch_value(graph, f"{name}.{index}", item) for index, item in enumerate(value))
    return value


def _placeholder(graph: Graph, program, spec, fx_node, user_inputs) -> Tensor:
    shape = tuple(int(s) for s in fx_node.meta["val"].shape)
    kind = spec.kind.name
    if kind == "USER_INPUT":
        name = next(user_inputs)
        return Tensor.input(graph, name, shape)
    if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
        target = spec.target
        value = program.state_dict.get(target)
        if value is None:
            value = program.constants[target]
        name = target.removeprefix("model.")
        if kind == "CONSTANT_TENSOR":
            name = LITERAL_PREFIX + name
        return Tensor.constant(graph, name, value.detach().cpu().float().numpy())
    raise UnsupportedOp(f"program input kind {kind} ({fx_node.name}) is not supported")


def _lower_call(graph: Graph, fx_node: torch.fx.Node, env: dict) -> object:
    target = str(fx_node.target)
    if target in IGNORED:
        return None
    lowering = LOWERINGS.get(target)
    lower = _Lowering(graph, fx_node)
    if lowering is None:
        hint = f"; {FAST_PATH_HINT}" if target in FAST_PATH_OPS else ""
        raise UnsupportedOp(
            f"the compiler cannot lower {lower.where()}; supported ops are listed in lumos/compile/frontend/lumos_model.py (LOWERINGS)"
            + hint
        )
    args = torch.fx.node.map_aggregate(fx_node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
    kwargs = torch.fx.node.map_aggregate(fx_node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
    kwargs = {key: value for key, value in kwargs.items() if key not in ("dtype", "layout", "device", "pin_memory",
                                                                          "memory_format", "non_blocking", "copy")}
    graph.origin = lower.where()
    try:
        result = lowering(lower, *args, **kwargs)
    except UnsupportedOp:
        raise
    except Exception as error:
        raise UnsupportedOp(f"lowering {lower.where()} failed: {error}").with_traceback(sys.exc_info()[2]) from error
    finally:
        graph.origin = ""
    _check_shape(fx_node, result, lower)
    return result


def _check_shape(fx_node: torch.fx.Node, result, lower: _Lowering) -> None:
    expected = fx_node.meta.get("val")
    pairs = zip(result, expected, strict=False) if isinstance(result, tuple) else [(result, expected)]
    for got, want in pairs:
        if isinstance(got, Tensor) and hasattr(want, "shape") and got.shape != tuple(int(s) for s in want.shape):
            raise UnsupportedOp(f"lowering {lower.where()} gave shape {got.shape}, torch gives {tuple(want.shape)}")

