"""PyTorch's fused inference fast path of nn.TransformerEncoder and nn.MultiheadAttention, made
readable for the compiler without touching `torch.backends.mha`'s global flag.

In eval mode without grad, those modules call fused kernels (`_transformer_encoder_layer_fwd`,
`_native_multi_head_attention`) and, given a padding mask, nested tensors. The compiler meets them
in two ways, and handles each where it is met:

- Running or exporting the module itself (compile_module): `math_path` runs the module under a
  pass-through TorchFunctionMode. The modules take their fast path only when no tensor argument
  "has a torch function", and an active mode counts as one, so they run their math path. Modes
  are thread-local: other threads, and the global flag, are untouched.
- A graph that already holds the fused ops (dynamo traced the fast path at the user's first call
  to torch.compile's result): the decompositions below rewrite each fused op into the aten ops it
  stands for (linear, softmax, layer norm ...), which the lowering table reads. They follow
  PyTorch's own kernels (aten/src/ATen/native/transformers/{transformer,attention}.cpp), so that
  the rewritten graph computes what the fused kernel computes, masks included: the fused kernels
  turn a float mask into a bool one (nonzero = masked), unlike the math path's additive mask.

The nested-tensor path (`_nested_tensor_from_mask`) has no dense meaning to decompose to: it
stays unsupported (runs in eager), and `math_path` keeps it out of what compile_module exports.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


class _MathPath(TorchFunctionMode):
    """Calls every torch function unchanged; being active is what turns the fast path off."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextmanager
def math_path(module: nn.Module) -> Iterator[None]:
    """Eval mode and PyTorch's math path (no fused fast path, no nested tensors) for this thread
    while tracing or checking the module; the module's mode is restored after."""
    was_training = module.training
    module.eval()
    try:
        with _MathPath():
            yield
    finally:
        module.train(was_training)


# ---------------------------------------------------------------------------------------------
# Decompositions of the fused ops, for graphs that hold them


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, mask_type: int | None) -> torch.Tensor:
    """Softmax over the last dim of (B, H, T, S) scores, nonzero mask entries left out.
    mask_type 1 is a (B, S) key padding mask; otherwise the mask broadcasts ((T, S) or (B, H, T, S))."""
    if mask is None:
        return scores.softmax(-1)
    masked = mask if mask.dtype == torch.bool else mask != 0
    if mask_type == 1:
        masked = masked[:, None, None, :]  # (B, 1, 1, S)
    return scores.masked_fill(masked, float("-inf")).softmax(-1)


def native_multi_head_attention(query, key, value, embed_dim: int, num_head: int, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights: bool = True,
                                average_attn_weights: bool = True, mask_type: int | None = None):
    """aten._native_multi_head_attention: (output (B, T, D), attention weights or an empty tensor)."""
    B, T, _ = query.shape
    head_dim = embed_dim // num_head
    q_weight, k_weight, v_weight = qkv_weight.chunk(3)
    q_bias, k_bias, v_bias = qkv_bias.chunk(3)

    def heads(x, weight, bias):  # (B, L, D) -> (B, H, L, Dh)
        return F.linear(x, weight, bias).view(x.shape[0], x.shape[1], num_head, head_dim).transpose(1, 2)

    q = heads(query, q_weight, q_bias) / math.sqrt(head_dim)
    k, v = heads(key, k_weight, k_bias), heads(value, v_weight, v_bias)
    weights = _masked_softmax(q @ k.transpose(-1, -2), mask, mask_type)  # (B, H, T, S)
    context = (weights @ v).transpose(1, 2).reshape(B, T, embed_dim)  # (B, T, D)
    output = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return output, query.new_empty(0)  # the kernel returns an undefined tensor
    return output, weights.mean(1) if average_attn_weights else weights


def transformer_encoder_layer_fwd(src, embed_dim: int, num_heads: int, qkv_weight, qkv_bias, proj_weight,
                                  proj_bias, use_gelu: bool, norm_first: bool, eps: float,
                                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type: int | None = None):
    """aten._transformer_encoder_layer_fwd: one nn.TransformerEncoderLayer (self-attention, then a
    two-layer feed-forward; each a residual block, layer norm before or after it)."""

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    return norm(x, norm_weight_2, norm_bias_2) if not norm_first else x


DECOMPOSITIONS = {
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
"""For ExportedProgram.run_decompositions: only these ops are rewritten, the rest stays whole."""
