"""The CPU's fused attention kernel as an IR-to-IR pass: a lowered online softmax
(lower.lower_attention, egraph/attention.py) rewritten into blocks of queries and keys, register
tiles of scores, a running max, sum and output row per query, and optionally the keys staged per
thread (kernel/ir.py's "Vectors, register tiles and online softmax"). The C renderer prints it.

sum_j softmax(x)_j · v_j in one pass over j: the scores x are computed inline (their dot product
too) and never stored. Keys go in blocks (schedule.tile) between rescalings, and queries in
blocks (schedule.rows) that share every load of a key's vectors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lumos.compile.ir.graph import Node, Op
from lumos.compile.kernel.cpu_ir import (
    Accumulate,
    Arith,
    Assign,
    Declare,
    Declares,
    Exp2NonPositive,
    FirstLanes,
    For,
    FusedAttention,
    Identity,
    If,
    IntLet,
    LaneReduce,
    MulAdd,
    Prefetch,
    Rescale,
    Scope,
    Skip,
    Splat,
    Transpose,
    VectorLoad,
    VectorStore,
)
from lumos.compile.kernel.ir import (
    AttentionIR,
    Binary,
    Clamp,
    Element,
    Expr,
    IntCond,
    IntExpr,
    IntOp,
    Let,
    Lit,
    Load,
    Loop,
    Num,
    Ref,
    RowOf,
    Var,
    expr_vars,
    less,
    stmt_vars,
)
from lumos.compile.kernel.passes import STAGED, ScoreDot, StagedKeys, match_scores, stage_keys, stride_along
from lumos.compile.kernel.tiles import VECTOR
from lumos.compile.schedule.kernels import KernelSchedule

ATTENTION_BLOCK = 128
"""Keys per block of a fused attention kernel (its schedule's `tile` overrides it): all of them up
to 128, so that short sequences take one pass without rescaling (the fastest schedule the search
found at 51 and 101 keys)."""
PV_CHAINS = 8
"""Independent sums a fused attention's P·V loop needs to keep two FMA units busy (4 cycles of
latency each)."""
ATTENTION_ACCUMULATORS = 16
"""Vector registers a fused attention kernel's block of output rows may take by default: queries
per block = 16 / (value width / 8), at most 8 (8 queries at head size 16, 4 at 32); its
schedule's `rows` overrides it."""

Q, V, JJ, J, J0, JN, T0 = (Var(name) for name in ("q", "v", "jj", "j", "j0", "jn", "t0"))


def plus(*terms: IntExpr | int) -> IntExpr:
    """terms[0] + terms[1] + …, left to right."""
    total = terms[0] if not isinstance(terms[0], int) else Lit(terms[0])
    for term in terms[1:]:
        total = IntOp("+", total, Lit(term) if isinstance(term, int) else term)
    return total


def times(a: int, b: IntExpr) -> IntExpr:
    return IntOp("*", Lit(a), b)


def at(array: str, *indices: IntExpr) -> Element:
    return Element(array, indices)


