"""Transform passes on the kernel IR: which row-wise layout a kernel takes, decided on structure.

- `row_wise`: the kernel's one reduction can move outside its last output loop (a row of sums at
  once), with its locals split into those that change along the row and those that do not;
- `match_matmul`: the one matmul matcher: the reduction is a sum of value · weight, the weight a
  buffer read that moves with the output column and not with some output row loop. The C
  renderer's register-blocked micro-kernel and the CUDA renderer's shared-memory tiles both
  start from it (each adds what its layout needs).

Nothing here looks at emitted text: reads are `Load`s with their views and indices, locals are
`Let`s, and "depends on" is a set of loop variables or local names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace

from lumos.compile.ir.graph import Op, View
from lumos.compile.kernel.ir import (
    NEVER,
    Affine,
    AttentionIR,
    Binary,
    Compare,
    Cond,
    Expr,
    KernelIR,
    Let,
    Load,
    Loop,
    Masked,
    Reduce,
    Ref,
    RowOf,
    Stmt,
    Unary,
    Var,
    expr_refs,
    expr_vars,
    index_refs,
    index_vars,
    product_factors,
)


def top_reduces(ir: KernelIR) -> list[Reduce]:
    """The reductions at the top of the kernel body whose loop holds only unguarded locals: the
    ones a row-wise layout can move."""
    return [s for s in ir.body if isinstance(s, Reduce) and s.guard is None and s.straight]


def stride_along(load: Load, var: str) -> int:
    """How far a read moves when `var` steps by one (the sum of the strides of the view dims
    whose index names `var`)."""
    return sum(abs(stride) for stride, index in zip(load.view.strides, load.indices, strict=True)
               if var in index_vars(index))


def buffer_reads(stmts: list[Stmt], value: Expr) -> list[Load]:
    """Every read through a view in `stmts` and `value`, once per occurrence (a gather's table row,
    read at a data-dependent index, is not one; its ids are)."""
    found: list[Load] = []

    def visit(expr: Expr) -> None:
        if isinstance(expr, Load):
            rows = [index for index in expr.indices if isinstance(index, RowOf)]
            if rows:
                for row in rows:
                    visit(row.value)
            else:
                found.append(expr)
        for child in ("x", "a", "b"):
            if hasattr(expr, child):
                visit(getattr(expr, child))

    for stmt in stmts:
        visit(stmt.value)
    visit(value)
    return found


def strided_reads(loads: list[Load], var: str) -> int:
    return sum(1 for load in loads if stride_along(load, var) > 1)


def split_row_locals(lets: list[Let], last: str) -> tuple[list[Let], list[Let]]:
    """A reduction body's locals that do not change along the output row `last` (hoisted: once per
    reduction step) and those that do (inner: once per output)."""
    hoisted, inner, varying = [], [], set()
    for let in lets:
        if last in expr_vars(let.value) or expr_refs(let.value) & varying:
            inner.append(let)
            varying.add(let.name)
        else:
            hoisted.append(let)
    return hoisted, inner


@dataclass
class RowWise:
    """The reduction moved outside the last output loop `last`."""

    reduce: Reduce
    last: Loop
    hoisted: list[Let]
    inner: list[Let]
    arrays: list[str] | None
    """Hoisted locals the inner loop reads: computed for every step first (one vectorized loop),
    into arrays; None: the hoisted locals are computed in place, per step."""
    rest: list[Stmt]
    """What follows the reduction, once per output."""


ROW_LIMIT = 1024
"""A row of accumulators longer than this stays in the dot-product layout."""
PROLOGUE_LIMIT = 4096
"""Per-step locals of longer reductions are computed in place, not into arrays first."""


def row_wise(ir: KernelIR, interchange: bool | None) -> RowWise | None:
    """The row-wise layout, when legal (the kernel's one movable reduction comes first) and wanted
    (`interchange` True; None: when it makes more reads contiguous than it makes strided)."""
    reduces = top_reduces(ir)
    if len(ir.loops) < 2 or len(reduces) != 1 or ir.body[0] is not reduces[0]:
        return None
    reduce, last = reduces[0], ir.loops[-1]
    if last.extent > ROW_LIMIT or interchange is False:
        return None
    reads = buffer_reads(reduce.body, reduce.value)
    if interchange is None and strided_reads(reads, last.var) >= strided_reads(reads, reduce.var):
        return None
    hoisted, inner = split_row_locals(reduce.body, last.var)
    users = set().union(expr_refs(reduce.value), *(expr_refs(let.value) for let in inner))
    arrays = None if not hoisted or reduce.length > PROLOGUE_LIMIT else [let.name for let in hoisted if let.name in users]
    return RowWise(reduce, last, hoisted, inner, arrays, ir.body[1:])


@dataclass
class Matmul:
    """sum_r value(row, r) · weight(r, column): the kernel's one reduction as a matrix product."""

    reduce: Reduce
    value: Expr
    weight: Load
    column: Loop
    row: Loop
    hoisted: list[Let]
    """The value's per-step locals (a fused prologue: layer norm, GELU of the previous layer)."""
    prologue: list[str] | None
    """Hoisted locals the value reads directly: computed per row and step into arrays first
    (None: the hoisted locals are computed in place, per row and step)."""
    rest: list[Stmt]
    """The epilogue: what follows the sum, once per output (bias, GELU, residual)."""


def match_matmul(ir: KernelIR, rows: int) -> Matmul | None:
    """The register-blocked matmul's shape: a sum of `value · weight` where the weight is a buffer
    read contiguous along the output row and the same for every row of some outer loop, chosen as
    the innermost such loop with at least `rows` iterations (else the innermost)."""
    reduces = top_reduces(ir)
    if len(ir.loops) < 2 or len(reduces) != 1 or ir.body[0] is not reduces[0]:
        return None
    reduce, column = reduces[0], ir.loops[-1]
    factors = product_factors(reduce)
    if reduce.op is not Op.SUM or factors is None or column.extent > ROW_LIMIT:
        return None
    summand = reduce.value.name if isinstance(reduce.value, Ref) else None
    lets = [let for let in reduce.body if let.name != summand]  # the product's own local: the update replaces it
    hoisted, inner = split_row_locals(lets, column.var)
    along = [factor for factor in factors if column.var in expr_vars(factor)]
    if inner or len(along) != 1 or (summand and any(summand in expr_refs(let.value) for let in lets)):
        return None
    weight = along[0]
    value = factors[1 - factors.index(weight)]
    if (not isinstance(weight, Load) or any(isinstance(i, RowOf) for i in weight.indices)
            or stride_along(weight, column.var) != 1 or index_refs(weight.offset) & {let.name for let in hoisted}):
        return None  # not one contiguous vector load per step, or not the same for every row
    shared = [loop for loop in ir.loops[:-1] if loop.var not in expr_vars(weight)]
    if not shared:
        return None
    row = next((loop for loop in reversed(shared) if loop.extent >= rows), shared[-1])
    prologue = (None if not hoisted or reduce.length > PROLOGUE_LIMIT
                else [let.name for let in hoisted if let.name in expr_refs(value)])
    return Matmul(reduce, value, weight, column, row, hoisted, prologue, ir.body[1:])


@dataclass
class ScoreDot:
    """A fused attention's score as a dot product q · k followed by an epilogue (scale, mask)."""

    dot: Reduce
    key: Load
    """The key operand: one read, contiguous along the keys j, the same for every query."""
    query_value: Expr
    epilogue: list[Stmt]
    """The score's statements after the dot product (reading its accumulator)."""


def match_scores(ir: AttentionIR, query: str, contiguous: bool = True) -> ScoreDot | None:
    """The score's dot product, when it comes first and is a plain sum of query · key (no other
    locals in its loop), the key a direct read that does not move with `query` (and, when
    `contiguous`, moves by one along j: one vector load per step on the CPU)."""
    movable = [s for s in ir.score_stmts if isinstance(s, Reduce) and s.guard is None and s.straight]
    if len(movable) != 1 or ir.score_stmts[0] is not movable[0]:
        return None
    dot = movable[0]
    factors = product_factors(dot)
    summand = dot.value.name if isinstance(dot.value, Ref) else None
    if factors is None or any(let.name != summand for let in dot.body):
        return None
    keyed = [factor for factor in factors if "j" in expr_vars(factor)]
    if len(keyed) != 1 or query in expr_vars(keyed[0]):
        return None
    key = keyed[0]
    if not isinstance(key, Load) or any(isinstance(i, RowOf) for i in key.indices):
        return None
    if contiguous and stride_along(key, "j") != 1:
        return None
    return ScoreDot(dot, key, factors[1 - factors.index(key)], ir.score_stmts[1:])


STAGED = "kt"
"""The name of a fused attention kernel's per-thread buffer of one (batch, head)'s keys."""


@dataclass
class StagedKeys:
    ir: AttentionIR
    """The kernel reading its keys from STAGED."""
    key: Load
    """Where the keys are read from otherwise (what fills STAGED)."""
    var: str
    """The scores' sum variable (the first index of STAGED)."""
    depth: int
    """Its length (the head size)."""


def stage_keys(ir: AttentionIR, query: str) -> StagedKeys | None:
    """The kernel reading its keys from STAGED (laid out [sum][keys], contiguous along the keys)
    instead of where their producer wrote them: when the score is q · k with k one read that is
    not already contiguous along the keys."""
    dot = ir.score_stmts[0] if ir.score_stmts and isinstance(ir.score_stmts[0], Reduce) else None
    if dot is None:
        return None
    # The keys read through the copy's view broadcast over the queries, so Lowering.operand bound
    # them to a local of the dot's loop: put the read back in its place.
    while let := next((s for s in dot.body if isinstance(s, Let) and isinstance(s.value, Load) and s.guard is None), None):
        rest = [s for s in dot.body if s is not let]
        dot = replace(dot, body=_swap(rest, Ref(let.name), let.value), value=_swap(dot.value, Ref(let.name), let.value))
    ir = replace(ir, score_stmts=[dot, *ir.score_stmts[1:]])
    scores = match_scores(ir, query, contiguous=False)
    if scores is None or stride_along(scores.key, "j") == 1:
        return None
    r, depth = scores.dot.var, scores.dot.length
    staged = Load(STAGED, Affine(0, ((ir.keys, Var(r)), (1, Var("j")))), View((depth, ir.keys), (ir.keys, 1)),
                  (Var(r), Var("j")))
    swapped = replace(ir, score_stmts=_swap(ir.score_stmts, scores.key, staged), score=_swap(ir.score, scores.key, staged))
    return StagedKeys(swapped, scores.key, r, depth)


def _swap(tree, old: Expr, new: Expr):
    """`tree` (statements, expressions, lists of them) with every `old` replaced by `new`."""
    if tree == old:
        return new
    if isinstance(tree, list):
        return [_swap(item, old, new) for item in tree]
    if isinstance(tree, tuple):
        return tuple(_swap(item, old, new) for item in tree)
    if is_dataclass(tree) and type(tree).__module__ == Load.__module__:
        changed = {f.name: _swap(getattr(tree, f.name), old, new) for f in fields(tree)}
        return replace(tree, **changed)
    return tree


def annotate_loops(ir: KernelIR) -> None:
    """Which loops run in parallel (the outer ones: all but the last, or schedule.collapse of
    them), whether the innermost one is vectorized, and loop versioning on an invariant guard."""
    loops = ir.loops
    if not loops:
        return
    outer = loops[:-1] if len(loops) > 1 else loops
    if ir.schedule.collapse:
        outer = outer[:ir.schedule.collapse]
    for loop in outer:
        loop.parallel = True
    if len(loops) > 1:  # an innermost loop of its own, inside the parallel ones
        straight = all(isinstance(s, Let) and s.guard is None for s in ir.body[:-1])
        loops[-1].vector = bool(ir.schedule.simd) and straight
        ir.version_on = invariant_guard(ir.body, {loop.var for loop in loops[:-1]})


def invariant_guard(body: list[Stmt], outer: set[str]) -> Compare | None:
    """The padding condition (e.g. `i1 >= 1`) tested most often in `body` that names only one of
    the `outer` loop indices, if any."""
    counts: dict[Compare, int] = {}
    for cond in _conditions(body):
        for compare in cond:
            if isinstance(compare.index, Var) and compare.index.name in outer and compare != NEVER[0]:
                counts[compare] = counts.get(compare, 0) + 1
    if not counts:
        return None
    # Ties go to the first in the order of the printed conditions (name, then operator, then bound).
    return max(sorted(counts, key=lambda c: (c.index.name, c.op, str(c.bound))), key=counts.get)


def _conditions(stmts: list[Stmt]) -> list[Cond]:
    found: list[Cond] = []

    def visit(expr: Expr) -> None:
        if isinstance(expr, Masked):
            found.append(expr.cond)
            visit(expr.x)
        elif isinstance(expr, Unary):
            visit(expr.x)
        elif isinstance(expr, Binary):
            visit(expr.a)
            visit(expr.b)
        elif isinstance(expr, Load) and isinstance(expr.offset, Affine):
            for _, index in expr.offset.terms:
                if isinstance(index, RowOf):
                    visit(index.value)

    for stmt in stmts:
        if isinstance(stmt, Let):
            found.extend([stmt.guard] if stmt.guard else [])
            visit(stmt.value)
        elif isinstance(stmt, Reduce):
            found.extend([stmt.guard] if stmt.guard else [])
            found.extend(_conditions(stmt.body))
            visit(stmt.value)
        else:
            visit(stmt.value)
    return found
