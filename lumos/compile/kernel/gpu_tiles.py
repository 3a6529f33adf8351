"""GPU thread mappings of a kernel: a KernelIR in, a KernelIR whose body says which thread
computes what (kernel/ir.py's GPU section) out; render/cuda.py prints it.

Each kernel takes one frame, chosen by its shape (`map_threads`):

- *tiled*: the kernel's one reduction is a sum of `value · weight` where the weight does not
  depend on some output row loop and the value not on the column loop (passes.match_matmul, the
  matcher the C register blocks use too): 16×16 output tiles per block, 16-step slices of both
  operands staged in shared memory between barriers. The value is computed as it is staged, so a
  fused layer-norm (or GELU) prologue runs there; the statements after the sum (bias, GELU,
  residual) run per output on the summed tile;
- *block*: a reduction of 2048 steps or more at the top of the body: a block of 256 threads per
  output, each taking every 256th step, the warps combining by shuffles and then through shared
  memory; *warp*, for reductions of at least 32 steps (layer norm's statistics, softmax's max and
  sum, a dot product that is no tiled matmul): one warp per output, its lanes taking every 32nd
  step; the rest of the body on every thread, one of them storing;
- *elementwise* (anything else, gathers included): one thread per output element.
"""

from __future__ import annotations

from dataclasses import replace

from lumos.compile.kernel.gpu_ir import (
    Barrier,
    CombineWarps,
    Grid,
    Leader,
    Register,
    Shared,
    SliceLoop,
    StageTile,
    ThreadTile,
    TileOffset,
    TileProduct,
    WarpReduce,
    WarpToShared,
)
from lumos.compile.kernel.ir import KernelIR, Let, Loop, Reduce, Ref, Store, needed
from lumos.compile.kernel.passes import match_matmul

THREADS = 256
"""Threads per block of the elementwise, warp, block and warp-per-query attention kernels."""
WARP = 32
TILE = 16
"""Output tile edge (and reduction slice) of the tiled matmul: 16×16 threads per block."""
WARP_REDUCE_FROM = WARP
"""Top-level reductions at least this long are shared out over a warp's lanes."""
BLOCK_REDUCE_FROM = 2048
"""… and at least this long over a whole block's threads (warp shuffles, then shared memory)."""


def map_threads(ir: KernelIR) -> KernelIR:
    """The kernel in its frame: tiled when it is a matmul, else a block, a warp or a thread per
    output by its longest reduction at the top of the body."""
    tiled = tiled_matmul(ir)
    if tiled is not None:
        return tiled
    longest = max((s.length for s in ir.body if isinstance(s, Reduce)), default=0)
    if longest >= BLOCK_REDUCE_FROM:
        return block_per_output(ir)
    return warp_per_output(ir) if longest >= WARP_REDUCE_FROM else elementwise(ir)


def rows(loops: list[Loop]) -> tuple[bool, int]:
    """Whether `loops` run over the runtime batch, and the product of the other extents."""
    static = 1
    for loop in loops:
        if not loop.batch:
            static *= loop.extent
    return any(loop.batch for loop in loops), static


def digits(loops: list[Loop]) -> list[tuple[str, int | None]]:
    """Every loop variable from a linear index: the last loop fastest, dim 0 the remainder."""
    if not loops:
        return []
    return [(loop.var, loop.extent) for loop in reversed(loops[1:])] + [(loops[0].var, None)]


def elementwise(ir: KernelIR) -> KernelIR:
    batched, static = rows(ir.loops)
    grid = Grid("elementwise", (THREADS, 1, 1), batched, static, THREADS, 1, digits(ir.loops), guarded=True)
    return replace(ir, body=[grid, *ir.body])


