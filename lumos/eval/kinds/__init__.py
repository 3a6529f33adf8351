"""Eval task kinds: the names a task spec's `kind` key may take, each with how it is scored.

A kind is a `TaskKind` record of functions (kind.py): its default metrics, how a model is scored
(which labels it reads, which head), its "no model" baselines, and what a leaderboard submission of
it holds (`Prediction`: its column, rules, checks, and its scoring by the same metric code as the
model's). One module per kind builds one.
A new kind is a new module here, added to KINDS below; the task loader accepts exactly these names,
and `lumos.eval.score` dispatches through them.
"""

from __future__ import annotations

from lumos.eval.kinds import binary, embedding_probe, next_items, regression, retrieval, user_label
from lumos.eval.kinds.kind import Scores, TaskKind

KINDS: dict[str, TaskKind] = {kind.name: kind for kind in (retrieval.KIND, next_items.KIND, binary.KIND, regression.KIND,
                                                            embedding_probe.KIND, user_label.KIND)}

__all__ = ["KINDS", "Scores", "TaskKind"]
