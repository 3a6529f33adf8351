"""One side of a split's users, public or private: a seeded hash of the user id puts each user on
one side for good, so a leaderboard can rank entries on the public side while the private side
stays unseen until the end of a round (a team that submits often cannot tune to it)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa

Side = Literal["public", "private"]
SIDES: tuple[Side, ...] = ("public", "private")


@dataclass(frozen=True)
class UserShare:
    split: str
    """The split whose users are divided; rows of other splits are not touched."""
    public_fraction: float
    """Share of the split's users on the public side."""
    seed: int
    side: Side

    def holds(self, user_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """True for the users on this side (bool array, one per id)."""
        public = np.fromiter((public_hash(self.seed, user) < self.public_fraction for user in user_ids.to_pylist()),
                             dtype=bool, count=len(user_ids))
        return public if self.side == "public" else ~public


def public_hash(seed: int, user_id: object) -> float:
    """A user's place in [0, 1): the same on every machine and Python (unlike hash()), and
    independent of the other users, so a new test user never moves an old one to the other side."""
    digest = hashlib.blake2b(f"{seed}:{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
