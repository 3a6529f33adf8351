"""The Lumos model: an encoder over a user's history, a decoder with one query per prediction slot.

Read top-down, smallest piece first: attention → MLP → blocks → config → model. The forward uses
only simple ops (linear, embedding, layer norm, GELU, softmax attention, masking, matmul) because
the compiler lowers it to primitives.

The encoder is bidirectional by default. With `encoder_attention = "causal"` and
`position_targets`, the next-item slot is trained at every history position, SASRec's dense
training with Lumos's decoder kept (`decode_positions`).

Shapes: B rows, T history tokens, S = 1 + T encoder positions (the user token first),
Q decoder slots, H horizons, V items, C = d_model, n_heads heads of size D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lumos.core.config import require_valid
from lumos.data.contract import FIRST_TOKEN_ID, PADDING_ID, TIME_FEATURES, Batch, FeatureSpec

HEADS = ("retrieval", "binary", "regression")


def signed_log1p(x: Tensor) -> Tensor:
    """sign(x) * log(1 + |x|): amounts, counts and ages are heavy-tailed, and may be negative (refunds)."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def signed_expm1(y: Tensor) -> Tensor:
    """The inverse of `signed_log1p`: turns a regression prediction back into a value."""
    return torch.sign(y) * torch.expm1(torch.abs(y))


def memory_mask_of(mask: Tensor) -> Tensor:
    """(B, S) True for the encoder positions that are real: the user token (always) and the history."""
    return torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)


def last_position_of(memory_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, S) float one-hot of each row's last real encoder position. Real positions come first
    (right padding), so it is the mask minus the mask shifted left: no indexing, which the
    compiler lowers as plain elementwise ops."""
    real = memory_mask.to(dtype)
    return real - torch.cat([real[:, 1:], real.new_zeros(real.shape[0], 1)], dim=1)


class Attention(nn.Module):
    """Multi-head attention of `x` over `context` (itself for self-attention).

    softmax: the usual normalized attention. silu: HSTU's pointwise aggregated attention (Zhai et
    al. 2024): each allowed key weighs silu(q·k/√D + bias), not normalized against the other keys
    (so how much of the history agrees is kept, not only which part), averaged over the allowed
    keys; the heads' output is then LayerNormed and gated by silu(U x) before the projection.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, attention_dropout: float,
                 kind: Literal["softmax", "silu"] = "softmax"):
        super().__init__()
        self.n_heads = n_heads
        self.attention_dropout = attention_dropout
        self.kind = kind
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        # HSTU's U: a gate on the aggregated values (silu only).
        self.gate = nn.Linear(d_model, d_model) if kind == "silu" else None
        self.output_ln = nn.LayerNorm(d_model) if kind == "silu" else None
        self.proj = nn.Linear(d_model, d_model)
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, context: Tensor, allowed: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        """`allowed` (B, 1, 1 or L, S), True = this query may attend to this key; None = all.
        `bias` (1, nh, L, S) added to every score (relative position bias); None = none."""
        B, L, C = x.shape
        S = context.shape[1]
        q = self.query(x).view(B, L, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, L, D)
        k, v = self.key_value(context).split(C, dim=2)  # (B, S, C) each
        k = k.view(B, S, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, S, D)
        v = v.view(B, S, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, S, D)
        dropout = self.attention_dropout if self.training else 0.0
        if self.kind == "silu":
            y = self._pointwise(q, k, v, allowed, bias, dropout)
        else:
            if bias is not None:  # a float mask: the bias, -inf where not allowed
                allowed = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)  # (B, nh, L, D)
        y = y.transpose(1, 2).reshape(B, L, C)  # (B, L, C)
        if self.kind == "silu":
            y = self.output_ln(y) * F.silu(self.gate(x))
        return self.residual_dropout(self.proj(y))

    @staticmethod
    def _pointwise(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None,
                   dropout: float) -> Tensor:
        """(B, nh, L, D) the mean over allowed keys of silu(score) * value. A mean over the keys
        each query may see, not HSTU's division by a fixed length: a row's output then does not
        depend on how long the other rows of its batch are (the LayerNorm after makes the scale
        moot either way)."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, nh, L, S)
        if bias is not None:
            scores = scores + bias
        weights = F.silu(scores)
        if allowed is not None:
            allowed = allowed.to(weights.dtype)
            weights = weights * allowed
            count = allowed.sum(dim=-1, keepdim=True).clamp(min=1.0)  # (B, 1, L or 1, 1)
        else:
            count = float(k.shape[-2])
        weights = F.dropout(weights, p=dropout) if dropout else weights
        return (weights / count) @ v


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class EncoderBlock(nn.Module):
    """Pre-LayerNorm: the residual stream stays unnormalized, which keeps deep stacks trainable."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(config.d_model, config.n_heads, config.dropout, config.resolved_attention_dropout,
                              config.attention)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff, config.dropout)

    def forward(self, x: Tensor, allowed: Tensor, bias: Tensor | None = None) -> Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, allowed, bias)
        return x + self.mlp(self.ln_2(x))


