"""The op set: one enum, and one table (`OPS`) that says what every stage asks of each op.

A row gives the op's group (which fixes its arity and how the interpreter, the e-graph and the
lowering treat it), its algebraic properties, its numpy reference implementation (what the op
means; ir/interpret.py runs it) and the name of its term constructor on egraph/terms.py's `Term`.
The groups rules query (UNARY, REDUCE, COMMUTATIVE …) are read off the table, after tinygrad's
GroupOp. A member of `Op` without a row fails at import, here.

No target syntax lives here: the C and CUDA printers keep their own tables in render/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto

import numpy as np


class Op(Enum):
    INPUT = auto()  # a runtime input, arg = its name
    CONST = auto()  # arg = a float (a scalar literal, shape ()) or the name of a tensor in Graph.tensors
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    RECIP = auto()
    SQRT = auto()
    ADD = auto()
    MUL = auto()
    MOD = auto()  # C fmodf: the result has the sign of the dividend
    LESS_THAN = auto()  # 1.0 where a < b, else 0.0
    SUM = auto()  # over one axis (arg), kept as size 1
    MAX = auto()
    # Beyond Luminal's set: an embedding lookup is a load at a data-dependent row. Written in
    # primitives it would be a one-hot (rows × V) matmul, V times the work and memory of the lookup.
    GATHER = auto()  # srcs (table (V, C), ids (...)) → (..., C): out[i, c] = table[ids[i], c]


class Group(Enum):
    LEAF = 0  # no operands: a runtime input or a constant
    UNARY = 1  # elementwise, one operand
    BINARY = 2  # elementwise, two operands of the output's shape
    REDUCE = 3  # one operand, reduced over the axis `arg` (kept as size 1)
    GATHER = 4  # a table and ids: rows of the table at data-dependent indices


ARITY = {Group.LEAF: 0, Group.UNARY: 1, Group.BINARY: 2, Group.REDUCE: 1, Group.GATHER: 2}


@dataclass(frozen=True)
class OpInfo:
    group: Group
    reference: Callable[..., np.ndarray] | None
    """The op in numpy on float32 operand arrays (a reduction: on its operand and the axis);
    None for a leaf, whose value is its arg (interpret.run_node)."""
    term: str | None
    """The name of the op's constructor on egraph.terms.Term; None for a leaf, which terms.py
    encodes from its arg."""
    commutative: bool = False
    associative: bool = False

    @property
    def arity(self) -> int:
        return ARITY[self.group]


OPS: dict[Op, OpInfo] = {
    Op.INPUT: OpInfo(Group.LEAF, None, None),
    Op.CONST: OpInfo(Group.LEAF, None, None),
    Op.EXP2: OpInfo(Group.UNARY, np.exp2, "exp2"),
    Op.LOG2: OpInfo(Group.UNARY, np.log2, "log2"),
    Op.SIN: OpInfo(Group.UNARY, np.sin, "sin"),
    Op.RECIP: OpInfo(Group.UNARY, lambda x: np.float32(1.0) / x, "recip"),
    Op.SQRT: OpInfo(Group.UNARY, np.sqrt, "sqrt"),
    Op.ADD: OpInfo(Group.BINARY, np.add, "add", commutative=True, associative=True),
    Op.MUL: OpInfo(Group.BINARY, np.multiply, "mul", commutative=True, associative=True),
    Op.MOD: OpInfo(Group.BINARY, np.fmod, "mod"),
    Op.LESS_THAN: OpInfo(Group.BINARY, lambda a, b: (a < b).astype(np.float32), "less_than"),
    Op.SUM: OpInfo(Group.REDUCE, lambda x, axis: x.sum(axis=axis, keepdims=True, dtype=np.float32), "sum",
                   associative=True),
    Op.MAX: OpInfo(Group.REDUCE, lambda x, axis: x.max(axis=axis, keepdims=True), "max", associative=True),
    Op.GATHER: OpInfo(Group.GATHER, lambda table, ids: table[ids.astype(np.int64)], "gather"),
}

def _check_table() -> None:
    """Every op has a row, and every op but a leaf has a reference and a term: fails at import."""
    missing = [op.name for op in Op if op not in OPS]
    if missing:
        raise NotImplementedError(f"Op.{', Op.'.join(missing)} has no row in ir/ops.py's OPS: give it a group, "
                                  "a numpy reference and a term name (and its printer entries in render/)")
    for op, info in OPS.items():
        leaf = info.group is Group.LEAF
        if (info.reference is None) != leaf or (info.term is None) != leaf:
            raise NotImplementedError(f"Op.{op.name}: every op but a leaf needs a numpy reference and a term name")


_check_table()


def ops_in(group: Group) -> frozenset[Op]:
    return frozenset(op for op, info in OPS.items() if info.group is group)


UNARY = ops_in(Group.UNARY)
BINARY = ops_in(Group.BINARY)
REDUCE = ops_in(Group.REDUCE)
LEAF = ops_in(Group.LEAF)
ELEMENTWISE = UNARY | BINARY
COMMUTATIVE = frozenset(op for op, info in OPS.items() if info.commutative)
ASSOCIATIVE = frozenset(op for op, info in OPS.items() if info.associative)