def fused_attention(ir: AttentionIR, schedule: KernelSchedule, stage: bool, written: Node | None) -> FusedAttention:
    """The kernel's blocks, tiles and running sums; `stage`: read the keys from a per-thread copy
    laid out along the keys (passes.stage_keys), when the score is q · k over strided keys."""
    out, rows = ir.node, [(loop.var, loop.extent) for loop in ir.rows]
    staged = stage_keys(ir, rows[-1][0]) if stage else None
    ir = staged.ir if staged is not None else ir
    width, keys, scale = ir.width, ir.keys, Num(ir.scale)
    block = min(schedule.tile or ATTENTION_BLOCK, keys)
    query, queries = rows[-1]
    # A block of queries shares each key's value row: as many independent accumulations as
    # queries, where one query's sum over keys is one chain of dependent FMAs. Not when the
    # values depend on the query (never for attention; the rule would still be legal).
    shared = query not in expr_vars(ir.value).union(*(stmt_vars(s) for s in ir.value_stmts))
    batch = out.batched and query == "i0"  # as many as given: no static size to block
    # Vectors of 16 floats where the schedule asks (AVX-512 hosts) and the head splits into them.
    vw = 16 if schedule.lanes == 16 and width % 16 == 0 else VECTOR
    default_rows = max(1, min(8, ATTENTION_ACCUMULATORS // max(1, width // vw)))
    per_block = min(schedule.rows or default_rows, queries) if shared and not batch else 1
    first_query = Var(f"{query}_0")
    # Inside a block, the query index is defined per query; a last, partial block repeats its
    # last query rather than read past the end.
    this_query = [IntLet(query, Clamp(plus(first_query, Q), Lit(queries), Lit(queries - 1)))] if per_block > 1 else []
    stored = (less(Q, Lit(per_block)), less(plus(first_query, Q), Lit(queries))) if per_block > 1 else (less(Q, Lit(1)),)
    output = Load("out", ir.out)
    # The values as vectors when they are one contiguous read along the value width: then each
    # query's output row is width / vw vector registers, and a key's value row is loaded once
    # for the whole block of queries (as in the register-blocked matmul).
    vectors = (not ir.value_stmts and width % vw == 0 and isinstance(ir.value, Load)
               and not any(isinstance(i, RowOf) for i in ir.value.indices) and stride_along(ir.value, "dd") == 1)
    if vectors:
        declare, clear, rescale, accumulate, store = _vector_rows(ir, per_block, vw, output)
    else:
        declare = Declare("o", (per_block, width))
        clear = For("dd", Lit(width), [Assign(at("o", Q, Var("dd")), Num(0.0))])
        rescale = For("dd", Lit(width), [Rescale(at("o", Q, Var("dd")), at("corr", Q))])
        accumulate = [For("jj", JN, [IntLet("j", plus(J0, JJ)), For("q", Lit(per_block), [
            Let("p", at("s", Q, JJ)),
            For("dd", Lit(width), [*ir.value_stmts, MulAdd(at("o", Q, Var("dd")), Ref("p"), ir.value)], simd=True, braces=True)])])]
        store = [For("dd", Lit(width), [Assign(output, Arith("/", at("o", Q, Var("dd")), at("l", Q)))])]
    # Without a register-blocked product: each query's scores, vectorized across keys.
    blocked = _blocked_scores(ir, query, queries, block, per_block, this_query, vw)
    max_found = blocked is not None and blocked.max_found
    # The block's maximum score per query: found in registers with the scores when their
    # epilogue ran on the product tiles (bmax), else one more pass over them.
    block_max = ([Declare("bm", value=at("bmax", Q))] if max_found else [
        Declare("bm", value=Identity(Op.MAX)),
        For("jj", JN, [Accumulate(Op.MAX, Ref("bm"), at("s", Q, JJ))], reduction=(Op.MAX, "bm"))])
    scores = blocked.body if blocked else [For("q", Lit(per_block), [*this_query, For(
        "jj", JN, [IntLet("j", plus(J0, JJ)), *ir.score_stmts, Assign(at("s", Q, JJ), ir.score)],
        simd=True, note="a block of scores, kept in L1")], braces=True)]
    scores_row = -(-block // vw) * vw  # whole vectors: the last keys store one
    mn = Ref("mn")
    softmax = For("q", Lit(per_block), [
        *block_max,
        Let("mn", Binary(Op.MAX, at("m", Q), Ref("bm"))),
        Assign(at("corr", Q), Exp2NonPositive(Arith("*", Arith("-", at("m", Q), mn), scale)), note="the max-rescaling identity"),
        Declare("lq", value=Arith("*", at("l", Q), at("corr", Q))),
        # Whole vectors of exponentials, the padding's scores -inf (2^-inf is 0, so they add
        # nothing; the register-blocked scores' last vector has them already): no scalar
        # remainder (5 of 101 keys were 40 scalar exponentials per block).
        IntLet("jv", IntOp("*", IntOp("/", plus(JN, vw - 1), Lit(vw)), Lit(vw))),
        *([] if max_found else [For("jj", Var("jv"), [Assign(at("s", Q, JJ), Identity(Op.MAX))], start=JN)]),
        Declare("lv", width=vw, value=Splat(vw)),
        For("jj", Var("jv"), [
            Declare("e", width=vw, constant=True,
                    value=Exp2NonPositive(Arith("*", Arith("-", VectorLoad(at("s", Q, JJ), vw), mn), scale), vw)),
            VectorStore(at("s", Q, JJ), vw, Ref("e")),
            Accumulate(Op.SUM, Ref("lv"), Ref("e"))], step=vw),
        Assign(at("l", Q), Arith("+", Ref("lq"), LaneReduce(Op.SUM, Ref("lv"), vw))),
        Assign(at("m", Q), mn),
    ])
    # Every access to o is in a fully unrolled loop, so that gcc keeps it in registers.
    body = [
        *(_stage(staged, keys, vw, rows) if staged is not None else []),
        Declares([Declare("m", (per_block,)), Declare("l", (per_block,)), Declare("corr", (per_block,)),
                  Declare("s", (per_block, scores_row))]),
        *(blocked.prefetch if blocked else []),
        declare,
        For("q", Lit(per_block), [Assign(at("m", Q), Identity(Op.MAX)), Assign(at("l", Q), Num(0.0)), clear],
            unroll=per_block),
        For("j0", Lit(keys), [
            IntLet("jn", Clamp(IntOp("-", Lit(keys), J0), Lit(block), Lit(block))),
            *scores,
            softmax,
            For("q", Lit(per_block), [rescale], unroll=per_block, braces=True),
            *accumulate], step=block),
        For("q", Lit(per_block), [Skip(stored), *this_query, *store], unroll=per_block),
    ]
    locals_ = [] if staged is None else [
        Declare(STAGED, (staged.depth * keys,), note="this thread's (batch, head) of keys"),
        Declare("staged_at", long=True, value=Lit(-1))]
    loops = [Loop(f"{var}_0" if var == query and per_block > 1 else var, size, batch=out.batched and var == "i0",
                  step=per_block if var == query else 1) for var, size in rows]
    return FusedAttention(ir.name, out, ir.params, keys, per_block, written, locals_, loops, body)


def _vector_rows(ir: AttentionIR, per_block: int, vw: int, output: Load) -> tuple:
    """Each query's output row as width / vw vectors: how they start, are rescaled, take each
    block's keys (every key's value row loaded once for the block of queries) and are stored."""
    width, lanes = ir.width, ir.width // vw
    o_at = at("o", Q, V)
    declare = Declare("o", (per_block, lanes), vw)
    clear = For("v", Lit(lanes), [Assign(o_at, Splat(vw))])
    rescale = For("v", Lit(lanes), [Rescale(o_at, at("corr", Q))])

    def add_keys(step: int) -> For:
        """The loop over the block's keys, `step` at a time: key jj + k summed into o (k = 0)
        or o1 (k = 1); each key's value row is loaded once for every query of the block."""
        loads = [Scope([IntLet("j", plus(J0, JJ, k)), Assign(at(f"vv{k}", V), VectorLoad(ir.value, vw))], inline=True)
                 for k in range(step)]
        sums = [For("v", Lit(lanes), [MulAdd(at("o1" if k else "o", Q, V), at("s", Q, plus(JJ, k)), at(f"vv{k}", V))],
                    unroll=lanes) for k in range(step)]
        return For("jj", None, [
            *(Declare(f"vv{k}", (lanes,), vw) for k in range(step)),
            For("v", Lit(lanes), [IntLet("dd", times(vw, V)), *loads], unroll=lanes),
            For("q", Lit(per_block), sums, unroll=per_block, braces=True),
        ], start=None, step=step, test=IntCond("<=", plus(JJ, step), JN))

    # Each output vector is a chain of dependent FMAs, one per key. Fewer than PV_CHAINS
    # chains leave the FMA units waiting on their latency (perf on quickstart's attention at
    # 4 queries a block, a head of 16: the P·V loop's 4 FMAs a key took 4 cycles), so there the
    # keys alternate between two sets of sums: 5.50 → 4.89 ms for that kernel.
    start = Declare("jj", integer=True, value=Lit(0))
    if per_block * lanes < PV_CHAINS:
        accumulate = [
            Declare("o1", (per_block, lanes), vw),
            For("q", Lit(per_block), [For("v", Lit(lanes), [Assign(at("o1", Q, V), Splat(vw))])], unroll=per_block),
            start, add_keys(2), add_keys(1),
            For("q", Lit(per_block), [For("v", Lit(lanes), [Accumulate(Op.SUM, o_at, at("o1", Q, V))])], unroll=per_block)]
    else:
        accumulate = [start, add_keys(1)]
    store = [Declare("row", (width,)),
             For("v", Lit(lanes), [VectorStore(at("row", times(vw, V)), vw, o_at)]),
             For("dd", Lit(width), [Assign(output, Arith("/", at("row", Var("dd")), at("l", Q)))])]
    return declare, clear, rescale, accumulate, store


def _stage(staged: StagedKeys, keys: int, vw: int, rows: list[tuple[str, int]]) -> list:
    """The keys where their producer wrote them, laid out along the keys in this thread's buffer
    when the (batch, head) changes: a thread's static share of the rows takes each head's queries
    one block after another, so this runs about once per (batch, head)."""
    # The keys' rows come from memory, one cache line a key or so, a load the out-of-order window
    # cannot hide: ask for the next head's (the next row outside the queries) while this one
    # computes.
    outer = rows[-2][0] if len(rows) > 1 else None
    prefetch = [] if outer is None else [Scope([
        IntLet(f"{outer}_next", plus(Var(outer), 1)),
        Scope([IntLet(outer, Var(f"{outer}_next"), also=((staged.var, Lit(0)),)),
               For("j", Lit(keys), [Prefetch(staged.key)])])])]
    return [Scope([
        IntLet("j", Lit(0), also=((staged.var, Lit(0)),)),
        IntLet("at", staged.key.offset, long=True, note="where this (batch, head)'s keys start"),
        If((IntCond("!=", Var("at"), Var("staged_at")),), [
            Assign(Ref("staged_at"), Var("at")),
            *_stage_keys(staged, keys, vw),
            *prefetch]),
    ])]


def _stage_keys(staged: StagedKeys, keys: int, vw: int) -> list:
    """Fill STAGED ([dim][key]) from where the keys are: vw keys × vw dims at a time, read as vw
    vectors and transposed in registers (Transpose), where the keys are contiguous along their
    dims and the head splits into vectors; the rest one float at a time."""
    r, depth, key = Var(staged.var), staged.depth, staged.key
    scalar = For("j", Lit(keys), [For(staged.var, Lit(depth), [
        Assign(at(STAGED, plus(IntOp("*", r, Lit(keys)), J)), key)])], start=J0)
    if depth % vw or stride_along(key, staged.var) != 1:
        return [IntLet("j0", Lit(0)), scalar]
    k = Var("k")
    return [
        Declare("j0", integer=True, value=Lit(0)),
        For("j0", None, [For(staged.var, Lit(depth), [
            Declare("t", (vw,), vw),
            For("k", Lit(vw), [Scope([IntLet("j", plus(J0, k)), Assign(at("t", k), VectorLoad(key, vw))], inline=True)],
                unroll=vw),
            Transpose("t", vw),
            For("k", Lit(vw), [VectorStore(at(STAGED, plus(IntOp("*", plus(r, k), Lit(keys)), J0)), vw, at("t", k))],
                unroll=vw),
        ], step=vw)], start=None, step=vw, test=IntCond("<=", plus(J0, vw), Lit(keys))),
        scalar]


@dataclass
class BlockedScores:
    body: list
    max_found: bool
    """The body leaves the block's maximum score per query in bmax[q]."""
    prefetch: list
    """Statements that ask for the next block of queries' rows (before the key blocks)."""


def _blocked_scores(ir: AttentionIR, query: str, queries: int, block: int, per_block: int,
                    this_query: list, vw: int = VECTOR) -> BlockedScores | None:
    """The scores of the block's jn keys for the block of queries as register-blocked products
    (per_block × lanes vector sums; each key vector loaded once for every query): tiles of up to
    4 vectors of keys, then single vectors, then the last keys (fewer than a vector) as one
    vector read with a lane mask (zeros past them, nothing read there); vectors of `vw` floats
    (8, or 16 on AVX-512). (The last keys one query at a time, a scalar dot product each, took a
    fifth of the kernel at 51 keys; copied into a zero-padded vector per block of queries, with
    their epilogue per score, a seventh at 101.) The score's epilogue (scale, mask) runs on the
    tiles' vectors before they are stored, with the running maximum, when it is made of sums and
    products of reads along the keys (vector_epilogue; the last keys' lanes past jn set to -inf);
    else per score after the tiles. Needs the score to be a dot product q·k whose key operand is
    read contiguously along the keys; else None."""
    if per_block < 2:
        return None
    scores = match_scores(ir, query)
    if scores is None:
        return None
    dot, key, query_value = scores.dot, scores.key, scores.query_value
    left = IntOp("-", JN, T0)
    in_registers = vector_epilogue(scores, ir.score, vw)
    in_registers_last = vector_epilogue(scores, ir.score, vw, first=left)
    score_at = at("s", Q, plus(T0, times(vw, V)))

    def store(lanes: int, last: bool) -> list:
        vector = in_registers_last if last else in_registers
        if not vector:
            return [For("q", Lit(per_block), [For("v", Lit(lanes), [VectorStore(score_at, vw, at("sa", Q, V))])],
                        unroll=per_block)]
        lets, final = vector
        return [For("q", Lit(per_block), [*this_query, For("v", Lit(lanes), [
            IntLet("j", plus(J0, T0, times(vw, V))),
            Declare(dot.acc, width=vw, constant=True, value=at("sa", Q, V)),
            *lets,
            Declare("sv", width=vw, constant=True, value=FirstLanes(final, left, -math.inf, vw) if last else final),
            VectorStore(score_at, vw, Ref("sv")),
            Accumulate(Op.MAX, at("mx", Q), Ref("sv"), width=vw)], unroll=lanes)], unroll=per_block, braces=True)]

    def tile(lanes: int, first: IntExpr | None = None) -> list:
        """Scores of keys t0 … t0 + vw·lanes - 1 (with `first`, only the first of them)."""
        load = [IntLet("j", plus(J0, T0, times(vw, V))), Assign(at("kv", V), VectorLoad(key, vw, first))]
        return [
            Declare("sa", (per_block, lanes), vw),
            For("q", Lit(per_block), [For("v", Lit(lanes), [Assign(at("sa", Q, V), Splat(vw))])], unroll=per_block),
            For(dot.var, Lit(dot.length), [
                Declare("kv", (lanes,), vw, note="loaded once, used by every query of the block"),
                For("v", Lit(lanes), load, unroll=lanes),
                For("q", Lit(per_block), [*this_query, Let("x", query_value), For(
                    "v", Lit(lanes), [MulAdd(at("sa", Q, V), Ref("x"), at("kv", V))], unroll=lanes)], unroll=per_block)]),
            *store(lanes, first is not None),
        ]

    def keys_at(lanes: int) -> For:
        return For("t0", None, tile(lanes), start=None, step=lanes * vw, test=IntCond("<=", plus(T0, lanes * vw), JN))

    # Up to 16 accumulators: they and the key vectors stay in registers (AVX-512 has 32, AVX2 16).
    lanes = max(1, min(4, 16 // per_block, block // vw))
    body = [
        Declare("t0", integer=True, value=Lit(0)),
        *([Declare("mx", (per_block,), vw, note="the running maximum of each query's scores, per lane"),
           For("q", Lit(per_block), [Assign(at("mx", Q), Splat(vw, -math.inf))])] if in_registers else []),
        keys_at(lanes),
        *([keys_at(1)] if lanes > 1 else []),
        If((less(T0, JN),), tile(1, first=left), note="the last keys: one vector, its lanes past them zero"),
    ]
    if in_registers_last:  # every score's epilogue ran on its vector
        body += [Declare("bmax", (per_block,)),
                 For("q", Lit(per_block), [Assign(at("bmax", Q), LaneReduce(Op.MAX, at("mx", Q), vw))])]
    else:
        body.append(For("q", Lit(per_block), [*this_query, For("jj", JN, [
            IntLet("j", plus(J0, JJ)), Let(dot.acc, at("s", Q, JJ)), *scores.epilogue, Assign(at("s", Q, JJ), ir.score)],
            simd=True)], braces=True))
    # The queries' rows are first read by the block's first product, a load per query that the
    # out-of-order window cannot hide (and no stride the prefetcher follows): ask for the next
    # block's rows now, while this block computes (one thread on quickstart: about 10% faster).
    prefetch = [] if not isinstance(query_value, Load) else [For("q", Lit(per_block), [
        IntLet(query, Clamp(plus(Var(f"{query}_0"), per_block, Q), Lit(queries), Lit(queries - 1))),
        IntLet(dot.var, Lit(0)),
        Prefetch(query_value)], note="the next block of queries' rows")]
    return BlockedScores(body, max_found=bool(in_registers_last), prefetch=prefetch)


def vector_epilogue(scores: ScoreDot, score: Expr, vw: int = VECTOR,
                    first: IntExpr | None = None) -> tuple[list[Declare], Expr] | None:
    """The score's epilogue over a vector of vw keys' products (the accumulator a vector): its
    statements and the score, when they are sums and products of numbers, earlier values and
    reads that do not move with the keys (one float for all vw) or move by one along them (one
    vector load at key j; with `first`, only the first lanes are read, the rest 0); else None (a
    select or a strided read would need per-lane code)."""
    vectors = {scores.dot.acc}

    def over_keys(e: Expr) -> tuple[Expr, bool] | None:
        """`e` over vw keys, and whether it is a vector (else one float for all)."""
        if isinstance(e, Num):
            return e, False
        if isinstance(e, Ref):
            return (e, True) if e.name in vectors else None
        if isinstance(e, Load):
            if e.view is None or any(isinstance(i, RowOf) for i in e.indices):
                return None
            if "j" not in expr_vars(e):
                return e, False
            if stride_along(e, "j") != 1:
                return None
            return VectorLoad(e, vw, first), True
        if isinstance(e, Binary) and e.op in (Op.ADD, Op.MUL, Op.SUM):
            a, b = over_keys(e.a), over_keys(e.b)
            if a is None or b is None:
                return None
            return Binary(e.op, a[0], b[0]), a[1] or b[1]
        return None

    lets = []
    for stmt in scores.epilogue:
        if not isinstance(stmt, Let) or stmt.guard is not None:
            return None
        value = over_keys(stmt.value)
        if value is None or not value[1]:  # a float for all keys stays in the per-score code
            return None
        vectors.add(stmt.name)
        lets.append(Declare(stmt.name, width=vw, constant=True, value=value[0]))
    final = over_keys(score)
    if final is None or not final[1]:
        return None
    return lets, final[0]
