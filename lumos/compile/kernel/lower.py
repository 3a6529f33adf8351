"""Lowering: a scheduled kernel (schedule.py) → the kernel IR (kernel/ir.py).

Each inlined producer becomes a sub-expression that reads its own operands at indices mapped
through the views; a value used more than once is computed once per block into a local; an
inlined reduction becomes a `Reduce` before the expression that uses it. Loop annotations come
from kernel_passes.annotate_loops.
"""

from __future__ import annotations

import math
from dataclasses import replace

from lumos.compile.ir.graph import BINARY, UNARY, Node, Op, View, contiguous_strides, prod
from lumos.compile.kernel.cpu_ir import For
from lumos.compile.kernel.ir import (
    NEVER,
    Affine,
    AttentionIR,
    Binary,
    Compare,
    Cond,
    Digit,
    Expr,
    Index,
    IntOp,
    KernelIR,
    Let,
    Lit,
    Load,
    Loop,
    Masked,
    Num,
    Reduce,
    Ref,
    RowOf,
    Stmt,
    Store,
    Unary,
    Var,
    conjoin,
    less,
)
from lumos.compile.kernel.passes import annotate_loops
from lumos.compile.schedule.kernels import Kernel, KernelSchedule, is_buffer, kernel_for
from lumos.compile.schedule.layout import relayout

UNROLLED_REDUCTION = 4
"""Reductions this short are written out as one expression rather than a loop."""


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
    live = index.live_terms
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
        self.written: dict[Node, tuple[list[Index], str]] = {}
        """Outputs of this kernel stored before the one being lowered (a kernel with several
        outputs): each with its output index and the output parameter it was stored to."""
        self.misread: set[Node] = set()
        """Those of `written` read at another index (another row): such a read would race with
        the thread that writes it, so schedule/siblings.py keeps the two kernels apart."""

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
        elif src in self.written and self._same_element(src, view, idx):
            value = Load(self.written[src][1], view_offset(view, idx), view, tuple(idx))
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

    def _same_element(self, src: Node, view: View, idx: list[Index]) -> bool:
        """Whether `idx` reads the element of `src` that this output element computed."""
        if source_indices(view, idx, src.shape) == self.written[src][0]:
            return True
        self.misread.add(src)
        return False

    def compute(self, node: Node, idx: list[Index], guard: Cond | None = None) -> Expr:
        if self.uses.get(node, 0) <= 1 and node.op not in (Op.SUM, Op.MAX):
            return self.expression(node, idx, guard)
        key = (node.id, tuple(idx), guard, self.block)
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
        if node.op in UNARY:
            return Unary(node.op, self.operand(node, 0, idx, guard))
        if node.op in BINARY:
            a, b = self.operand(node, 0, idx, guard), self.operand(node, 1, idx, guard)
            if node.op is Op.ADD and b == Num(0.0):  # a contiguous copy (x + 0)
                return a
            return Binary(node.op, a, b)
        if node.op is Op.GATHER:
            table = node.srcs[0]
            # The rows are the view's, which may reshape the table (BERT gathers its (batch, length)
            # mask through a (batch * length, 1) view by flat index): never the table node's own.
            row = RowOf(self.operand(node, 1, idx[:-1], guard), node.views[0].shape[0])
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
    if kernel.also:
        return _lower_joined(kernel, materialized, params, schedule, check_gathers)
    loops, (body,), _ = lower_outputs(kernel, materialized, params, schedule, check_gathers)
    ir = KernelIR(kernel.name, kernel.node, [params[src] for src in kernel.reads], loops, body,
                  len(kernel.unique_fused), schedule=schedule)
    annotate_loops(ir)
    return ir


def lower_outputs(kernel: Kernel, materialized: set[Node], params: dict[Node, str], schedule: KernelSchedule,
                  check_gathers: bool = False) -> tuple[list[Loop], list[list[Stmt]], set[Node]]:
    """The kernel's output loops; per output, the statements that compute one element of it and
    end in its Store; and the outputs that a later one read at another element (then the kernel
    is not valid: Lowering.misread). A later output reads an earlier one at the same element from
    its output buffer, where the same thread stored it (_lower_joined)."""
    lowering = Lowering(kernel, materialized, params, schedule, check_gathers=check_gathers)
    loops, idx = output_loops(kernel.node)
    out = Affine(0, tuple(zip(contiguous_strides(kernel.node.shape), idx, strict=True)))
    names = ("out", *(f"out{position}" for position in range(1, len(kernel.outputs))))  # as KernelIR.outputs
    per_output = []
    for node, name in zip(kernel.outputs, names, strict=True):
        value = lowering.expression(node, idx)  # its locals and reductions go to lowering.stmts first
        per_output.append([*lowering.stmts, Store(name, out, value)])
        lowering.written[node] = (idx, name)
        lowering.stmts, lowering.shared = [], {}  # each output's statements run in a loop of their own
    return loops, per_output, lowering.misread


