"""Kernel IR for the CUDA kernels: thread tiles, shared staging, barriers.

What the CUDA kernels add to a kernel body: which thread (warp, block) computes which output,
operands staged in shared memory between barriers, reductions shared by a warp's lanes, and the
online-softmax accumulators of attention. kernel/gpu_tiles.py and kernel/gpu_attention.py build
them (a KernelIR in, a KernelIR whose body holds them out); render/cuda.py prints them. Names a
launch frame binds (lane, warp, tx, ty; threadIdx.x itself) appear as plain strings; the attention
nodes share the flash frame's names: j0 (a key slice's first key), jn (how many keys it has), jj (a
key within it), j (the key), dd (an output column), qv, o, m, l (SoftmaxState).
"""

from __future__ import annotations

from dataclasses import dataclass

from lumos.compile.ir.graph import Op
from lumos.compile.kernel.ir import Expr, Index, Loop, Reduce, Stmt


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
