"""The kernel IR: what one kernel computes, as loops and statements, between scheduling and rendering.

`lower.py` turns a scheduled `Kernel` (a fused subgraph writing one buffer) into a `KernelIR`:
output loops with their extents and annotations (parallel, vector, the batch bound), and a body of
statements — locals (`Let`), reductions with their accumulators (`Reduce`), and one `Store` —
over expressions that read buffers through views (`Load` at an index expression, `Masked` by a
padding condition). Renderers only print it: `render_c` as OpenMP loops, `render_cuda` with the
output loops mapped to threads. Indices are structures too (`Var`, `Affine`, `Digit`, `RowOf`),
so a pass can ask which loop a read depends on without looking at text.

The CPU's fast kernels are IR too ("Vectors, register tiles and online softmax" below): vector
loads and stores, unrolled loops, register tiles, a running max, sum and rescaled output row.
IR-to-IR passes build them from a lowered kernel (kernel/tiles.py: the register-blocked matmul
and the row-wise layouts; kernel/online_softmax.py: the fused attention).

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
    """The statements run per output element; the last is the Store."""
    ops: int
    version_on: Compare | None = None
    """Loop versioning: a padding condition of outer indices that the innermost loop's body tests
    over and over; the innermost loop is emitted twice (condition true, false) so that the
    compiler folds it away and vectorizes each copy."""
    schedule: KernelSchedule = field(default_factory=KernelSchedule)


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


# ---------------------------------------------------------------------------------------------
# -- Vectors, register tiles and online softmax
# What the CPU's fast kernels are made of: kernel/tiles.py rewrites a lowered kernel into these
# (the register-blocked matmul, the row-wise layouts), and the printer only prints them. They sit
# in a KernelIR's body beside Let and Store; their integer arithmetic is spelled out (IntOp),
# their arrays are locals of the kernel (Element).


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


TileStmt = Declare | Declares | IntLet | Assign | Accumulate | MulAdd | Rescale | VectorStore | Prefetch | Transpose | Scope | If | Skip | For
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


# -- GPU: thread tiles, shared staging, barriers
# What the CUDA kernels add to a kernel body: which thread (warp, block) computes which output,
# operands staged in shared memory between barriers, reductions shared by a warp's lanes, and the
# online-softmax accumulators of attention. kernel/gpu_tiles.py and kernel/gpu_attention.py build
# them (a KernelIR in, a KernelIR whose body holds them out); render/cuda.py prints them. Names a
# launch frame binds (lane, warp, tx, ty; threadIdx.x itself) appear as plain strings; the
# attention nodes share the flash frame's names: j0 (a key slice's first key), jn (how many keys it
# has), jj (a key within it), j (the key), dd (an output column), qv, o, m, l (SoftmaxState).


@dataclass
class Grid:
    """The launch frame: blocks of `threads`, ⌈rows·mult / per⌉·groups of them (rows: the runtime
    row count n when `batched`, else 1), and where this thread's (warp's, block's) outputs are,
    decoded from its linear index u: each digit (name, extent), fastest first, takes u % extent
    and divides it out; a digit without an extent takes the rest. `kind` names the frame in the
    renderer's table (how its threads make u)."""

    kind: str
    threads: tuple[int, int, int]
    batched: bool
    mult: int
    per: int
    groups: int
    digits: list[tuple[str, int | None]]
    guarded: bool
    """Threads past the last output (u >= rows · mult) return at once."""


@dataclass(frozen=True)
class TileOffset:
    """An index `tile · size + thread`: the thread's element of a block's tile (size 1: `tile` is
    a slice's first step already)."""

    tile: str
    size: int
    thread: str


@dataclass
class Shared:
    """A block's shared-memory array of floats."""

    name: str
    dims: tuple[int, ...]


@dataclass
class Barrier:
    """Every thread of the block waits here: shared memory written before is seen after."""

    why: str = ""


@dataclass
class Register:
    """A thread's accumulator: `name = init`, added to later."""

    name: str
    init: float = 0.0


@dataclass
class Leader:
    """`body` (a store) run by one thread of those that computed the same (`thread` == 0)."""

    thread: str
    body: Stmt


