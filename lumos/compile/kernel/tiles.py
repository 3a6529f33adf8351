"""The CPU's fast layouts as IR-to-IR passes: a lowered kernel rewritten into register tiles,
vector loads and stores and rows of sums (kernel/ir.py's "Vectors, register tiles and online
softmax"), chosen by the kernel's schedule; the C renderer only prints the result.

- `register_block`: the register-blocked matmul micro-kernel (schedule.rows × schedule.tile);
- `row_wise_layout`: the reduction loop outside the last output loop (a row of sums at once),
  with schedule.tile a tile of columns summed in registers.

`cpu_layout` picks the first that applies, as the renderer always has. What is legal is decided
by the matchers in kernel/passes.py (match_matmul, row_wise); this module only builds.
"""

from __future__ import annotations

from dataclasses import replace

from lumos.compile.kernel.cpu_ir import (
    Accumulate,
    Assign,
    Declare,
    For,
    Identity,
    InterleavedStore,
    IntLet,
    MulAdd,
    PairLoad,
    Splat,
    VectorLoad,
    VectorStore,
)
from lumos.compile.kernel.ir import (
    Clamp,
    Element,
    IntExpr,
    IntOp,
    KernelIR,
    Let,
    Lit,
    Load,
    Loop,
    Num,
    Reduce,
    Ref,
    Var,
    less,
)
from lumos.compile.kernel.passes import Matmul, match_matmul, row_wise
from lumos.compile.schedule.kernels import KernelSchedule

VECTOR = 8
"""Floats per vector of the register-blocked matmul (lumos_f8, one AVX2 register)."""
BLOCK_UNROLL = 4
"""The blocked matmul's reduction loop is unrolled this far: more independent loads in flight."""


def cpu_layout(ir: KernelIR, schedule: KernelSchedule, bfloat16: frozenset[str] = frozenset()) -> KernelIR:
    """The kernel in the layout its schedule asks for: register-blocked, row-wise, or as lowered.
    `bfloat16`: the buffers stored in bfloat16 (a register block loads such a weight in pairs)."""
    return register_block(ir, schedule, bfloat16) or row_wise_layout(ir, schedule) or ir


def _with_loops(ir: KernelIR, loops: list[Loop], body: list, schedule: KernelSchedule) -> KernelIR:
    """`ir` with its output loops and body replaced: the outer loops (all but the last, or
    schedule.collapse of them) shared out between threads, none vectorized, no versioning."""
    outer = len(loops) - 1 if len(loops) > 1 else len(loops)
    if schedule.collapse:
        outer = min(outer, schedule.collapse)
    loops = [replace(loop, parallel=depth < outer, vector=False) for depth, loop in enumerate(loops)]
    return replace(ir, loops=loops, body=body, version_on=None)