class DecoderBlock(nn.Module):
    """Slots attend to each other (a horizon can use what the next-item slot found), then to the history."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.self_attn = Attention(config.d_model, config.n_heads, config.dropout, config.resolved_attention_dropout)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.cross_attn = Attention(config.d_model, config.n_heads, config.dropout, config.resolved_attention_dropout)
        self.ln_3 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config.d_model, config.d_ff, config.dropout)

    def forward(self, x: Tensor, memory: Tensor, slots_allowed: Tensor | None, memory_allowed: Tensor) -> Tensor:
        h = self.ln_1(x)
        x = x + self.self_attn(h, h, slots_allowed)
        x = x + self.cross_attn(self.ln_2(x), memory, memory_allowed)
        return x + self.mlp(self.ln_3(x))


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 64
    """Width of every token, slot and embedding (C); must be divisible by n_heads."""
    n_heads: int = 4
    """Attention heads in every attention layer."""
    encoder_layers: int = 2
    """Transformer blocks over the history."""
    decoder_layers: int = 1
    """Blocks over the prediction slots (self-attention, cross-attention to the history, MLP).
    0: no decoder; each slot is its learned query (plus, with position_targets, the encoder's state
    at the last real position, which makes the next-item slot SASRec's last-position output)
    through a LayerNorm."""
    d_ff: int = 256
    """Hidden width of every MLP."""
    dropout: float = 0.1
    """Dropout on embeddings, residual branches and (unless attention_dropout is set) attention
    weights; 0 <= dropout < 1."""
    attention_dropout: float | None = None
    """Dropout on attention weights; None: as `dropout`. 0 lets PyTorch's fused attention kernel
    run, where dropout makes it draw a mask over every (query, key) pair: on 2 CPU cores at
    MovieLens's 201-token rows, 0.20 s a training step against 0.40 s."""
    max_len: int | None = None
    """Size of the positional table: the longest history the model accepts (>= the data's max_len).
    None: the data's max_len (the ingest's tokens.max_len, from the feature spec)."""
    heads: tuple[str, ...] = HEADS
    """Active heads, each with its loss: retrieval (next item), binary (acts within K days),
    regression (value within K days)."""
    retrieval: Literal["full", "sampled"] = "full"
    """Retrieval loss: softmax over the full item vocabulary, or over the target plus `negatives`
    items sampled uniformly (for large vocabularies)."""
    negatives: int = 256
    """Negatives per batch for the sampled retrieval loss, shared by all rows."""
    encoder_attention: Literal["bidirectional", "causal"] = "bidirectional"
    """bidirectional: every history token sees the whole history. causal: each token sees only the
    user token and older tokens, so every position holds a summary of the history up to it (what
    position_targets trains)."""
    user_token: bool = True
    """A learned vector in the first encoder position, beside the static user attributes. Off: that
    position holds the static attributes only (zeros without any), still a key that every query,
    and a row with no history, can attend to."""
    attention: Literal["softmax", "silu"] = "softmax"
    """The encoder's attention: softmax, or HSTU's pointwise silu attention with a gated,
    normalized output (Zhai et al. 2024; `Attention`). The decoder's stays softmax."""
    relative_position_bias: bool = False
    """A learned bias per head and distance between query and key position, added to every
    encoder attention score (HSTU's rab^p; T5's relative attention), shared by the layers. HSTU's
    bias over time gaps is not offered: the table holds each token's gap to the previous one
    (gap_bucket), not the timestamps that pairwise gaps need."""
    position_targets: bool = False
    """With causal attention and the retrieval head: the next-item slot is trained at every encoder
    position (cross-attending to the history up to it, predicting the token that follows; the
    row's target after the last), as SASRec trains, so one row gives a target per history token
    instead of one. Then the next-item slot attends to no other slot, so that every position's
    query is computed alike."""
    scale_item_embedding: bool = False
    """Multiply the item embedding by sqrt(d_model) where it enters the encoder (Vaswani et al.
    2017, SASRec). The table is shared with the retrieval scores, which start it small (std
    0.02); scaled, the item outweighs the position and feature embeddings in each history token
    from the first step, where unscaled it is one of several equal parts and learns slowly."""
    item_projection: bool = True
    """A learned linear map (with bias) from the next-item slot's output to the item space. Off:
    the slot's output scores the items directly, SASRec's tied h·E."""
    item_bias: bool = True
    """A learned per-item offset added to every retrieval score (popularity). Off: an item scores
    by its embedding alone, as in SASRec."""
    exclude_seen_in_loss: bool = False
    """The retrieval loss's softmax leaves out the items already in the history (up to each
    position), as ranking with exclude_history does at evaluation and inference. Where users never
    repeat an item (MovieLens: one rating per movie), the model then spends nothing on ranking
    what a user has seen below what they will see, and items like the history may score high.
    Keep it off where items repeat (purchases). Needs retrieval = "full"."""
    ignore_features: tuple[str, ...] = ()
    """History features of the table the model does not read, e.g. ["hour", "weekday"]: to measure
    what a feature is worth, or to match a baseline that sees items only. The item feature is
    always read (the retrieval head scores against its table)."""

    @property
    def resolved_attention_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def __post_init__(self) -> None:
        problems = []
        for name in ("d_model", "n_heads", "encoder_layers", "d_ff", "max_len", "negatives"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append((name, f"must be at least 1, got {getattr(self, name)}"))
        if self.decoder_layers < 0:
            problems.append(("decoder_layers", f"must be at least 0, got {self.decoder_layers}"))
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            problems.append(("d_model", f"must be divisible by n_heads ({self.n_heads}), got {self.d_model}"))
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                problems.append((name, f"must be in [0, 1), got {value}"))
        unknown = [head for head in self.heads if head not in HEADS]
        if unknown:
            problems.append(("heads", f"unknown head(s) {unknown}; choose from {list(HEADS)}"))
        elif not self.heads:
            problems.append(("heads", f"needs at least one of {list(HEADS)}"))
        if self.position_targets and self.encoder_attention != "causal":
            problems.append(("position_targets", "needs encoder_attention = \"causal\" (else a position sees its target)"))
        if self.exclude_seen_in_loss and self.retrieval != "full":
            problems.append(("exclude_seen_in_loss", 'needs retrieval = "full"'))
        if self.position_targets and "retrieval" not in self.heads:
            problems.append(("position_targets", "needs the retrieval head in heads"))
        if self.decoder_layers == 0 and (not self.position_targets or tuple(self.heads) != ("retrieval",)):
            problems.append(("decoder_layers", "0 needs position_targets and heads = [\"retrieval\"]: without a "
                             "decoder no other slot reads the history"))
        require_valid(problems)


@dataclass
class ModelOutput:
    user_embedding: Tensor
    """(B, C) pooled, normalized user embedding: what downstream tasks and daily inference use."""
    item_query: Tensor | None
    """(B, C) the next-item slot's query; item scores = item_query @ item table.T (+ item bias)."""
    act_logits: Tensor | None
    """(B, H) logit that the user acts within each horizon."""
    value_pred: Tensor | None
    """(B, H) value within each horizon in signed-log1p space; `signed_expm1` turns it back (that is
    a median-like estimate, not the mean, as is any prediction trained in log space)."""
    memory: Tensor | None = None
    """(B, S, C) encoder output, the user token first: what the position_targets loss reads."""


class LumosModel(nn.Module):
    def __init__(self, config: ModelConfig, features: FeatureSpec):
        super().__init__()
        self.config, self.features = config, features
        n_horizons = len(features.horizons_days)
        problems = []
        # The longest history the model accepts: model.max_len when set, else the data's.
        self.max_len = features.max_len if config.max_len is None else config.max_len
        if features.max_len > self.max_len:
            problems.append(f"model.max_len ({self.max_len}) is below the data's max_len ({features.max_len})")
        if "retrieval" in config.heads and not features.next_item:
            problems.append("the retrieval head needs next_item targets, which the data lacks")
        for head in ("binary", "regression"):
            if head in config.heads and not n_horizons:
                problems.append(f"the {head} head needs horizons_days, which the data lacks")
        unknown = [name for name in config.ignore_features
                   if name not in features.token_categorical and name not in features.token_numeric]
        if unknown:
            problems.append(f"model.ignore_features names {unknown}, which the data lacks "
                            f"(it has {[*features.token_categorical, *features.token_numeric]})")
        if features.item_feature in config.ignore_features:
            problems.append(f"model.ignore_features cannot hold the item feature {features.item_feature!r}")
        if problems:
            raise ValueError("; ".join(problems) + "; set model.heads / model.max_len / model.ignore_features to match the data")
        C = config.d_model

        # Encoder inputs: one table per token feature (the item table doubles as the retrieval output).
        # Time features are written 0-based (hour 0 is midnight, weekday 0 is Monday), so for them
        # 0 is a real value, not padding; padding is excluded by the mask either way.
        self.token_embeddings = nn.ModuleDict(
            {
                name: nn.Embedding(size, C, padding_idx=None if name in TIME_FEATURES else PADDING_ID)
                for name, size in features.token_categorical.items()
                if name not in config.ignore_features
            }
        )
        # Not persistent, it follows from the config: 1 for each numeric column read, 0 for ignored
        # ones (a product rather than a column selection, which the compiler lowers elementwise).
        numeric_read = [float(name not in config.ignore_features) for name in features.token_numeric]
        self.register_buffer("numeric_read", torch.tensor(numeric_read), persistent=False)
        n_numeric = len(features.token_numeric) if any(numeric_read) else 0
        self.token_numeric = nn.Linear(n_numeric, C, bias=False) if n_numeric else None
        self.position = nn.Embedding(self.max_len, C)  # index 0 = the most recent token
        # The user token: static attributes on their own pathway, plus (model.user_token) a learned
        # vector. The position is there either way: a row with no history still has a key.
        self.user_token = nn.Parameter(torch.zeros(C)) if config.user_token else None
        self.static_embeddings = nn.ModuleDict(
            {name: nn.Embedding(size, C) for name, size in features.static_categorical.items()}
        )
        n_static = len(features.static_numeric)
        self.static_numeric = nn.Linear(n_static, C, bias=False) if n_static else None
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.encoder = nn.ModuleList([EncoderBlock(config) for _ in range(config.encoder_layers)])
        # Not persistent: (S, S) lower triangle for causal attention, sliced to the batch's length.
        S_max = self.max_len + 1
        self.register_buffer("causal", torch.ones(S_max, S_max, dtype=torch.bool).tril(), persistent=False)
        if config.relative_position_bias:
            # Distance query - key, shifted to index [0, 2 S_max - 1): position 0 is the user token.
            distance = torch.arange(S_max)[:, None] - torch.arange(S_max)[None, :]
            self.register_buffer("relative_index", distance + S_max - 1, persistent=False)
            self.relative_position = nn.Embedding(2 * S_max - 1, config.n_heads)
        else:
            self.relative_position = None
        self.encoder_ln = nn.LayerNorm(C)
        # No affine: no loss reaches the pooled embedding, so learned scale and shift would never
        # train (and DDP rejects parameters that get no gradient).
        self.pool_ln = nn.LayerNorm(C, elementwise_affine=False)

        # Decoder slots: [next item] + one per horizon, each with its own averaging of the calendar.
        slot_weights = []
        if features.next_item:
            slot_weights.append([1.0] + [0.0] * (features.future_slots - 1))  # the day of the cut
        for K in features.horizons_days:
            slot_weights.append([1.0 / K] * K + [0.0] * (features.future_slots - K))  # mean of days 1..K
        # Not persistent: it follows from the FeatureSpec, so the state dict holds only parameters.
        self.register_buffer("slot_context_weights", torch.tensor(slot_weights), persistent=False)  # (Q, L)
        self.slot_queries = nn.Parameter(torch.zeros(len(slot_weights), C))
        # (Q, Q) True = may attend. With position_targets the next-item slot sees only itself, as
        # at every position in training; the horizon slots still read it.
        slots_allowed = torch.ones(len(slot_weights), len(slot_weights), dtype=torch.bool)
        slots_allowed[0, 1:] = not config.position_targets
        self.register_buffer("slots_allowed", slots_allowed, persistent=False)
        n_flags = len(features.future_flags)
        self.future_context = nn.Linear(n_flags, C, bias=False) if n_flags else None
        self.decoder = nn.ModuleList([DecoderBlock(config) for _ in range(config.decoder_layers)])
        self.decoder_ln = nn.LayerNorm(C)

        # Heads. Retrieval is tied: it *uses* the encoder's item table, never a registered copy, so
        # the state dict has no shared tensors (safetensors refuses them).
        retrieval = "retrieval" in config.heads
        self.item_projection = (nn.Linear(C, C) if config.item_projection else nn.Identity()) if retrieval else None
        self.item_bias = (nn.Parameter(torch.zeros(features.item_vocab_size))
                          if retrieval and config.item_bias else None)
        self.item_input_scale = math.sqrt(C) if config.scale_item_embedding else None
        self.act_head = nn.Linear(C, 1) if "binary" in config.heads else None
        self.value_head = nn.Linear(C, 1) if "regression" in config.heads else None
        # Kendall et al. 2018: s = log sigma^2 per task, learned with the weights.
        self.log_variance = nn.ParameterDict({head: nn.Parameter(torch.zeros(())) for head in config.heads})
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        # As in GPT-2: each residual branch adds variance, so shrink the layers that write into it.
        n_residual = 2 * self.config.encoder_layers + 3 * self.config.decoder_layers
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") and name.startswith(("encoder.", "decoder.")):
                nn.init.normal_(param, std=0.02 / math.sqrt(n_residual))
        if self.user_token is not None:
            nn.init.normal_(self.user_token, std=0.02)
        nn.init.normal_(self.slot_queries, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def item_table(self) -> Tensor:
        return self.token_embeddings[self.features.item_feature].weight  # (V, C)

    # -- encoder --------------------------------------------------------------------------------

    def encode(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The history with the user token in front: memory (B, S, C) and its key mask (B, S)."""
        mask = batch.mask  # (B, T)
        B, T = mask.shape
        # Right-padded: count positions back from each row's last real token, so that index 0 is
        # always "most recent" whatever the row's length. Padded positions clamp to 0 (never attended).
        length = mask.sum(dim=1, keepdim=True)  # (B, 1)
        recency = (length - 1 - torch.arange(T, device=mask.device)).clamp(min=0)  # (B, T)
        x = self.position(recency)  # (B, T, C)
        for name, table in self.token_embeddings.items():
            embedded = table(batch.tokens[name])  # (B, T, C)
            if name == self.features.item_feature and self.item_input_scale is not None:
                embedded = embedded * self.item_input_scale
            x = x + embedded
        if self.token_numeric is not None:
            x = x + self.token_numeric(signed_log1p(batch.numeric * self.numeric_read))

        user = self.user_token.expand(B, -1) if self.user_token is not None else x.new_zeros(B, x.shape[-1])  # (B, C)
        for name, table in self.static_embeddings.items():
            user = user + table(batch.static_categorical[name])
        if self.static_numeric is not None:
            user = user + self.static_numeric(signed_log1p(batch.static_numeric))
        x = torch.cat([user[:, None, :], x], dim=1)  # (B, S, C)
        memory_mask = memory_mask_of(mask)

        x = self.embedding_dropout(x)
        S = T + 1
        allowed = memory_mask[:, None, None, :]  # (B, 1, 1, S): padding is never a key
        if self.config.encoder_attention == "causal":
            allowed = allowed & self.causal[:S, :S]  # (B, 1, S, S)
        bias = None
        if self.relative_position is not None:
            bias = self.relative_position(self.relative_index[:S, :S]).permute(2, 0, 1)[None]  # (1, nh, S, S)
        for block in self.encoder:
            x = block(x, allowed, bias)
        return self.encoder_ln(x), memory_mask

    def pool(self, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Masked mean over real positions and the user token, then LayerNorm: (B, S, C) → (B, C)."""
        weights = memory_mask.to(memory.dtype)  # (B, S)
        weights = weights / weights.sum(dim=1, keepdim=True)  # never 0: the user token counts
        return self.pool_ln((memory * weights[:, :, None]).sum(dim=1))

    def embed_users(self, batch: Batch) -> Tensor:
        """(B, C) pooled user embedding, without running the decoder or heads."""
        return self.pool(*self.encode(batch))

    # -- decoder and heads ----------------------------------------------------------------------

    def decode(self, batch: Batch, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """(B, Q, C) slot outputs: [next item] + one per horizon."""
        x = self.slot_queries.expand(memory.shape[0], -1, -1)  # (B, Q, C)
        if self.future_context is not None:
            context = self.slot_context_weights @ batch.future  # (Q, L) @ (B, L, F) → (B, Q, F)
            x = x + self.future_context(context)
        if self.config.position_targets:
            # The next-item slot starts from the encoder's state at the last real position, as it
            # does at every position in training (`decode_positions`).
            latest = (memory * last_position_of(memory_mask, memory.dtype)[:, :, None]).sum(dim=1, keepdim=True)  # (B, 1, C)
            x = torch.cat([x[:, :1] + latest, x[:, 1:]], dim=1)
        x = self.embedding_dropout(x)
        slots_allowed = self.slots_allowed if self.config.position_targets else None
        memory_allowed = memory_mask[:, None, None, :]  # (B, 1, 1, S): padding is never a key
        for block in self.decoder:
            x = block(x, memory, slots_allowed, memory_allowed)
        return self.decoder_ln(x)

    def decode_positions(self, batch: Batch, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """(B, S, C) the next-item slot's output at every encoder position s: it starts from the
        encoder's state at s (the slot's query alone could not tell which keys are the latest that
        s may see) and attends to memory 0..s only. At the last real position this is `decode`'s
        next-item slot; the calendar of the cut day is known there only, so the other positions
        get no calendar context."""
        B, S = memory_mask.shape
        x = self.slot_queries[0] + memory  # (B, S, C)
        if self.future_context is not None:
            context = self.future_context(self.slot_context_weights[0] @ batch.future)  # (B, C)
            x = x + last_position_of(memory_mask, context.dtype)[:, :, None] * context[:, None, :]
        x = self.embedding_dropout(x)
        itself = torch.eye(S, dtype=torch.bool, device=x.device)  # each position's slot sees only itself
        memory_allowed = memory_mask[:, None, None, :] & self.causal[:S, :S]  # (B, 1, S, S)
        for block in self.decoder:
            x = block(x, memory, itself, memory_allowed)
        return self.decoder_ln(x)

    def forward(self, batch: Batch) -> ModelOutput:
        memory, memory_mask = self.encode(batch)
        slots = self.decode(batch, memory, memory_mask)  # (B, Q, C)
        horizon_slots = slots[:, 1:] if self.features.next_item else slots  # (B, H, C)
        return ModelOutput(
            user_embedding=self.pool(memory, memory_mask),
            item_query=self.item_projection(slots[:, 0]) if self.item_projection is not None else None,
            act_logits=self.act_head(horizon_slots).squeeze(-1) if self.act_head is not None else None,
            value_pred=self.value_head(horizon_slots).squeeze(-1) if self.value_head is not None else None,
            memory=memory,
        )

    def score_items(self, batch: Batch, output: ModelOutput | None = None) -> Tensor:
        """(B, V) scores over the whole item vocabulary; padding and OOV ids are -inf."""
        if self.item_projection is None:
            raise ValueError("score_items needs the retrieval head; add 'retrieval' to model.heads")
        output = output if output is not None else self(batch)
        scores = output.item_query @ self.item_table.T + self._item_bias()  # (B, V)
        return scores.masked_fill(self._unrecommendable(scores.device), float("-inf"))

    def _item_bias(self, ids: Tensor | None = None) -> Tensor | float:
        """The score offset of every item (V,), or of `ids`; 0 with model.item_bias off."""
        if self.item_bias is None:
            return 0.0
        return self.item_bias if ids is None else self.item_bias[ids]

    def _unrecommendable(self, device: torch.device) -> Tensor:
        return torch.arange(self.features.item_vocab_size, device=device) < FIRST_TOKEN_ID  # (V,)

    # -- losses ---------------------------------------------------------------------------------

    def retrieval_loss(self, query: Tensor, target: Tensor, seen: Tensor | None = None) -> Tensor:
        """Mean cross-entropy over rows with a recommendable target; 0 when there are none.

        `seen` (B, K), "full" only: ids of items left out of each row's softmax, 0 where unused;
        the row's target is never left out. Ids rather than a (B, V) mask: K is the history's
        length, V may be millions.

        Rows whose target is padding (no next item) or OOV (cannot be scored) are ignored.
        "sampled" scores the target against `negatives` ids drawn uniformly from [2, V) with the
        global RNG (training is seeded), shared by the batch. Under uniform sampling the logQ
        correction is the same constant for every item, so it cancels in the softmax and is omitted.
        A negative that equals a row's target is masked out for that row.
        """
        has_target = target >= FIRST_TOKEN_ID  # (B,)
        if self.config.retrieval == "full":
            logits = query @ self.item_table.T + self._item_bias()  # (B, V)
            logits = logits.masked_fill(self._unrecommendable(logits.device), float("-inf"))
            if seen is not None:  # id 0 is padding, at -inf already
                logits = logits.scatter(1, seen.masked_fill(seen == target[:, None], 0), float("-inf"))
            labels = target
        else:
            V = self.features.item_vocab_size
            negatives = torch.randint(FIRST_TOKEN_ID, V, (self.config.negatives,), device=target.device)  # (N,)
            positive = (query * self.item_table[target]).sum(-1) + self._item_bias(target)  # (B,)
            negative = query @ self.item_table[negatives].T + self._item_bias(negatives)  # (B, N)
            negative = negative.masked_fill(negatives[None, :] == target[:, None], float("-inf"))
            logits = torch.cat([positive[:, None], negative], dim=1)  # (B, 1 + N)
            labels = torch.zeros_like(target)
        labels = labels.masked_fill(~has_target, -100)  # cross_entropy's ignore_index
        total = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
        return total / has_target.sum().clamp(min=1)

    def history_items(self, batch: Batch) -> Tensor:
        """(B, T) the history's ids of this model's item feature (`Batch.history_items`)."""
        return batch.history_items(self.features.item_feature)

    def position_targets(self, batch: Batch) -> Tensor:
        """(B, S) the item each encoder position predicts: position s has seen the user token and
        history tokens 0..s-1, so it predicts history token s, and the last real one the row's
        next_item. Padding (0) after that; OOV ids (1) are ignored by the loss like padding."""
        items = self.history_items(batch)  # (B, T)
        targets = torch.cat([items, items.new_zeros(items.shape[0], 1)], dim=1)  # (B, S)
        length = batch.mask.sum(dim=1, keepdim=True)  # (B, 1): the position after the last real token
        return targets.scatter(1, length, batch.next_item[:, None])

    def seen_items(self, batch: Batch) -> Tensor:
        """(B, S, T) the item ids each encoder position has seen: position s has seen history
        tokens 0..s-1; 0 (padding) elsewhere."""
        items = self.history_items(batch)  # (B, T)
        T = items.shape[1]
        seen = torch.arange(T, device=items.device) < torch.arange(T + 1, device=items.device)[:, None]  # (S, T)
        return torch.where(seen, items[:, None, :], 0)

    def loss(self, batch: Batch, output: ModelOutput | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Total loss with learned uncertainty weights, and each task's loss (detached) for logging.

        total = sum over tasks of exp(-s) * L + s: a noisy task learns a large s and a small weight,
        and the + s term stops s from growing without bound.
        """
        output = output if output is not None else self(batch)
        losses: dict[str, Tensor] = {}
        if self.config.position_targets:
            targets = self.position_targets(batch)  # (B, S)
            keep = targets >= FIRST_TOKEN_ID
            slots = self.decode_positions(batch, output.memory, memory_mask_of(batch.mask))  # (B, S, C)
            seen = self.seen_items(batch)[keep] if self.config.exclude_seen_in_loss else None  # (N, T)
            losses["retrieval"] = self.retrieval_loss(self.item_projection(slots[keep]), targets[keep], seen)
        elif "retrieval" in self.config.heads:
            seen = self.history_items(batch) if self.config.exclude_seen_in_loss else None  # (B, T)
            losses["retrieval"] = self.retrieval_loss(output.item_query, batch.next_item, seen)
        if "binary" in self.config.heads:
            losses["binary"] = F.binary_cross_entropy_with_logits(output.act_logits, batch.act)
        if "regression" in self.config.heads:
            # Spend is heavy-tailed: in log space one whale does not dominate the batch.
            losses["regression"] = F.mse_loss(output.value_pred, signed_log1p(batch.value))
        s = self.log_variance
        total = sum(torch.exp(-s[task]) * loss + s[task] for task, loss in losses.items())
        return total, {task: loss.detach() for task, loss in losses.items()}