ROW_BLOCK = 8
"""Rows a kernel with several outputs computes one output at a time (schedule/siblings.py)."""


def _lower_joined(kernel: Kernel, materialized: set[Node], params: dict[Node, str], schedule: KernelSchedule,
                  check_gathers: bool) -> KernelIR:
    """A kernel with several outputs, in blocks of ROW_BLOCK output elements along its last loop:
    each output over the block's elements, then the next (reading the earlier ones from their
    buffers, just stored by this thread). A block's input rows stay in cache from one output's
    pass to the next, and each pass's rows are independent of each other, so the processor
    overlaps them as it does in a kernel of one output (one row computing every output in turn
    made each row's second sum wait on its first: 1.4× slower than two kernels)."""
    loops, per_output, misread = lower_outputs(kernel, materialized, params, schedule, check_gathers)
    if misread:
        raise ValueError(f"kernel {kernel.name} reads an output of its own at another element")
    *outer, last = loops or [Loop("i0", 1)]
    block = f"{last.var}b"
    end: Index = Var("n") if last.batch else Lit(last.extent)
    start = IntOp("*", Var(block), Lit(ROW_BLOCK))
    body = [For(last.var, IntOp("+", start, Lit(ROW_BLOCK)), stmts, start=start, also=less(Var(last.var), end))
            for stmts in per_output]
    bound = IntOp("/", IntOp("+", end, Lit(ROW_BLOCK - 1)), Lit(ROW_BLOCK)) if last.batch else None
    blocks = Loop(block, -(-last.extent // ROW_BLOCK), bound=bound)
    shared = [replace(loop, parallel=True) for loop in [*outer, blocks]]
    return KernelIR(kernel.name, kernel.node, [params[src] for src in kernel.reads], shared, body,
                    len(kernel.unique_fused), schedule=schedule, also=tuple(kernel.also))


def lower_products(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                   check_gathers: bool = False) -> list[KernelIR]:
    """A kernel of several matrix products over one input (schedule/products.py), as one KernelIR
    per output: each lowered as the kernel of that output alone would be, its Store to `out`,
    `out1`, … (KernelIR.outputs), and its locals numbered on from the previous output's, so that
    the names stay apart in the one body they come to share (kernel/gpu_tiles.py: tiled_matmuls).
    An output that is a layout copy of a product (a key transposed for the attention:
    schedule/layout.py, relayout) is lowered as that product, each element stored where the copy
    keeps it: its loops are the product's, like the other outputs', and only its store differs."""
    irs: list[KernelIR] = []
    counter = 0
    for position, node in enumerate(kernel.outputs):
        alone = kernel_for(kernel.name, node, materialized)
        lowering = Lowering(alone, materialized, params, KernelSchedule(), check_gathers=check_gathers)
        lowering.counter = counter
        moved = relayout(node)
        if moved is not None and moved.source in alone.unique_fused:
            loops, idx = output_loops(moved.source)
            value = lowering.expression(moved.source, idx)  # the copy adds 0: nothing to compute
            out = Affine(moved.offset, tuple(zip(moved.steps, idx, strict=True)))
        else:
            loops, idx = output_loops(node)
            value = lowering.expression(node, idx)
            out = Affine(0, tuple(zip(contiguous_strides(node.shape), idx, strict=True)))
        store = Store("out" if position == 0 else f"out{position}", out, value)
        ir = KernelIR(kernel.name, node, [params[src] for src in kernel.reads], loops, [*lowering.stmts, store],
                      len(alone.unique_fused))
        annotate_loops(ir)
        irs.append(ir)
        counter = lowering.counter
    return irs


def reads_siblings_in_place(kernel: Kernel, materialized: set[Node]) -> bool:
    """Whether each output of `kernel` reads the earlier ones only at the element it computes
    (schedule/siblings.py joins kernels only then)."""
    params = {node: f"b{node.id}" for node in [*kernel.outputs, *kernel.reads]}
    _, _, misread = lower_outputs(kernel, materialized, params, KernelSchedule())
    return not misread


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
    strides = match.store_strides if match.store is not None else contiguous_strides(out.shape)
    out_index = Affine(0, tuple((stride, Lit(0) if d == out.arg else i)
                                for d, (stride, i) in enumerate(zip(strides, idx, strict=True))))
    return AttentionIR(kernel.name, out, [params[src] for src in kernel.reads], rows, product.shape[out.arg], width,
                       match.scale, score_stmts, score, lowering.stmts, value, out_index)
