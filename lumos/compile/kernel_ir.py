"""The kernel IR: what one kernel computes, as loops and statements, between scheduling and rendering.

`lower_kernel` turns a scheduled `Kernel` (a fused subgraph writing one buffer) into a `KernelIR`:
output loops with their extents and annotations (parallel, vector, the batch bound), and a body of
statements — locals (`Let`), reductions with their accumulators (`Reduce`), and one `Store` —
over expressions that read buffers through views (`Load` at an index expression, `Masked` by a
padding condition). Renderers only print it: `render_c` as OpenMP loops, `render_cuda` with the
output loops mapped to threads. Indices are structures too (`Var`, `Affine`, `Digit`, `RowOf`),
so a pass can ask which loop a read depends on without looking at text.

Printing an index or expression gives C syntax (CUDA C is the same for these), so both renderers
share it; what differs between targets is in the renderers' tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lumos.compile.ir import Node, Op, View, contiguous_strides, prod
from lumos.compile.schedule import Kernel, KernelSchedule, is_buffer

UNROLLED_REDUCTION = 4
"""Reductions this short are written out as one expression rather than a loop."""

# ---------------------------------------------------------------------------------------------
# Indices (integers)


@dataclass(frozen=True)
class Var:
    """A loop variable (or a name a renderer binds, such as a block's row)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Lit:
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Affine:
    """constant + Σ coef · index, with the trivial parts left out when printed."""

    constant: int
    terms: tuple[tuple[int, Index], ...]

    def __str__(self) -> str:
        parts = [str(index) if coef == 1 else f"{coef} * {index}" for coef, index in self.terms
                 if coef != 0 and str(index) != "0"]
        if self.constant or not parts:
            parts.append(str(self.constant))
        return parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"


@dataclass(frozen=True)
class Digit:
    """(flat / stride) % size: one dim of a flat offset that no sum of loop indices expresses."""

    flat: Index
    stride: int
    size: int

    def __str__(self) -> str:
        return f"(({self.flat} / {self.stride}) % {self.size})"


@dataclass(frozen=True)
class RowOf:
    """A data-dependent row: a float id read from a buffer (GATHER)."""

    value: Expr
    rows: int
    """The table's row count: what a bounds check compares against."""

    def __str__(self) -> str:
        from lumos.compile.render_cstyle import expr  # C syntax, which every renderer shares

        return f"(int){expr(self.value)}"


Index = Var | Lit | Affine | Digit | RowOf


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


def coefficient(index: Index, var: str) -> int:
    """How far `index` moves when `var` steps by one (0 when it does not depend on it; the sum of
    magnitudes through nested sums, as a stride measure)."""
    if isinstance(index, Var):
        return int(index.name == var)
    if isinstance(index, Affine):
        return sum(abs(coef) * coefficient(i, var) for coef, i in index.terms)
    if isinstance(index, Digit | RowOf):
        return 1 if var in index_vars(index) else 0
    return 0


# ---------------------------------------------------------------------------------------------
# Conditions and expressions (floats)


@dataclass(frozen=True)
class Compare:
    index: Index
    op: str
    """'>=' or '<'."""
    bound: int

    def __str__(self) -> str:
        return f"{self.index} {self.op} {self.bound}"


Cond = tuple[Compare, ...]
"""A conjunction; () is 'always'. NEVER is the empty region (a mask with lo >= hi)."""
NEVER: Cond = (Compare(Lit(0), "<", 0),)


def cond_text(cond: Cond) -> str:
    return "0" if cond == NEVER else " && ".join(map(str, cond))


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


def loads(expr: Expr) -> list[Load]:
    if isinstance(expr, Load):
        return [expr]
    if isinstance(expr, Unary):
        return loads(expr.x)
    if isinstance(expr, Binary):
        return loads(expr.a) + loads(expr.b)
    if isinstance(expr, Masked):
        return loads(expr.x)
    return []


# ---------------------------------------------------------------------------------------------
# Statements and kernels


@dataclass
class Let:
    """A local: `name = value`, or, under `guard`, `init` unless the guard holds."""

    name: str
    value: Expr
    guard: Cond | None = None
    init: float = 0.0


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
    bound: str | None = None
    """The end as an expression when it is no constant (blocks of a symbolic batch: "(n + 3) / 4")."""


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

    @property
    def comment(self) -> str:
        node = self.node
        origin = node.origin.replace("*/", "* /")
        return f"{self.name}: %{node.id} {node.op.name}{list(node.shape)}, {self.ops} ops; {origin}"


# ---------------------------------------------------------------------------------------------
# Views → indices


def view_offset(view: View, idx: list[Index]) -> Index:
    """The element of the source that logical index `idx` of the view reads."""
    return Affine(view.offset, tuple(zip(view.strides, idx, strict=True)))


def view_valid(view: View, idx: list[Index]) -> Cond | None:
    """The condition under which `idx` falls inside the view's padding mask (None: always)."""
    if view.mask is None:
        return None
    checks = []
    for (lo, hi), size, i in zip(view.mask, view.shape, idx, strict=True):
        if lo >= hi:
            return NEVER
        if lo > 0:
            checks.append(Compare(i, ">=", lo))
        if hi < size:
            checks.append(Compare(i, "<", hi))
    return tuple(checks) or None


def source_indices(view: View, idx: list[Index], shape: tuple[int, ...]) -> list[Index]:
    """Per-dim indices into a source of contiguous `shape` for logical index `idx` of `view`.

    When every view dim steps through exactly one source dim without carrying into the next
    (permute, expand, slice, split reshapes), each source index is a sum of loop indices; else the
    flat offset is divided back into dims.
    """
    strides = contiguous_strides(shape)
    mask = view.mask or tuple((0, size) for size in view.shape)
    base = view.offset + sum(lo * stride for (lo, _), stride in zip(mask, view.strides, strict=True))
    if 0 <= base < max(prod(shape), 1):
        start = [(base // stride) % size if size > 1 else 0 for size, stride in zip(shape, strides, strict=True)]
        first = list(start)  # the source index of the view's first valid element
        terms: list[list[tuple[int, Index]]] = [[] for _ in shape]
        reach = [0] * len(shape)
        mapped = True
        for (lo, hi), size, stride, i in zip(mask, view.shape, view.strides, idx, strict=True):
            if stride == 0 or size == 1:
                continue
            dims = [k for k in range(len(shape)) if shape[k] > 1 and strides[k] <= stride and stride % strides[k] == 0
                    and stride // strides[k] < shape[k]]
            if len(dims) != 1:
                mapped = False
                break
            k = dims[0]
            step = stride // strides[k]
            terms[k].append((step, i))
            start[k] -= step * lo
            reach[k] += step * (hi - lo - 1)
        if mapped and all(first[k] + reach[k] < shape[k] for k in range(len(shape))):
            return [_simplify(Affine(start[k], tuple(terms[k]))) if shape[k] > 1 else Lit(0) for k in range(len(shape))]
    flat = view_offset(view, idx)
    return [Digit(flat, stride, size) if size > 1 else Lit(0) for size, stride in zip(shape, strides, strict=True)]


def _simplify(index: Affine) -> Index:
    """A sum that is one index or one constant, as that index (prints the same, compares better)."""
    live = [(coef, i) for coef, i in index.terms if coef != 0 and str(i) != "0"]
    if not live:
        return Lit(index.constant)
    if index.constant == 0 and len(live) == 1 and live[0][0] == 1:
        return live[0][1]
    return index


# ---------------------------------------------------------------------------------------------
# Lowering: a scheduled kernel → KernelIR


class Lowering:
    """Builds one kernel's statements: each inlined producer becomes a sub-expression reading its
    own operands at indices mapped through the views; a value used more than once is computed
    once per block into a local; an inlined reduction becomes a Reduce before the expression."""

    def __init__(self, kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                 schedule: KernelSchedule | None = None, vector_reductions: bool = True,
                 check_gathers: bool = False):
        self.kernel, self.materialized, self.params = kernel, materialized, params
        self.schedule = schedule or KernelSchedule()
        self.vector_reductions = vector_reductions
        self.check_gathers = check_gathers
        """Read a gathered row only when its id is inside the table (else 0): a GPU has no
        exception to raise, and a read past the table would fault or return garbage."""
        self.uses: dict[Node, int] = {}
        for node in kernel.fused:  # a node reached by several paths is computed once, into a local
            self.uses[node] = self.uses.get(node, 0) + 1
        self.stmts: list[Stmt] = []
        self.counter = 0
        self.block = 0
        """Which block statements go to now (the kernel body, or a reduction loop's body)."""
        self.shared: dict[tuple, str] = {}

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def operand(self, node: Node, index: int, idx: list[Index], guard: Cond | None = None) -> Expr:
        """Operand `index` of `node` at `idx`; `guard` is the condition under which it is needed at
        all (inside padding), which loops of inlined reductions must respect."""
        src, view = node.srcs[index], node.views[index]
        valid = view_valid(view, idx)
        if src.is_scalar_const:
            value: Expr = Num(src.arg)
        elif is_buffer(src, self.materialized):
            value = Load(self.params[src], view_offset(view, idx), view, tuple(idx))
        else:
            inner = conjoin(guard, valid)
            value = self.compute(src, source_indices(view, idx, src.shape), guard=inner)
            if view.broadcasts and inner is None and not isinstance(value, Ref):
                local = self.fresh("v")  # the same for every repeat: a local that loops can hoist
                self.stmts.append(Let(local, value))
                value = Ref(local)
        if valid is None:
            return value
        return Num(0.0) if valid == NEVER else Masked(valid, value)

    def compute(self, node: Node, idx: list[Index], guard: Cond | None = None) -> Expr:
        if self.uses.get(node, 0) <= 1 and node.op not in (Op.SUM, Op.MAX):
            return self.expression(node, idx, guard)
        key = (node.id, tuple(map(str, idx)), guard, self.block)
        if key not in self.shared:
            value = self.expression(node, idx, guard)
            if node.op in (Op.SUM, Op.MAX):
                self.shared[key] = value.name  # already a local: the accumulator
            else:
                local = self.fresh("v")
                self.stmts.append(Let(local, value, guard))
                self.shared[key] = local
        return Ref(self.shared[key])

    def expression(self, node: Node, idx: list[Index], guard: Cond | None = None) -> Expr:
        if node.op in (Op.EXP2, Op.LOG2, Op.SIN, Op.RECIP, Op.SQRT):
            return Unary(node.op, self.operand(node, 0, idx, guard))
        if node.op in (Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN):
            a, b = self.operand(node, 0, idx, guard), self.operand(node, 1, idx, guard)
            if node.op is Op.ADD and b == Num(0.0):  # a contiguous copy (x + 0)
                return a
            return Binary(node.op, a, b)
        if node.op is Op.GATHER:
            table = node.srcs[0]
            row = RowOf(self.operand(node, 1, idx[:-1], guard), table.shape[0])
            at = [row, idx[-1]]
            load = Load(self.params[table], view_offset(node.views[0], at), node.views[0], tuple(at))
            return Masked((Compare(row, ">=", 0), Compare(row, "<", row.rows)), load) if self.check_gathers else load
        if node.op in (Op.SUM, Op.MAX):
            return self.reduce(node, idx, guard)
        raise NotImplementedError(f"no lowering rule for {node.op.name}")

    def reduce(self, node: Node, idx: list[Index], guard: Cond | None) -> Ref:
        axis, length = node.arg, node.views[0].shape[node.arg]
        if length <= UNROLLED_REDUCTION:
            return self.unrolled_reduce(node, idx, guard)
        acc, r = self.fresh("acc"), self.fresh("r")
        inner = list(idx)
        inner[axis] = Var(r)
        outer_stmts, self.stmts = self.stmts, []
        outer_block, self.block = self.block, self.counter
        value = self.operand(node, 0, inner)
        body, self.stmts, self.block = self.stmts, outer_stmts, outer_block
        reduce = Reduce(acc, node.op, r, length, body, value, guard, unroll=self.schedule.unroll)
        reduce.vector = not reduce.unroll and self.vector_reductions and reduce.straight
        self.stmts.append(reduce)
        return Ref(acc)

    def unrolled_reduce(self, node: Node, idx: list[Index], guard: Cond | None) -> Ref:
        """A reduction over a few elements (a linear layer over 1 or 2 numeric features) as one
        expression: as a loop nested in the element loop, it kept that loop from vectorizing."""
        axis, acc = node.arg, self.fresh("acc")
        value = None
        for k in range(node.views[0].shape[axis]):
            inner = list(idx)
            inner[axis] = Lit(k)
            term = self.operand(node, 0, inner, guard)
            value = term if value is None else Binary(node.op, value, term)
        self.stmts.append(Let(acc, value, guard, 0.0 if node.op is Op.SUM else -math.inf))
        return Ref(acc)


def output_loops(node: Node) -> tuple[list[Loop], list[Index]]:
    loops = [Loop(f"i{d}", size, batch=node.batched and d == 0) for d, size in enumerate(node.shape) if size > 1]
    idx = [Var(f"i{d}") if size > 1 else Lit(0) for d, size in enumerate(node.shape)]
    return loops, idx


def lower_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                 schedule: KernelSchedule | None = None, check_gathers: bool = False) -> KernelIR:
    """The kernel as loops over its output's elements, each element computed by the body."""
    schedule = schedule or KernelSchedule()
    lowering = Lowering(kernel, materialized, params, schedule, check_gathers=check_gathers)
    node = kernel.node
    loops, idx = output_loops(node)
    value = lowering.expression(node, idx)
    out = Affine(0, tuple(zip(contiguous_strides(node.shape), idx, strict=True)))
    body = [*lowering.stmts, Store("out", out, value)]
    ir = KernelIR(kernel.name, node, [params[src] for src in kernel.reads], loops, body,
                  len(set(map(id, kernel.fused))), schedule=schedule)
    annotate_loops(ir)
    return ir


# ---------------------------------------------------------------------------------------------
# Schedule passes on the IR


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
    return max(sorted(counts, key=str), key=counts.get)


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


def top_reduce(ir: KernelIR) -> Reduce | None:
    """The kernel's one unguarded reduction at the top of its body, if it has exactly one."""
    reduces = [s for s in ir.body if isinstance(s, Reduce)]
    if len(reduces) != 1 or reduces[0].guard is not None or not isinstance(ir.body[0], Reduce):
        return None
    return reduces[0]


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


def lower_attention(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                    schedule: KernelSchedule | None = None, check_gathers: bool = False) -> AttentionIR:
    match = kernel.attention
    out, product = match.out, match.product
    probs_view = product.views[match.probs_index]
    idx: list[Index] = []
    for d, size in enumerate(product.shape):
        if d == out.arg:
            idx.append(Var("j"))
        elif size == 1:
            idx.append(Lit(0))
        elif probs_view.strides[d] == 0:
            idx.append(Var("dd"))
        else:
            idx.append(Var(f"i{d}"))
    width = next(size for d, size in enumerate(product.shape) if idx[d] == Var("dd"))
    rows = [Loop(f"i{d}", size, batch=out.batched and d == 0) for d, size in enumerate(product.shape) if idx[d] == Var(f"i{d}")]
    # The score's loop over keys is what vectorizes, not the reductions inside it.
    lowering = Lowering(kernel, materialized, params, schedule, vector_reductions=False, check_gathers=check_gathers)
    score = lowering.compute(match.scores, source_indices(probs_view, idx, product.srcs[match.probs_index].shape))
    score_stmts, lowering.stmts, lowering.block = lowering.stmts, [], -2  # a block of its own: nothing shared
    value = lowering.operand(product, 1 - match.probs_index, idx)
    out_index = Affine(0, tuple((stride, Lit(0) if d == out.arg else i)
                                for d, (stride, i) in enumerate(zip(contiguous_strides(out.shape), idx, strict=True))))
    return AttentionIR(kernel.name, out, [params[src] for src in kernel.reads], rows, product.shape[out.arg], width,
                       match.scale, score_stmts, score, lowering.stmts, value, out_index)


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