def warp_per_output(ir: KernelIR) -> KernelIR:
    batched, static = rows(ir.loops)
    body: list = [Grid("warp", (THREADS, 1, 1), batched, static, THREADS // WARP, 1, digits(ir.loops), guarded=True)]
    for stmt in ir.body:
        if isinstance(stmt, Reduce) and stmt.length >= WARP_REDUCE_FROM:
            body.append(WarpReduce(stmt, "lane", WARP))
        else:
            body.append(Leader("lane", stmt) if isinstance(stmt, Store) else stmt)
    return replace(ir, body=body)


def block_per_output(ir: KernelIR) -> KernelIR:
    """One block per output element: each thread takes every 256th step, the warps combine by
    shuffles and the block through shared memory; thread 0 stores."""
    batched, static = rows(ir.loops)
    warps = THREADS // WARP
    body: list = [Shared("partial", (warps,)),
                  Grid("block", (THREADS, 1, 1), batched, static, 1, 1, digits(ir.loops), guarded=True)]
    for stmt in ir.body:
        if isinstance(stmt, Reduce) and stmt.length >= WARP_REDUCE_FROM:
            body += [WarpReduce(stmt, "threadIdx.x", THREADS),
                     Barrier("partial may still hold the previous reduction's values"),
                     WarpToShared(stmt.acc, "partial"), Barrier(), CombineWarps(stmt.acc, stmt.op, "partial", warps)]
        else:
            body.append(Leader("threadIdx.x", stmt) if isinstance(stmt, Store) else stmt)
    return replace(ir, body=body)


def tiled_matmul(ir: KernelIR) -> KernelIR | None:
    """The shared-memory tiled matmul for the kernels passes.match_matmul accepts (the same ones
    the C renderer can register-block), or None."""
    return tiled_matmuls([ir])


def tiled_matmuls(irs: list[KernelIR]) -> KernelIR | None:
    """The tiled matmul of one output, or of several that multiply the same value by their own
    weights (a query/key/value projection: schedule/products.py, lowered by lower_products): per
    slice the value is staged once (its prologue computed once) and each output's weight slice
    beside it, one sum each; then each output's epilogue under its own column bound (widths may
    differ: the grid covers the widest). None unless every output is a matmul match_matmul
    accepts, over the same rows and steps. That their values are one computation is the join's
    to show (products.py compares them in the graph); only the first output's is staged."""
    matches = [match_matmul(ir, TILE) for ir in irs]
    if any(match is None for match in matches):
        return None
    ir, first = irs[0], matches[0]
    outer = [(loop.var, loop.extent, loop.batch) for loop in ir.loops[:-1]]
    if any(match.row.var != first.row.var or match.column.var != first.column.var
           or match.reduce.length != first.reduce.length
           or [(loop.var, loop.extent, loop.batch) for loop in other.loops[:-1]] != outer
           for match, other in zip(matches[1:], irs[1:], strict=True)):
        return None
    reduce, row = first.reduce, first.row
    others = [loop for loop in ir.loops[:-1] if loop is not row]
    steps = reduce.length
    col_tiles = max(-(-match.column.extent // TILE) for match in matches)
    static_others = [loop for loop in others if not loop.batch]
    _, z = rows(static_others)
    if row.batch:  # the row tiles are the remainder: their count depends on n
        place = [("col_tile", col_tiles), *[(loop.var, loop.extent) for loop in reversed(static_others)],
                 ("row_tile", None)]
        grid = Grid("tiled", (TILE, TILE, 1), True, 1, TILE, col_tiles * z, place, guarded=False)
    else:
        row_tiles = -(-row.extent // TILE)
        place = [("col_tile", col_tiles), ("row_tile", row_tiles), *digits(others)]
        batched = any(loop.batch for loop in others)
        grid = Grid("tiled", (TILE, TILE, 1), batched, col_tiles * row_tiles * z, 1, 1, place, guarded=False)
    row_at, column_at = TileOffset("row_tile", TILE, "ty"), TileOffset("col_tile", TILE, "tx")
    stage_value = StageTile("tile_value", "the value slice, computed as it is staged (a fused prologue runs here)",
                            [(row.var, row_at), (reduce.var, TileOffset("k0", 1, "tx"))],
                            [row, Loop(reduce.var, steps)],
                            needed(first.hoisted, first.value), first.value, "x")
    suffixes = ["", *(str(position) for position in range(1, len(irs)))]  # sum, sum1, …: as out, out1, …
    staged, products, epilogues = [stage_value], [], []
    for suffix, match, output in zip(suffixes, matches, irs, strict=True):
        column_bound = Loop(match.column.var, match.column.extent)
        staged.append(StageTile(f"tile_weight{suffix}", "the weight slice",  # one read: nothing to compute first
                                [(match.column.var, column_at), (match.reduce.var, TileOffset("k0", 1, "ty"))],
                                [column_bound, Loop(match.reduce.var, steps)], None, match.weight, "w"))
        products.append(TileProduct(f"sum{suffix}", "tile_value", f"tile_weight{suffix}", TILE))
        binds = [] if epilogues else [(row.var, row_at), (match.column.var, column_at)]  # bound once, for all
        epilogues.append(ThreadTile("the epilogue, per output", binds, [row, column_bound],
                                    [Let(match.reduce.acc, Ref(f"sum{suffix}")), *output.body[1:]]))
    body = [
        Shared("tile_value", (TILE, TILE + 1)),
        *(Shared(f"tile_weight{suffix}", (TILE, TILE + 1)) for suffix in suffixes),
        grid,
        *(Register(f"sum{suffix}") for suffix in suffixes),
        SliceLoop("k0", steps, TILE, [*staged, Barrier(), *products, Barrier()]),
        *epilogues,
    ]
    return replace(ir, body=body)