def register_block(ir: KernelIR, schedule: KernelSchedule, bfloat16: frozenset[str] = frozenset()) -> KernelIR | None:
    """The register-blocked matmul micro-kernel (schedule.rows × schedule.tile): the kernel's one
    reduction is a sum of `value · weight` where `weight` is a buffer read contiguous along the
    output row and the same for every row of some outer loop `row` (x @ Wᵀ with W stored (in,
    out), or P @ V; passes.match_matmul). Then a block of `rows` rows × `tile` columns is summed
    at once in a register tile: per reduction step, `tile / 8` weight vectors are loaded once and
    shared by the block's rows, and each row's value is loaded once and shared by its columns,
    so the loop does rows·tile/8 FMAs per rows + tile/8 loads (the row-wise loop: one FMA, one
    load and one store of its row accumulator each). With `schedule.lanes` 16 the vectors are 16
    floats (AVX-512): half the FMAs and loads for the same block.

    Rows past the last are clamped to the last (computed, not stored), columns past the last
    whole tile take one dot product each. The prologue (the value's locals: layer norm, GELU)
    is computed once per row and step into arrays before the tiles; the epilogue (bias, GELU,
    residual: the statements after the sum) runs per output on the summed tile. The row loop
    steps by blocks, the column loop is gone; None when the kernel has no such shape (the
    schedule then takes the row-wise layout).

    A weight stored in bfloat16 (in `bfloat16`), over an even number of vectors, is loaded two
    vectors at a time (PairLoad: the even-placed columns and the odd-placed ones, widened by a
    shift and a mask), and the block's sums are interleaved back as they are stored to the tile:
    widening a vector alone costs a shuffle and a shift beside every `rows` FMAs."""
    rows, tile = schedule.rows, schedule.tile
    width = schedule.lanes or VECTOR
    if not rows or not tile or tile % width or len(ir.loops) < 2:
        return None
    if not tile <= ir.loops[-1].extent:
        return None
    match = match_matmul(ir, rows)
    if match is None:
        return None
    reduce, last, size = match.reduce, match.column.var, match.column.extent
    row, extent = match.row.var, match.row.extent
    bound: IntExpr = Var("n") if match.row.batch else Lit(extent)
    blocks = IntOp("/", IntOp("+", Var("n"), Lit(rows - 1)), Lit(rows)) if match.row.batch else None
    loops = [Loop(f"{row}_b", -(-extent // rows), bound=blocks) if loop is match.row else loop for loop in ir.loops[:-1]]
    acc, r, steps = reduce.acc, reduce.var, reduce.length
    m, v, lanes = f"{acc}_m", f"{acc}_v", tile // width
    full = size - size % tile
    first_row, row_of = Var(f"{row}_0"), f"{row}_rows"
    blk, w, tile_sums, x = f"{acc}_blk", f"{acc}_w", f"{acc}_tile", f"{acc}_x"
    prologue, per_step = _block_prologue(match, m, rows)
    stored_rows = less(IntOp("+", first_row, Var(m)), bound)  # the block's rows that exist

    def each(var: str, stop: int, *body, unroll: int = 0, **options) -> For:
        return For(var, Lit(stop), list(body), unroll=unroll, **options)

    column = IntOp("+", Var(f"{last}_0"), IntOp("*", Lit(width), Var(v)))
    pairs = isinstance(match.weight, Load) and match.weight.buffer in bfloat16 and lanes % 2 == 0
    if pairs:  # columns 2·width·v + (0, 2, 4 …) to w[2v], + (1, 3, 5 …) to w[2v + 1]
        pair_column = IntOp("+", Var(f"{last}_0"), IntOp("*", Lit(2 * width), Var(v)))
        loads = each(v, lanes // 2, IntLet(last, pair_column),
                     PairLoad(Element(w, (IntOp("*", Lit(2), Var(v)),)), Element(w, (IntOp("+", IntOp("*", Lit(2), Var(v)), Lit(1)),)),
                              match.weight, width), unroll=lanes // 2)
        stores = each(m, rows, each(v, lanes // 2, InterleavedStore(
            Element(tile_sums, (Var(m), IntOp("*", Lit(2 * width), Var(v)))), width,
            Element(blk, (Var(m), IntOp("*", Lit(2), Var(v)))), Element(blk, (Var(m), IntOp("+", IntOp("*", Lit(2), Var(v)), Lit(1)))))))
    else:
        loads = each(v, lanes, IntLet(last, column), Assign(Element(w, (Var(v),)), VectorLoad(match.weight, width)),
                     unroll=lanes)
        stores = each(m, rows, each(v, lanes, VectorStore(Element(tile_sums, (Var(m), IntOp("*", Lit(width), Var(v)))), width,
                                                          Element(blk, (Var(m), Var(v))))))
    sums = [
        Declare(blk, (rows, lanes), width, note=f"the block's sums: {rows * lanes} vector registers"),
        each(m, rows, each(v, lanes, Assign(Element(blk, (Var(m), Var(v))), Splat(width))), unroll=rows),
        each(r, steps,
             Declare(w, (lanes,), width, note="loaded once, used by every row of the block"),
             loads,
             each(m, rows,
                  IntLet(row, Element(row_of, (Var(m),))),
                  *per_step,
                  Let(x, match.value, note="used by every column of the block"),
                  each(v, lanes, MulAdd(Element(blk, (Var(m), Var(v))), Ref(x), Element(w, (Var(v),))), unroll=lanes),
                  unroll=rows),
             unroll=BLOCK_UNROLL),
        Declare(tile_sums, (rows, tile)),
        stores,
        each(m, rows,
             IntLet(row, IntOp("+", first_row, Var(m))),
             For(last, IntOp("+", Var(f"{last}_0"), Lit(tile)), [
                 Let(acc, Element(tile_sums, (Var(m), IntOp("-", Var(last), Var(f"{last}_0"))))), *match.rest],
                 start=Var(f"{last}_0")),
             also=stored_rows),
    ]
    body = [
        IntLet(first_row.name, IntOp("*", Var(f"{row}_b"), Lit(rows))),
        Declare(row_of, (rows,), integer=True, note="rows past the last: the last again (computed, not stored)"),
        each(m, rows, Assign(Element(row_of, (Var(m),)), Clamp(IntOp("+", first_row, Var(m)), bound, IntOp("-", bound, Lit(1))))),
        *prologue,
        For(f"{last}_0", Lit(full), sums, step=tile),
    ]
    if full < size:  # the columns past the last whole tile: one dot product each
        body.append(each(m, rows,
                         IntLet(row, IntOp("+", first_row, Var(m))),
                         For(last, Lit(size), [
                             Declare(acc, value=Num(0.0)),
                             For(r, Lit(steps), [*per_step, MulAdd(Ref(acc), match.value, match.weight)], braces=True),
                             *match.rest],
                             start=Lit(full)),
                         also=stored_rows))
    return _with_loops(ir, loops, body, schedule)


def _block_prologue(match: Matmul, m: str, rows: int) -> tuple[list, list]:
    """The value's per-step locals (layer norm, GELU of the previous layer) for every row of the
    block, computed once before the column tiles in one vectorized loop per row, into arrays
    that the tiles read; per_step reads row `m`'s. Very long reductions compute them in place
    instead (per_step is then the locals themselves)."""
    if match.prologue is None:
        return [], list(match.hoisted)
    r, row, length = match.reduce.var, match.row.var, match.reduce.length
    steps = {name: f"{name}_steps" for name in match.prologue}
    prologue = [Declare(steps[name], (rows, length)) for name in match.prologue]
    prologue.append(For(m, Lit(rows), [
        IntLet(row, Element(f"{row}_rows", (Var(m),))),
        For(r, Lit(length), [*match.hoisted, *(Assign(Element(steps[name], (Var(m), Var(r))), Ref(name))
                                              for name in match.prologue)], simd=True, braces=True)]))
    return prologue, [Let(name, Element(steps[name], (Var(m), Var(r)))) for name in match.prologue]


def row_wise_layout(ir: KernelIR, schedule: KernelSchedule) -> KernelIR | None:
    """The reduction loop outside the last output loop when that makes its reads contiguous (e.g.
    x @ Wᵀ with W stored transposed, or P @ V): a row of outputs accumulated at once, one
    vectorized pass per reduction step; with schedule.tile, a tile of columns summed in registers
    over the whole reduction."""
    layout = row_wise(ir, schedule.interchange)
    if layout is None:
        return None
    reduce, last, size = layout.reduce, layout.last.var, layout.last.extent
    row = f"{reduce.acc}_row"
    prelude, per_step = _vectorized_prelude(layout.hoisted, layout.arrays, reduce)
    tile = schedule.tile
    r = reduce.var
    if tile and size % tile == 0 and size > tile:
        # Register accumulators: a tile of columns is summed over the whole reduction at once.
        acc, start = f"{reduce.acc}_tile", Var(f"{last}_0")
        body = [
            Declare(row, (size,)),
            *prelude,
            For(f"{last}_0", Lit(size), [
                Declare(acc, (tile,)),
                For("jj", Lit(tile), [Assign(Element(acc, (Var("jj"),)), Identity(reduce.op))]),
                For(r, Lit(reduce.length), [
                    *per_step,
                    For("jj", Lit(tile), [IntLet(last, IntOp("+", start, Var("jj"))), *layout.inner,
                                          Accumulate(reduce.op, Element(acc, (Var("jj"),)), reduce.value)], simd=True)],
                    braces=True),
                For("jj", Lit(tile), [Assign(Element(row, (IntOp("+", start, Var("jj")),)), Element(acc, (Var("jj"),)))]),
            ], step=tile),
        ]
    else:
        body = [
            Declare(row, (size,)),
            For(last, Lit(size), [Assign(Element(row, (Var(last),)), Identity(reduce.op))]),
            *prelude,
            For(r, Lit(reduce.length), [
                *per_step,
                For(last, Lit(size), [*layout.inner, Accumulate(reduce.op, Element(row, (Var(last),)), reduce.value)],
                    simd=True, braces=True)],
                braces=True),
        ]
    body.append(For(last, Lit(size), [Let(reduce.acc, Element(row, (Var(last),))), *layout.rest]))
    return _with_loops(ir, ir.loops[:-1], body, schedule)


def _vectorized_prelude(hoisted: list[Let], arrays: list[str] | None, reduce: Reduce) -> tuple[list, list]:
    """The per-step locals (e.g. GELU of the previous layer) computed for all steps first, in one
    vectorized loop into arrays, instead of one scalar evaluation per step (arrays None: in place)."""
    if arrays is None:
        return [], list(hoisted)
    r = reduce.var
    prelude = [Declare(f"{name}_steps", (reduce.length,)) for name in arrays]
    prelude.append(For(r, Lit(reduce.length), [*hoisted, *(Assign(Element(f"{name}_steps", (Var(r),)), Ref(name))
                                                            for name in arrays)], simd=True, braces=True))
    return prelude, [Let(name, Element(f"{name}_steps", (Var(r),))) for name in arrays]