@dataclass
class WarpReduce:
    """A reduction whose steps threads share: each takes every `stride`th step from its `lane`, then
    a warp's lanes combine by shuffles (lumos_warp_sum / _max), every lane ending with the result."""

    reduce: Reduce
    lane: str
    stride: int


@dataclass
class WarpToShared:
    """Lane 0 of each warp writes the warp's `acc` to `partial[warp]`."""

    acc: str
    partial: str


@dataclass
class CombineWarps:
    """Every thread combines the `warps` values of `partial` (after a barrier) into `acc`."""

    acc: str
    op: Op
    partial: str
    warps: int


@dataclass
class SliceLoop:
    """for var in [0, length) step `step`: a reduction (or the keys) a slice at a time; `count`, if
    named, binds how many steps this slice has (the last may be short)."""

    var: str
    length: int
    step: int
    body: list
    count: str | None = None


@dataclass
class StageTile:
    """This thread's element of an operand tile in shared memory, `tile[ty][tx]`: its indices bound
    (`binds`), `value` where every bound holds, else 0. `prologue`: statements computing the value as
    it is staged (a fused layer norm, GELU); None: the value is one read."""

    tile: str
    why: str
    binds: list[tuple[str, TileOffset]]
    bounds: list[Loop]
    prologue: list[Stmt] | None
    value: Expr
    local: str


@dataclass
class TileProduct:
    """acc += Σ_kk a[ty][kk] · b[kk][tx] over two staged `size`×`size` tiles: this thread's output's
    share of one slice."""

    acc: str
    a: str
    b: str
    size: int


@dataclass
class ThreadTile:
    """This thread's outputs of the block's tile (one each on a 16×16 block): their loop indices
    bound from the tile's and the thread's place, `body` run where every bound holds."""

    why: str
    binds: list[tuple[str, TileOffset]]
    bounds: list[Loop]
    body: list


@dataclass
class ClampedRow:
    """A thread's row `name` = `at` (= `index`), clamped to the last row: threads past the end
    compute along (their block needs them to stage) but store nothing."""

    name: str
    at: str
    index: TileOffset
    extent: int


@dataclass
class QueryRow:
    """The thread's query row, read into registers qv[var] once."""

    var: str
    depth: int
    value: Expr


@dataclass
class SoftmaxState:
    """Online softmax's accumulators: running max m, sum l and output row o[width] (zeroed), and
    the query row in registers when the scores are dot products against staged keys."""

    width: int
    query: QueryRow | None = None


@dataclass
class StageRows:
    """The block stages `rows` key rows (from the slice's first key j0, `count` of them real, the
    rest 0) of `cols` values each into `tile[jj][var]`, `threads` elements at a time; neighbouring
    threads take neighbouring keys when `along_keys` (reads contiguous along them), else
    neighbouring values of one key."""

    tile: str
    why: str
    var: str
    rows: int
    cols: int
    threads: int
    value: Expr
    along_keys: bool


@dataclass
class OverStaged:
    """For each key jj of the staged slice (j = j0 + jj): `body`."""

    body: list


@dataclass
class StagedDot:
    """acc = Σ_var qv[var] · tile[jj][var]: the score's dot product against a staged key."""

    acc: str
    var: str
    depth: int
    tile: str


@dataclass(frozen=True)
class SharedRead:
    """A value read from a shared-memory tile at named indices."""

    tile: str
    indices: tuple[str, ...]


@dataclass
class OnlineSoftmax:
    """One key's step of online softmax: s = score; the running max m moves to max(m, s), l and
    o rescaled by 2^((m - m')·scale) and p = 2^((s - m')·scale) added with p · value[dd]. `value`
    is computed per dd after `value_stmts`, or read from a staged tile."""

    score: Expr
    scale: float
    width: int
    value_stmts: list[Stmt]
    value: Expr | SharedRead


@dataclass
class Strided:
    """for var from `start` (a lane) below `length`, every `stride`th: one lane's share of a loop."""

    var: str
    start: str
    length: int
    stride: int
    body: list
    why: str


@dataclass
class MergeLanes:
    """Each lane's online softmax rescaled to the warp's max and summed across the warp; lane 0
    stores o / l at `out` (dd bound)."""

    scale: float
    width: int
    out: Index


@dataclass
class SoftmaxStore:
    """out[`out`] = o[dd] / l for every dd, where the row `bound` holds."""

    width: int
    out: Index
    bound: Loop
