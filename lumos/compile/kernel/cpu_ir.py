"""Kernel IR for the CPU's fast kernels: vectors, register tiles and online softmax.

What the register-blocked matmul, the row-wise layouts (kernel/tiles.py) and the fused attention
(kernel/online_softmax.py) are made of: vector loads and stores, unrolled loops, register tiles, a
running max, sum and rescaled output row. They sit in a KernelIR's body beside Let and Store;
their integer arithmetic is spelled out (kernel/ir.py's IntOp), their arrays are locals of the
kernel (Element). render/cstyle.py prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lumos.compile.ir.graph import Node, Op
from lumos.compile.kernel.ir import (
    Element,
    Expr,
    IntCond,
    IntExpr,
    Lit,
    Load,
    Loop,
    Ref,
)


@dataclass(frozen=True)
class Identity:
    """The first value of a reduction by `op`: 0 for SUM, -inf for MAX."""

    op: Op


@dataclass(frozen=True)
class Arith:
    """a op b ('+', '-', '*', '/') on floats or vectors of them, lane by lane."""

    op: str
    a: Expr
    b: Expr


@dataclass(frozen=True)
class VectorLoad:
    """`width` consecutive floats from `at` on (a buffer read or a local array's element); with
    `first`, only the first `first` of them, the other lanes 0 (nothing read past them)."""

    at: Load | Element
    width: int
    first: IntExpr | None = None


@dataclass(frozen=True)
class Splat:
    """A vector of `width` lanes, each `value`."""

    width: int
    value: float = 0.0


@dataclass(frozen=True)
class FirstLanes:
    """x's first n lanes, `fill` in the others (the last keys of a block, fewer than a vector)."""

    x: Expr
    n: IntExpr
    fill: float
    width: int


@dataclass(frozen=True)
class LaneReduce:
    """The SUM or MAX (NaN wins) of a vector's lanes."""

    op: Op
    x: Expr
    width: int


@dataclass(frozen=True)
class Exp2NonPositive:
    """2^x for x <= 0 (a softmax's scores less their running max), of a float or lane by lane."""

    x: Expr
    width: int = 0


@dataclass
class Declare:
    """A local: one value or an array (`dims`) of floats, ints or vectors of `width` floats;
    with `value`, its first value. A register tile is an array of vectors (rows × vector columns)."""

    name: str
    dims: tuple[int, ...] = ()
    width: int = 0
    integer: bool = False
    value: Expr | None = None
    note: str = ""
    constant: bool = False
    long: bool = False
    """A 64-bit integer (an offset into a buffer)."""


@dataclass
class Declares:
    """Locals of one kind declared together."""

    declares: list[Declare]


@dataclass
class IntLet:
    """const int name = value: a loop index of the fast kernels' own; `also`: more of them, bound
    at once (each in turn)."""

    name: str
    value: IntExpr
    also: tuple[tuple[str, IntExpr], ...] = ()
    long: bool = False
    note: str = ""


@dataclass
class Assign:
    target: Element | Ref | Load
    """A local, or a buffer's element (the output)."""
    value: Expr | IntExpr
    note: str = ""


@dataclass
class Accumulate:
    """target ⊕= value for the reduction op (SUM or MAX); lane by lane when `width`."""

    op: Op
    target: Element | Ref
    value: Expr
    width: int = 0


@dataclass
class Rescale:
    """target *= factor: an online softmax's running output row when its running max grows."""

    target: Element | Ref
    factor: Expr


@dataclass
class Prefetch:
    """Ask for the cache line of a read before it is needed."""

    at: Load


@dataclass
class Transpose:
    """The `width` vectors of `width` floats of `array` transposed in place (in registers)."""

    array: str
    width: int


@dataclass
class Scope:
    """Statements in a block of their own (their locals end with it); `inline`: on one line."""

    body: list
    inline: bool = False


@dataclass
class If:
    cond: tuple[IntCond, ...]
    body: list
    note: str = ""


@dataclass
class Skip:
    """Go on with the loop's next iteration unless `cond` holds."""

    unless: tuple[IntCond, ...]


@dataclass
class MulAdd:
    """target += a · b (one FMA per lane when they are vectors)."""

    target: Element | Ref
    a: Expr
    b: Expr


@dataclass
class VectorStore:
    at: Element
    width: int
    value: Expr


@dataclass
class PairLoad:
    """2·width bfloat16 from `at` on as two vectors of width floats: `even` gets the elements at
    even places, `odd` the rest (one load, a shift and a mask: no shuffle, where widening a vector
    of width takes a zero-extending shuffle and a shift)."""

    even: Element
    odd: Element
    at: Load
    width: int


@dataclass
class InterleavedStore:
    """`even` and `odd` (vectors of width floats) interleaved into 2·width floats at `at`: what a
    PairLoad split, back in order."""

    at: Element
    width: int
    even: Expr
    odd: Expr


@dataclass
class For:
    """for var in [start, stop) by step, while `also` holds too. `unroll`: fully or by that factor;
    `simd`: vectorized explicitly; `braces`: its body is a block even when it is one statement."""

    var: str
    stop: IntExpr | None
    body: list
    start: IntExpr | None = Lit(0)
    step: int | None = None
    """By this many (None: one at a time, var++)."""
    also: IntCond | None = None
    unroll: int = 0
    simd: bool = False
    braces: bool = False
    test: IntCond | None = None
    """The condition that goes on, when it is not var < stop (start None: var is declared outside)."""
    reduction: tuple[Op, str] | None = None
    """Vectorized as a reduction of this local by this op."""
    note: str = ""


TileStmt = (Declare | Declares | IntLet | Assign | Accumulate | MulAdd | Rescale | VectorStore | PairLoad | InterleavedStore
            | Prefetch | Transpose | Scope | If | Skip | For)
"""The fast kernels' statements (beside Let, Reduce and Store)."""


@dataclass
class FusedAttention:
    """A fused attention kernel as the printer takes it (kernel/online_softmax.py builds it):
    `locals` per thread, the `loops` over queries (all shared out between threads; the query loop
    steps by `per_block`) and the `body` per block of queries."""

    name: str
    node: Node
    params: list[str]
    keys: int
    per_block: int
    written: Node | None
    """The node it was fused from when that one is stored in another dim order."""
    locals: list
    loops: list[Loop]
    body: list
