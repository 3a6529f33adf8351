"""The kernel IR: what one kernel computes, as loops and statements, between scheduling and rendering.

`lower.py` turns a scheduled `Kernel` (a fused subgraph writing one buffer) into a `KernelIR`:
output loops with their extents and annotations (parallel, vector, the batch bound), and a body of
statements — locals (`Let`), reductions with their accumulators (`Reduce`), and a `Store` per output —
over expressions that read buffers through views (`Load` at an index expression, `Masked` by a
padding condition). Renderers only print it: render/c.py as OpenMP loops, render/cuda.py with the
output loops mapped to threads. Indices are structures too (`Var`, `Affine`, `Digit`, `RowOf`),
so a pass can ask which loop a read depends on without looking at text.

The fast kernels are IR too, in two modules beside this one: `cpu_ir` (vector loads and stores,
unrolled loops, register tiles, online-softmax accumulators), built by kernel/tiles.py and
kernel/online_softmax.py; `gpu_ir` (the launch frame, thread tiles, shared staging and barriers,
warp reductions), built by kernel/gpu_tiles.py and kernel/gpu_attention.py. Their integer
arithmetic (`IntOp`, `Element`, `Clamp`) is here, since a loop's bound may be one.

Nothing here prints: render/cstyle.py prints indices, expressions and statements in C syntax for
both renderers (the IR knows no target's syntax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lumos.compile.ir.graph import Node, Op, View
from lumos.compile.schedule.kernels import KernelSchedule

# ---------------------------------------------------------------------------------------------
# Indices (integers)


@dataclass(frozen=True)
class Var:
    """A loop variable (or a name a renderer binds, such as a block's row)."""

    name: str


@dataclass(frozen=True)
class Lit:
    value: int


@dataclass(frozen=True)
class Affine:
    """constant + Σ coef · index (a printer leaves out the terms that are zero)."""

    constant: int
    terms: tuple[tuple[int, Index], ...]

    @property
    def live_terms(self) -> list[tuple[int, Index]]:
        """The terms that are not zero whatever the loop indices."""
        return [(coef, index) for coef, index in self.terms if coef != 0 and not is_zero(index)]


@dataclass(frozen=True)
class Digit:
    """(flat / stride) % size: one dim of a flat offset that no sum of loop indices expresses."""

    flat: Index
    stride: int
    size: int


@dataclass(frozen=True)
class RowOf:
    """A data-dependent row: a float id read from a buffer (GATHER)."""

    value: Expr
    rows: int
    """The table's row count: what a bounds check compares against."""


Index = Var | Lit | Affine | Digit | RowOf


def is_zero(index: Index) -> bool:
    """Whether an index is 0 by its form (a literal 0, or a sum with nothing left in it)."""
    if isinstance(index, Lit):
        return index.value == 0
    if isinstance(index, Affine):
        return index.constant == 0 and not index.live_terms
    return False


def index_vars(index: Index) -> set[str]:
    """The loop variables an index depends on."""
    if isinstance(index, Var):
        return {index.name}
    if isinstance(index, Affine):
        return set().union(*(index_vars(i) for coef, i in index.terms if coef))
    if isinstance(index, Digit):
        return index_vars(index.flat)
    if isinstance(index, RowOf):
        return expr_vars(index.value)
    return set()


# ---------------------------------------------------------------------------------------------
# Conditions and expressions (floats)


@dataclass(frozen=True)
class Compare:
    index: Index
    op: str
    """'>=' or '<'."""
    bound: int


Cond = tuple[Compare, ...]
"""A conjunction; () is 'always'. NEVER is the empty region (a mask with lo >= hi)."""
NEVER: Cond = (Compare(Lit(0), "<", 0),)


def conjoin(*conditions: Cond | None) -> Cond | None:
    parts: list[Compare] = []
    for condition in conditions:
        for part in condition or ():
            if part not in parts:
                parts.append(part)
    return tuple(parts) or None


# Integer expressions beyond indices: the fast kernels' own loop arithmetic (kernel/tiles.py,
# kernel/online_softmax.py) and a loop's bound when it is no constant.


@dataclass(frozen=True)
class IntOp:
    """a op b on integers ('+', '-', '*', '/'): the fast kernels' own loop arithmetic."""

    op: str
    a: IntExpr
    b: IntExpr


@dataclass(frozen=True)
class Element:
    """array[at[0]][at[1]]…: an element of a local array (a register tile, a row of sums)."""

    array: str
    at: tuple[IntExpr, ...]


@dataclass(frozen=True)
class Clamp:
    """`index` where it is below `bound`, else `last` (a block's rows past the last: the last)."""

    index: IntExpr
    bound: IntExpr
    last: IntExpr


IntExpr = Index | IntOp | Element | Clamp


@dataclass(frozen=True)
class IntCond:
    """a op b on integers ('<', '<=', '!=')."""

    op: str
    a: IntExpr
    b: IntExpr


def less(a: IntExpr, b: IntExpr) -> IntCond:
    return IntCond("<", a, b)


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Ref:
    """A local computed earlier (a Let, or a reduction's accumulator)."""

    name: str


@dataclass(frozen=True)
class Load:
    buffer: str
    offset: Index
    view: View | None = None
    """The view it reads through (None for a table row of a gather)."""
    indices: tuple[Index, ...] = ()


@dataclass(frozen=True)
class Unary:
    op: Op
    x: Expr


@dataclass(frozen=True)
class Binary:
    op: Op
    """An elementwise op, or SUM / MAX combining two values (a written-out reduction)."""
    a: Expr
    b: Expr


@dataclass(frozen=True)
class Masked:
    """x where `cond` holds (inside a view's padding mask), else 0."""

    cond: Cond
    x: Expr


Expr = Num | Ref | Load | Unary | Binary | Masked


def expr_vars(expr: Expr) -> set[str]:
    if isinstance(expr, Load):
        return index_vars(expr.offset)
    if isinstance(expr, Unary):
        return expr_vars(expr.x)
    if isinstance(expr, Binary):
        return expr_vars(expr.a) | expr_vars(expr.b)
    if isinstance(expr, Masked):
        return expr_vars(expr.x).union(*(index_vars(c.index) for c in expr.cond))
    return set()


def expr_refs(expr: Expr) -> set[str]:
    """The locals an expression reads (a gathered row's id may be one)."""
    if isinstance(expr, Ref):
        return {expr.name}
    if isinstance(expr, Load):
        return index_refs(expr.offset)
    if isinstance(expr, Unary):
        return expr_refs(expr.x)
    if isinstance(expr, Binary):
        return expr_refs(expr.a) | expr_refs(expr.b)
    if isinstance(expr, Masked):
        return expr_refs(expr.x).union(*(index_refs(c.index) for c in expr.cond))
    return set()


def index_refs(index: Index) -> set[str]:
    if isinstance(index, RowOf):
        return expr_refs(index.value)
    if isinstance(index, Affine):
        return set().union(*(index_refs(i) for _, i in index.terms))
    if isinstance(index, Digit):
        return index_refs(index.flat)
    return set()


# ---------------------------------------------------------------------------------------------
# Statements and kernels


@dataclass
class Let:
    """A local: `name = value`, or, under `guard`, `init` unless the guard holds."""

    name: str
    value: Expr
    guard: Cond | None = None
    init: float = 0.0
    note: str = ""
    """A comment printed after it (why it is a local)."""


@dataclass
class Reduce:
    """acc = init; for var in [0, length): body; acc ⊕= value — run only when `guard` holds."""

    acc: str
    op: Op
    """SUM or MAX."""
    var: str
    length: int
    body: list[Stmt]
    value: Expr
    guard: Cond | None = None
    unroll: int = 0
    """Unroll the loop by this factor (0: the compiler decides)."""
    vector: bool = False
    """The body is straight-line (unguarded locals only): the loop vectorizes as a reduction."""

    @property
    def init(self) -> float:
        return 0.0 if self.op is Op.SUM else -math.inf

    @property
    def straight(self) -> bool:
        return all(isinstance(s, Let) and s.guard is None for s in self.body)


@dataclass
class Store:
    buffer: str
    offset: Index
    value: Expr


Stmt = Let | Reduce | Store


@dataclass
class Loop:
    var: str
    extent: int
    batch: bool = False
    """Dim 0 of a symbolic batch: runs to the runtime row count `n` (at most `extent`)."""
    parallel: bool = False
    """Shared out between threads (OpenMP on C; the grid on CUDA)."""
    vector: bool = False
    """Vectorized explicitly (omp simd)."""
    bound: IntExpr | None = None
    """The end when it is no constant (blocks of a symbolic batch: (n + 3) / 4)."""
    step: int = 1


@dataclass
class KernelIR:
    name: str
    node: Node
    params: list[str]
    """Buffers it reads, in the order the driver passes them (after `out`)."""
    loops: list[Loop]
    body: list[Stmt]
    """The statements run per output element; the last is a Store (of the last output)."""
    ops: int
    version_on: Compare | None = None
    """Loop versioning: a padding condition of outer indices that the innermost loop's body tests
    over and over; the innermost loop is emitted twice (condition true, false) so that the
    compiler folds it away and vectorizes each copy."""
    schedule: KernelSchedule = field(default_factory=KernelSchedule)
    also: tuple[Node, ...] = ()
    """Further nodes it writes after `node` (Kernel.also), one Store each."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """The buffers it writes, in the order the driver passes them (before `params`): `out`
        for `node`, then `out1`, `out2`… for `also`."""
        return ("out", *(f"out{position}" for position in range(1, 1 + len(self.also))))


def product_factors(reduce: Reduce) -> tuple[Expr, Expr] | None:
    """A SUM of a product: the product's two operands (through the local it went into)."""
    if reduce.op is not Op.SUM:
        return None
    value = reduce.value
    if isinstance(value, Ref):
        lets = {s.name: s for s in reduce.body if isinstance(s, Let)}
        if value.name in lets and lets[value.name].guard is None:
            value = lets[value.name].value
    if isinstance(value, Binary) and value.op is Op.MUL:
        return value.a, value.b
    return None


@dataclass
class AttentionIR:
    """A fused attention kernel (egraph/attention.py): per query (the `rows` loops), out[dd] =
    Σ_j softmax_j(score · scale) · value[j, dd] in one pass over the keys j (online softmax),
    the scores never stored. `score` is computed after `score_stmts` with `j` bound; `value`
    after `value_stmts` with `j` and `dd` bound; `out` is the output offset with `dd` bound."""

    name: str
    node: Node
    params: list[str]
    rows: list[Loop]
    keys: int
    width: int
    scale: float
    score_stmts: list[Stmt]
    score: Expr
    value_stmts: list[Stmt]
    value: Expr
    out: Index


def stmt_refs(stmt: Stmt) -> set[str]:
    """The locals a statement reads (through its nested statements too)."""
    if isinstance(stmt, Reduce):
        return expr_refs(stmt.value).union(*(stmt_refs(s) for s in stmt.body))
    return expr_refs(stmt.value)


def stmt_vars(stmt: Stmt) -> set[str]:
    """The loop variables a statement names (its own reduction variable included)."""
    guard = set().union(*(index_vars(c.index) for c in getattr(stmt, "guard", None) or ()))
    if isinstance(stmt, Reduce):
        return guard | {stmt.var} | expr_vars(stmt.value) | set().union(*(stmt_vars(s) for s in stmt.body))
    return guard | expr_vars(stmt.value)


def stmt_name(stmt: Stmt) -> str | None:
    return stmt.name if isinstance(stmt, Let) else stmt.acc if isinstance(stmt, Reduce) else None


def needed(stmts: list[Stmt], value: Expr) -> list[Stmt]:
    """The statements of `stmts` that `value` depends on, in order."""
    wanted = expr_refs(value)
    keep = []
    for stmt in reversed(stmts):
        if stmt_name(stmt) in wanted:
            keep.append(stmt)
            wanted |= stmt_refs(stmt)
    return keep[::-1]
