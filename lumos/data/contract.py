"""The data contract: what a sequences table holds, what the loader yields and the model consumes.

`FeatureSpec` says which columns of `<dataset>.sequences` feed which part of the model and how
large each vocabulary is; it is derived from the table's schema and its vocab table, saved beside
every checkpoint, and enough (with the model config) to rebuild the model. `Batch` is what the
loader yields and the model consumes: padded tensors, one per role. The id constants and the
time features are the numbers ingest writes and every reader relies on. It lives in data/, the
lowest layer that writes these tables, so that data, train, eval, compile and infer import it
downward.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from lumos.data.recipe import TokenSpec

if TYPE_CHECKING:  # only annotations name torch: ingest's Spark workers import this module, torch costs 1.4 s
    import torch

# Time features the ingest writes for every token, with their fixed vocabulary sizes.
TIME_FEATURES = {"hour": 24, "weekday": 7, "gap_bucket": 16}

# Vocabulary ids: 0 pads a history, 1 is out of vocabulary; real tokens count from 2, so ids below
# FIRST_TOKEN_ID are never a vocab row and never recommended.
PADDING_ID = 0
OOV_ID = 1
FIRST_TOKEN_ID = 2


@dataclass(frozen=True)
class FeatureSpec:
    token_categorical: dict[str, int]
    """History array columns of ids → vocabulary size (ids are < size), e.g. item, event_type,
    cat_device, hour, weekday, gap_bucket. For vocabulary features 0 is padding and 1 OOV; the time
    features (TIME_FEATURES) use 0 as a real value (midnight, Monday, first token), so padding is
    told apart by Batch.mask, never by id."""
    token_numeric: tuple[str, ...]
    """History array columns of floats, e.g. value, num_<name>, count, age_days."""
    static_categorical: dict[str, int] = field(default_factory=dict)
    """Per-row id columns (user_<name>) → vocabulary size."""
    static_numeric: tuple[str, ...] = ()
    """Per-row float columns (user_<name>)."""
    future_flags: tuple[str, ...] = ()
    """future_<flag> array columns: the known-future calendar context of each decoder slot."""
    horizons_days: tuple[int, ...] = ()
    """Horizons K with act_<K>d (binary) and value_<K>d (regression) targets."""
    next_item: bool = True
    """Whether rows carry a next_item target (retrieval over the item vocabulary)."""
    item_feature: str = "item"
    """The token feature whose embedding table the retrieval head scores against (tied)."""
    max_len: int = TokenSpec.max_len
    """The longest history the table holds (the recipe's tokens.max_len, whose default this is)."""

    def __post_init__(self) -> None:
        if self.next_item and self.item_feature not in self.token_categorical:
            raise ValueError(f"next_item needs the {self.item_feature!r} token feature")

    @property
    def future_slots(self) -> int:
        """Decoder slots that carry calendar context: one per day up to the longest horizon."""
        return max(self.horizons_days, default=1)

    @property
    def item_vocab_size(self) -> int:
        return self.token_categorical[self.item_feature]


@dataclass
class Batch:
    """A padded mini-batch. B rows, T = the longest history in the batch (≤ max_len).

    Histories are right-padded: position t < length holds the t-th oldest kept token.
    """

    tokens: dict[str, torch.Tensor]
    """(B, T) int64 per token_categorical feature; 0 where padded."""
    numeric: torch.Tensor
    """(B, T, len(token_numeric)) float32; 0 where padded."""
    mask: torch.Tensor
    """(B, T) bool: True for real tokens."""
    static_categorical: dict[str, torch.Tensor]
    """(B,) int64 per static_categorical feature."""
    static_numeric: torch.Tensor
    """(B, len(static_numeric)) float32."""
    future: torch.Tensor
    """(B, future_slots, len(future_flags)) float32."""
    next_item: torch.Tensor
    """(B,) int64 item id of the target; 0 (padding) when the row has none."""
    act: torch.Tensor
    """(B, len(horizons_days)) float32 in {0, 1}."""
    value: torch.Tensor
    """(B, len(horizons_days)) float32."""

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    def history_items(self, item_feature: str) -> torch.Tensor:
        """(B, T) the history's item ids, 0 (padding) where the mask is False: what ranking
        excludes with exclude_history."""
        return self.tokens[item_feature].masked_fill(~self.mask, 0)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        def move(value):
            if isinstance(value, dict):
                return {key: tensor.to(device, non_blocking=non_blocking) for key, tensor in value.items()}
            return value.to(device, non_blocking=non_blocking)

        return Batch(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def pin_memory(self) -> Batch:
        def pin(value):
            if isinstance(value, dict):
                return {key: tensor.pin_memory() for key, tensor in value.items()}
            return value.pin_memory()

        return Batch(**{f.name: pin(getattr(self, f.name)) for f in fields(self)})
