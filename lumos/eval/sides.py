"""A task's public and private sides: its test users split by a seeded hash of the user id.

Leaderboards rank and show the public side; the private side is shown only with `lumos eval
leaderboard --private`, for the task's owner at the end of a round, so a team that submits often
cannot tune to it. Scores on a side are logged as `public/<metric>` and `private/<metric>` beside
the whole split's `<metric>` (which gates and promotion read, as before). Only tasks that take
submissions have sides: an embedding probe is scored on a model's embeddings, never on a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from lumos.data.user_share import SIDES, UserShare
from lumos.eval.kinds import KINDS
from lumos.eval.tasks import TaskSpec


def user_sides(spec: TaskSpec) -> tuple[UserShare, ...]:
    """The task's public and private user shares; none when it has no private side."""
    if KINDS[spec.kind].prediction is None or spec.public_fraction >= 1:
        return ()
    return tuple(UserShare(spec.split, spec.public_fraction, spec.public_seed, side) for side in SIDES)


def side_metrics(spec: TaskSpec, score: Callable[[UserShare], Mapping[str, float]]) -> dict[str, float]:
    """`score` on each side of the task's users, as side/metric → value."""
    return {f"{share.side}/{name}": value for share in user_sides(spec) for name, value in score(share).items()}


def on_side(metrics: Mapping[str, float], side: str) -> dict[str, float]:
    """The metrics of one side, by their plain names."""
    prefix = f"{side}/"
    return {name.removeprefix(prefix): value for name, value in metrics.items() if name.startswith(prefix)}


def whole_split(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics of the whole split (those without a side)."""
    return {name: value for name, value in metrics.items() if not name.startswith(tuple(f"{side}/" for side in SIDES))}
