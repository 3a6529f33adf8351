"""The C renderer: one function per kernel, and a driver that runs them all in one native call.

Kernels are printed from the kernel IR (kernel/ir.py; expressions and statements as
render_cstyle.py prints them for C and CUDA alike) in one of four layouts, decided on the IR's
structure (kernel/passes.py) and the kernel's schedule: plain (OpenMP shares out the outer
output loops, the innermost runs the body per element, vectorized or versioned on an invariant
padding guard), row-wise (the reduction loop outside the last output loop), the register-blocked
matmul, and the fused online-softmax attention. The driver opens one OpenMP parallel region and
calls every kernel in launch order; a kernel's `omp for` ends with a barrier only where a later
kernel depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from lumos.compile.ir.graph import Graph, Node, Op
from lumos.compile.kernel.ir import (
    AttentionIR,
    Binary,
    Compare,
    Expr,
    KernelIR,
    Let,
    Load,
    Loop,
    Num,
    Ref,
    RowOf,
    expr_vars,
    stmt_vars,
)
from lumos.compile.kernel.lower import lower_attention, lower_kernel
from lumos.compile.kernel.passes import (
    STAGED,
    ScoreDot,
    StagedKeys,
    match_scores,
    stage_keys,
    stride_along,
)
from lumos.compile.kernel.tiles import VECTOR, cpu_layout
from lumos.compile.render.cstyle import C, block_lines, compare, expr, index, int_expr, literal
from lumos.compile.runtime.kernel_cache import UNIT_BREAK
from lumos.compile.schedule.buffers import BufferPlan
from lumos.compile.schedule.kernels import Kernel, KernelSchedule

HEADER = (resources.files("lumos.compile.render") / "lumos_cpu.h").read_text()
"""What every C library starts with (lumos_cpu.h beside this file): the vector types, 2^x without
libm, lane reductions, masked loads, and lumos_transposeN (n vectors of n floats transposed in
log2(n) stages of two-input shuffles; stage b swaps the off-diagonal b × b blocks of every
2b × 2b block)."""

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
# ---------------------------------------------------------------------------------------------
# The fused attention kernel, printed from the kernel IR (lower.lower_attention)


def render_attention(kernel: Kernel, materialized: set[Node], params: dict[Node, str], schedule: KernelSchedule,
                     barrier: bool = True) -> str:
    """sum_j softmax(x)_j · v_j in one pass over j (online softmax, egraph/attention.py): a
    running max, sum and output row per query; the scores x are computed inline (their dot
    product too) and never stored. Keys go in blocks (schedule.tile) between rescalings, and
    queries in blocks (schedule.rows) that share every load of a key's vectors."""
    ir = lower_attention(kernel, materialized, params, schedule)
    out, rows = ir.node, [(loop.var, loop.extent) for loop in ir.rows]
    staged = stage_keys(ir, rows[-1][0]) if kernel.attention.keys_copy is not None else None
    ir = staged.ir if staged is not None else ir
    width, keys, scale = ir.width, ir.keys, literal(ir.scale)
    score, score_lines = expr(ir.score), _lines(ir.score_stmts)
    value, value_lines = expr(ir.value), _lines(ir.value_stmts)
    out_index = index(ir.out)
    block = min(schedule.tile or ATTENTION_BLOCK, keys)
    query, queries = rows[-1]
    # A block of queries shares each key's value row: as many independent accumulations as
    # queries, where one query's sum over keys is one chain of dependent FMAs. Not when the
    # values depend on the query (never for attention; the rule would still be legal).
    shared = query not in expr_vars(ir.value).union(*(stmt_vars(s) for s in ir.value_stmts))
    batch = out.batched and query == "i0"  # as many as given: no static size to block
    # Vectors of 16 floats where the schedule asks (AVX-512 hosts) and the head splits into them.
    vw = 16 if schedule.lanes == 16 and width % 16 == 0 else VECTOR
    vec, load_vec, store_vec = f"lumos_f{vw}", f"lumos_load{vw}", f"lumos_store{vw}"
    default_rows = max(1, min(8, ATTENTION_ACCUMULATORS // max(1, width // vw)))
    per_block = min(schedule.rows or default_rows, queries) if shared and not batch else 1
    # Inside a block, the query index is defined per query; a last, partial block repeats its
    # last query rather than read past the end.
    this_query = ([f"const int {query} = {query}_0 + q < {queries} ? {query}_0 + q : {queries - 1};"]
                  if per_block > 1 else [])
    stored = f"q < {per_block} && {query}_0 + q < {queries}" if per_block > 1 else "q < 1"
    # The values as vectors when they are one contiguous read along the value width: then each
    # query's output row is width / vw vector registers, and a key's value row is loaded once
    # for the whole block of queries (as in the register-blocked matmul).
    vectors = (not ir.value_stmts and width % vw == 0 and isinstance(ir.value, Load)
               and not any(isinstance(i, RowOf) for i in ir.value.indices) and stride_along(ir.value, "dd") == 1)
    lanes = width // vw
    if vectors:
        declare = f"{vec} o[{per_block}][{lanes}];"
        clear = f"  for (int v = 0; v < {lanes}; v++) o[q][v] = ({vec}){{0}};"
        rescale = f"    for (int v = 0; v < {lanes}; v++) o[q][v] *= corr[q];"

        def add_keys(step: int) -> list[str]:
            """The loop over the block's keys, `step` at a time: key jj + k summed into o (k = 0)
            or o1 (k = 1); each key's value row is loaded once for every query of the block."""
            loads = [f"    {vec} vv{k}[{lanes}];" for k in range(step)]
            loads += [f"    #pragma GCC unroll {lanes}", f"    for (int v = 0; v < {lanes}; v++) {{",
                      f"      const int dd = {vw} * v;"]
            loads += [f"      {{ const int j = j0 + jj + {k}; vv{k}[v] = {load_vec}(&{value}); }}" for k in range(step)]
            sums = [line for k in range(step) for line in (
                f"      #pragma GCC unroll {lanes}",
                f"      for (int v = 0; v < {lanes}; v++) {'o1' if k else 'o'}[q][v] += s[q][jj + {k}] * vv{k}[v];")]
            return [f"  for (; jj + {step} <= jn; jj += {step}) {{", *loads, "    }",
                    f"    #pragma GCC unroll {per_block}", f"    for (int q = 0; q < {per_block}; q++) {{",
                    *sums, "    }", "  }"]

        # Each output vector is a chain of dependent FMAs, one per key. Fewer than PV_CHAINS
        # chains leave the FMA units waiting on their latency (perf on quickstart's attention at
        # 4 queries a block, a head of 16: the P·V loop's 4 FMAs a key took 4 cycles), so there the
        # keys alternate between two sets of sums: 5.50 → 4.89 ms for that kernel.
        if per_block * lanes < PV_CHAINS:
            accumulate = [f"  {vec} o1[{per_block}][{lanes}];", f"  #pragma GCC unroll {per_block}",
                          f"  for (int q = 0; q < {per_block}; q++)",
                          f"    for (int v = 0; v < {lanes}; v++) o1[q][v] = ({vec}){{0}};",
                          "  int jj = 0;", *add_keys(2), *add_keys(1),
                          f"  #pragma GCC unroll {per_block}", f"  for (int q = 0; q < {per_block}; q++)",
                          f"    for (int v = 0; v < {lanes}; v++) o[q][v] += o1[q][v];"]
        else:
            accumulate = ["  int jj = 0;", *add_keys(1)]
        store = [f"  float row[{width}];",
                 f"  for (int v = 0; v < {lanes}; v++) {store_vec}(&row[{vw} * v], o[q][v]);",
                 f"  for (int dd = 0; dd < {width}; dd++) out[{out_index}] = row[dd] / l[q];"]
    else:
        declare = f"float o[{per_block}][{width}];"
        clear = f"  for (int dd = 0; dd < {width}; dd++) o[q][dd] = 0.0f;"
        rescale = f"    for (int dd = 0; dd < {width}; dd++) o[q][dd] *= corr[q];"
        accumulate = [
            "  for (int jj = 0; jj < jn; jj++) {",
            "    const int j = j0 + jj;",
            f"    for (int q = 0; q < {per_block}; q++) {{",
            "      const float p = s[q][jj];",
            "      #pragma omp simd",
            f"      for (int dd = 0; dd < {width}; dd++) {{",
            *("        " + line for line in value_lines),
            f"        o[q][dd] += p * {value};",
            "      }",
            "    }",
            "  }",
        ]
        store = [f"  for (int dd = 0; dd < {width}; dd++) out[{out_index}] = o[q][dd] / l[q];"]
    # Without a register-blocked product: each query's scores, vectorized across keys.
    blocked = _blocked_scores(ir, query, queries, block, per_block, this_query, vw)
    # The block's maximum score per query: found in registers with the scores when their
    # epilogue ran on the product tiles (bmax), else one more pass over them.
    block_max = (["    float bm = bmax[q];"] if blocked and blocked.max_found else [
        "    float bm = -INFINITY;",
        "    #pragma omp simd reduction(max:bm)",
        "    for (int jj = 0; jj < jn; jj++) bm = lumos_max(bm, s[q][jj]);"])
    scores = ["  " + line for line in (blocked.lines if blocked else None) or [
        f"for (int q = 0; q < {per_block}; q++) {{", *this_query,
        "  #pragma omp simd",
        "  for (int jj = 0; jj < jn; jj++) {  /* a block of scores, kept in L1 */",
        "    const int j = j0 + jj;",
        *("    " + line for line in score_lines),
        f"    s[q][jj] = {score};",
        "  }",
        "}"]]
    scores_row = -(-block // vw) * vw  # whole vectors: the last keys store one
    # The keys' rows come from memory, one cache line a key or so, a load the out-of-order window
    # cannot hide: ask for the next head's (the next row outside the queries) while this one
    # computes.
    outer = rows[-2][0] if len(rows) > 1 else None
    prefetch = [] if staged is None or outer is None else [
        f"{{ const int {outer}_next = {outer} + 1;",
        f"  {{ const int {outer} = {outer}_next, {staged.var} = 0;",
        f"    for (int j = 0; j < {keys}; j++) __builtin_prefetch(&{expr(staged.key)});",
        "  }",
        "}"]
    # The keys where their producer wrote them, laid out along the keys in this thread's buffer
    # when the (batch, head) changes: a thread's static share of the rows takes each head's
    # queries one block after another, so this runs about once per (batch, head).
    stage = [] if staged is None else [
        f"{{ const int j = 0, {staged.var} = 0;",
        f"  const long at = {index(staged.key.offset)};  /* where this (batch, head)'s keys start */",
        "  if (at != staged_at) {",
        "    staged_at = at;",
        *("    " + line for line in _stage_lines(staged, keys, vw)),
        *("    " + line for line in prefetch),
        "  }",
        "}"]
    # Every access to o is in a fully unrolled loop, so that gcc keeps it in registers.
    body = [
        *stage,
        f"float m[{per_block}], l[{per_block}], corr[{per_block}], s[{per_block}][{scores_row}];",
        *(blocked.prefetch if blocked else []),
        declare,
        f"#pragma GCC unroll {per_block}",
        f"for (int q = 0; q < {per_block}; q++) {{",
        "  m[q] = -INFINITY;",
        "  l[q] = 0.0f;",
        clear,
        "}",
        f"for (int j0 = 0; j0 < {keys}; j0 += {block}) {{",
        f"  const int jn = {keys} - j0 < {block} ? {keys} - j0 : {block};",
        *scores,
        f"  for (int q = 0; q < {per_block}; q++) {{",
        *block_max,
        "    const float mn = lumos_max(m[q], bm);",
        f"    corr[q] = lumos_exp2f_nonpositive((m[q] - mn) * {scale});  /* the max-rescaling identity */",
        "    float lq = l[q] * corr[q];",
        # Whole vectors of exponentials, the padding's scores -inf (2^-inf is 0, so they add
        # nothing; the register-blocked scores' last vector has them already): no scalar
        # remainder (5 of 101 keys were 40 scalar exponentials per block).
        f"    const int jv = (jn + {vw - 1}) / {vw} * {vw};",
        *([] if blocked and blocked.max_found else ["    for (int jj = jn; jj < jv; jj++) s[q][jj] = -INFINITY;"]),
        f"    {vec} lv = ({vec}){{0}};",
        f"    for (int jj = 0; jj < jv; jj += {vw}) {{",
        f"      const {vec} e = lumos_exp2_nonpositive{vw}(({load_vec}(&s[q][jj]) - mn) * {scale});",
        f"      {store_vec}(&s[q][jj], e);",
        "      lv += e;",
        "    }",
        f"    l[q] = lq + lumos_sum_lanes{vw}(lv);",
        "    m[q] = mn;",
        "  }",
        f"  #pragma GCC unroll {per_block}",
        f"  for (int q = 0; q < {per_block}; q++) {{",
        rescale,
        "  }",
        *accumulate,
        "}",
        f"#pragma GCC unroll {per_block}",
        f"for (int q = 0; q < {per_block}; q++) {{",
        f"  if (!({stored})) continue;",
        *("  " + line for line in this_query),
        *store,
        "}",
    ]
    signature = ["const int n", "float* restrict out"] + [f"const float* restrict {name}" for name in ir.params]
    store = kernel.attention.store
    written = "" if store is None else f", written as %{store.id}{list(store.shape)} (its dims reordered)"
    lines = [f"/* {ir.name}: %{out.id} attention{list(out.shape)}{written}, online softmax over {keys} keys "
             f"(scores never stored), {per_block} queries at a time; {out.origin.replace('*/', '* /')} */",
             f"LUMOS_KERNEL void {ir.name}({', '.join(signature)}) {{"]
    if staged is not None:
        lines.append(f"float {STAGED}[{staged.depth * keys}];  /* this thread's (batch, head) of keys */")
        lines.append("long staged_at = -1;")
    collapse = f" collapse({len(rows)})" if len(rows) > 1 else ""
    lines.append(f"#pragma omp for{collapse} schedule(static){'' if barrier else ' nowait'}")
    for depth, (var, size) in enumerate(rows):
        bound = "n" if out.batched and var == "i0" else size
        step = f"{var}++"
        if var == query and per_block > 1:
            var, step = f"{var}_0", f"{var}_0 += {per_block}"
        lines.append("  " * depth + f"for (int {var} = 0; {var} < {bound}; {step}) {{")
    lines += ["  " * len(rows) + line for line in body]
    lines += ["  " * d + "}" for d in range(len(rows) - 1, -1, -1)]
    lines.append("}")
    return "\n".join(lines)


def _stage_lines(staged: StagedKeys, keys: int, vw: int) -> list[str]:
    """Fill STAGED ([dim][key]) from where the keys are: vw keys × vw dims at a time, read as vw
    vectors and transposed in registers (lumos_transpose), where the keys are contiguous along
    their dims and the head splits into vectors; the rest one float at a time."""
    r, depth, key = staged.var, staged.depth, expr(staged.key)
    scalar = [f"for (int j = j0; j < {keys}; j++)",
              f"  for (int {r} = 0; {r} < {depth}; {r}++) {STAGED}[{r} * {keys} + j] = {key};"]
    if depth % vw or stride_along(staged.key, r) != 1:
        return ["const int j0 = 0;", *scalar]
    return [
        "int j0 = 0;",
        f"for (; j0 + {vw} <= {keys}; j0 += {vw})",
        f"  for (int {r} = 0; {r} < {depth}; {r} += {vw}) {{",
        f"    lumos_f{vw} t[{vw}];",
        f"    #pragma GCC unroll {vw}",
        f"    for (int k = 0; k < {vw}; k++) {{ const int j = j0 + k; t[k] = lumos_load{vw}(&{key}); }}",
        f"    lumos_transpose{vw}(t);",
        f"    #pragma GCC unroll {vw}",
        f"    for (int k = 0; k < {vw}; k++) lumos_store{vw}(&{STAGED}[({r} + k) * {keys} + j0], t[k]);",
        "  }",
        *scalar]


@dataclass
class BlockedScores:
    lines: list[str]
    max_found: bool
    """The lines leave the block's maximum score per query in bmax[q]."""
    prefetch: list[str]
    """Lines that ask for the next block of queries' rows (before the key blocks)."""


def _blocked_scores(ir: AttentionIR, query: str, queries: int, block: int, per_block: int,
                    this_query: list[str], vw: int = VECTOR) -> BlockedScores | None:
    """The scores of the block's jn keys for the block of queries as register-blocked products
    (per_block × lanes vector sums; each key vector loaded once for every query): tiles of up to
    4 vectors of keys, then single vectors, then the last keys (fewer than a vector) as one
    vector read with a lane mask (lumos_load16_first: zeros past them, nothing read there);
    vectors of `vw` floats (8, or 16 on AVX-512). (The last keys one query at a time, a scalar dot
    product each, took a fifth of the kernel at 51 keys; copied into a zero-padded vector per
    block of queries, with their epilogue per score, a seventh at 101.) The score's epilogue
    (scale, mask) runs on the tiles' vectors before they are stored, with the running maximum,
    when it is made of sums and products of reads along the keys (_vector_epilogue; the last
    keys' lanes past jn set to -inf); else per score after the tiles. Needs the score to be a dot
    product q·k whose key operand is read contiguously along the keys; else None."""
    if per_block < 2:
        return None
    scores = match_scores(ir, query)
    if scores is None:
        return None
    dot, key, query_value = scores.dot, expr(scores.key), expr(scores.query_value)
    score, epilogue = expr(ir.score), _lines(scores.epilogue)
    in_registers = _vector_epilogue(scores, ir.score, vw)
    in_registers_last = _vector_epilogue(scores, ir.score, vw, first="jn - t0")
    r = dot.var
    vec, load, store_vec, vmax = f"lumos_f{vw}", f"lumos_load{vw}", f"lumos_store{vw}", f"lumos_max{vw}"

    def store(lanes: int, last: bool) -> list[str]:
        vector = in_registers_last if last else in_registers
        if not vector:
            return [f"#pragma GCC unroll {per_block}",
                    f"for (int q = 0; q < {per_block}; q++)",
                    f"  for (int v = 0; v < {lanes}; v++) {store_vec}(&s[q][t0 + {vw} * v], sa[q][v]);"]
        return [
            f"#pragma GCC unroll {per_block}",
            f"for (int q = 0; q < {per_block}; q++) {{",
            *("  " + line for line in this_query),
            f"  #pragma GCC unroll {lanes}",
            f"  for (int v = 0; v < {lanes}; v++) {{",
            f"    const int j = j0 + t0 + {vw} * v;",
            f"    const {vec} {dot.acc} = sa[q][v];",
            *("    " + line for line in vector[0]),
            f"    const {vec} sv = {f'lumos_first{vw}({vector[1]}, jn - t0, -INFINITY)' if last else vector[1]};",
            f"    {store_vec}(&s[q][t0 + {vw} * v], sv);",
            f"    mx[q] = {vmax}(mx[q], sv);",
            "  }",
            "}",
        ]

    def tile(lanes: int, load: list[str], last: bool = False) -> list[str]:
        """Scores of keys t0 … t0 + vw·lanes - 1; `load` sets kv[v], the key vector v of step r."""
        return [
            f"{vec} sa[{per_block}][{lanes}];",
            f"#pragma GCC unroll {per_block}",
            f"for (int q = 0; q < {per_block}; q++)",
            f"  for (int v = 0; v < {lanes}; v++) sa[q][v] = ({vec}){{0}};",
            f"for (int {r} = 0; {r} < {dot.length}; {r}++) {{",
            f"  {vec} kv[{lanes}];  /* loaded once, used by every query of the block */",
            f"  #pragma GCC unroll {lanes}",
            f"  for (int v = 0; v < {lanes}; v++) {{",
            *("    " + line for line in load),
            "  }",
            f"  #pragma GCC unroll {per_block}",
            f"  for (int q = 0; q < {per_block}; q++) {{",
            *("    " + line for line in this_query),
            f"    const float x = {query_value};",
            f"    #pragma GCC unroll {lanes}",
            f"    for (int v = 0; v < {lanes}; v++) sa[q][v] += x * kv[v];",
            "  }",
            "}",
            *store(lanes, last),
        ]

    def keys_at(lanes: int) -> list[str]:
        return [f"for (; t0 + {lanes * vw} <= jn; t0 += {lanes * vw}) {{",
                *("  " + line for line in tile(lanes, [f"const int j = j0 + t0 + {vw} * v;", f"kv[v] = {load}(&{key});"])),
                "}"]

    # Up to 16 accumulators: they and the key vectors stay in registers (AVX-512 has 32, AVX2 16).
    lanes = max(1, min(4, 16 // per_block, block // vw))
    negative_infinity = "{" + ", ".join(["-INFINITY"] * vw) + "}"
    lines = [
        "int t0 = 0;",
        *([f"{vec} mx[{per_block}];  /* the running maximum of each query's scores, per lane */",
           f"for (int q = 0; q < {per_block}; q++) mx[q] = ({vec}){negative_infinity};"] if in_registers else []),
        *keys_at(lanes),
        *(keys_at(1) if lanes > 1 else []),
        "if (t0 < jn) {  /* the last keys: one vector, its lanes past them zero */",
        *("  " + line for line in tile(1, [f"const int j = j0 + t0 + {vw} * v;", f"kv[v] = {load}_first(&{key}, jn - t0);"],
                                       last=True)),
        "}",
    ]
    if in_registers_last:  # every score's epilogue ran on its vector
        lines += [f"float bmax[{per_block}];",
                  f"for (int q = 0; q < {per_block}; q++) bmax[q] = lumos_max_lanes{vw}(mx[q]);"]
    else:
        lines += [
            f"for (int q = 0; q < {per_block}; q++) {{",
            *("  " + line for line in this_query),
            "  #pragma omp simd",
            "  for (int jj = 0; jj < jn; jj++) {",
            "    const int j = j0 + jj;",
            f"    const float {dot.acc} = s[q][jj];",
            *("    " + line for line in epilogue),
            f"    s[q][jj] = {score};",
            "  }",
            "}"]
    # The queries' rows are first read by the block's first product, a load per query that the
    # out-of-order window cannot hide (and no stride the prefetcher follows): ask for the next
    # block's rows now, while this block computes (one thread on quickstart: about 10% faster).
    prefetch = [] if not isinstance(scores.query_value, Load) else [
        f"for (int q = 0; q < {per_block}; q++) {{  /* the next block of queries' rows */",
        f"  const int {query} = {query}_0 + {per_block} + q < {queries} ? {query}_0 + {per_block} + q : {queries - 1};",
        f"  const int {r} = 0;",
        f"  __builtin_prefetch(&{query_value});",
        "}"]
    return BlockedScores(lines, max_found=bool(in_registers_last), prefetch=prefetch)


def _vector_epilogue(scores: ScoreDot, score: Expr, vw: int = VECTOR, first: str = "") -> tuple[list[str], str] | None:
    """The score's epilogue over a vector of vw keys' products (the accumulator a lumos_f8 or _f16): its
    statements and the score, when they are sums and products of numbers, earlier values and
    reads that do not move with the keys (one float for all vw) or move by one along them (one
    vector load at key j; with `first`, only the first lanes are read, the rest 0); else None (a
    select or a strided read would need per-lane code)."""
    vectors = {scores.dot.acc}

    def vector_expr(e: Expr) -> tuple[str, bool] | None:
        """The C text of `e` over vw keys, and whether it is a vector (else one float for all)."""
        if isinstance(e, Num):
            return literal(e.value), False
        if isinstance(e, Ref):
            return (e.name, True) if e.name in vectors else None
        if isinstance(e, Load):
            if e.view is None or any(isinstance(i, RowOf) for i in e.indices):
                return None
            if "j" not in expr_vars(e):
                return expr(e), False
            if stride_along(e, "j") != 1:
                return None
            return (f"lumos_load{vw}_first(&{expr(e)}, {first})" if first else f"lumos_load{vw}(&{expr(e)})"), True
        if isinstance(e, Binary) and e.op in (Op.ADD, Op.MUL, Op.SUM):
            a, b = vector_expr(e.a), vector_expr(e.b)
            if a is None or b is None:
                return None
            return f"({a[0]} {'*' if e.op is Op.MUL else '+'} {b[0]})", a[1] or b[1]
        return None

    lines = []
    for stmt in scores.epilogue:
        if not isinstance(stmt, Let) or stmt.guard is not None:
            return None
        value = vector_expr(stmt.value)
        if value is None or not value[1]:  # a float for all keys stays in the per-score code
            return None
        vectors.add(stmt.name)
        lines.append(f"const lumos_f{vw} {stmt.name} = {value[0]};")
    final = vector_expr(score)
    if final is None or not final[1]:
        return None
    return lines, final[0]


def _lines(stmts) -> list[str]:
    return block_lines(stmts, C)


def barriers(graph: Graph, kernels: list[Kernel], plan: BufferPlan) -> list[bool]:
    """Whether each kernel must end with a barrier: only when a later kernel, before the next
    barrier, reads what it writes or writes what it (or another kernel since the last barrier)
    reads or writes. Arena buffers conflict when their bytes overlap (memory is reused)."""
    def region(node: Node) -> tuple:
        if node in plan.buffers:
            buffer = plan.buffers[node]
            return ("arena", buffer.offset, buffer.offset + buffer.bytes)
        return ("node", node.id, node.id + 1)  # inputs, outputs, tensors: one array each

    def overlap(a: tuple, b: tuple) -> bool:
        return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]

    keep = [True] * len(kernels)
    in_flight: list[tuple[list[tuple], tuple]] = []  # (reads, write) of kernels since the last barrier
    for position, kernel in enumerate(kernels):
        reads, write = [region(node) for node in kernel.reads], region(kernel.node)
        conflict = any(
            any(overlap(r, earlier_write) for r in reads)  # reads what an earlier one writes
            or any(overlap(write, r) for r in earlier_reads + [earlier_write])  # overwrites its inputs or output
            for earlier_reads, earlier_write in in_flight
        )
        if conflict and position > 0:
            keep[position - 1] = True
            in_flight = []
        elif position > 0:
            keep[position - 1] = False
        in_flight.append((reads, write))
    return keep


def render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                  schedule: KernelSchedule | None = None, barrier: bool = True) -> str:
    schedule = schedule or KernelSchedule()
    if kernel.attention is not None:
        return render_attention(kernel, materialized, params, schedule, barrier)
    ir = cpu_layout(lower_kernel(kernel, materialized, params, schedule), schedule)
    return print_kernel(ir, barrier, schedule.wide)


def _signature(ir: KernelIR, wide: bool = False) -> str:
    params = ["const int n", "float* restrict out"] + [f"const float* restrict {name}" for name in ir.params]
    return f"LUMOS_KERNEL {'LUMOS_WIDE ' if wide else ''}void {ir.name}({', '.join(params)}) {{"


def print_kernel(ir: KernelIR, barrier: bool = True, wide: bool = False) -> str:
    """A kernel IR in its plain layout: OpenMP shares out the parallel loops, the innermost loop
    runs the body per element (vectorized or versioned on an invariant guard as annotated);
    `wide`: in 16-float vectors (KernelSchedule.wide)."""
    lines = [f"/* {ir.comment} */", _signature(ir, wide)]
    body = block_lines(ir.body, C)
    if not ir.loops:
        return "\n".join(lines + [f"#pragma omp single{'' if barrier else ' nowait'}", "{", *("  " + line for line in body), "}", "}"])
    parallel = sum(loop.parallel for loop in ir.loops)
    return "\n".join(lines + _omp_loops(ir.loops, parallel, body, barrier, ir.version_on))


def _omp_loops(loops: list[Loop], parallel: int, body: list[str], barrier: bool,
               version_on: Compare | None = None) -> list[str]:
    """`body` inside `loops`, the first `parallel` of them shared out by one `omp for`; the
    innermost loop of several is vectorized when annotated, and emitted twice when versioned:
    inside each copy gcc knows the guard's value, folds it away and vectorizes (loads behind a
    guard that the element loop does not change stop it)."""
    collapse = f" collapse({parallel})" if parallel > 1 else ""
    lines = [f"#pragma omp for{collapse} schedule(static){'' if barrier else ' nowait'}"]
    innermost = len(loops) > 1
    # The batch: as many rows as given; blocks of rows: as many blocks as they make.
    bound = {loop.var: int_expr(loop.bound) if loop.bound else "n" if loop.batch else loop.extent for loop in loops}
    for depth, loop in enumerate(loops[:-1] if innermost else loops):
        lines.append("  " * depth + f"for (int {loop.var} = 0; {loop.var} < {bound[loop.var]}; {loop.var}++) {{")
    depth = len(loops) - 1 if innermost else len(loops)
    if innermost:
        last = loops[-1]
        inner = ["#pragma omp simd"] if last.vector else []
        inner += [f"for (int {last.var} = 0; {last.var} < {bound[last.var]}; {last.var}++) {{", *("  " + line for line in body), "}"]
        if version_on is not None:
            inner = [f"if ({compare(version_on)}) {{", *("  " + line for line in inner), "} else {", *("  " + line for line in inner), "}"]
        lines += ["  " * depth + line for line in inner]
    else:
        lines += ["  " * depth + line for line in body]
    lines += ["  " * d + "}" for d in range(depth - 1, -1, -1)]
    return lines + ["}"]


def canonical_kernel_source(kernel: Kernel, materialized: set[Node], schedule: KernelSchedule | None = None) -> str:
    """The kernel's C with buffer and kernel names replaced by positional ones: identical layers
    (same computation on different weights and buffers) give the same text."""
    params = {node: f"p{position}" for position, node in enumerate(kernel.reads)}
    renamed = Kernel("kernel", kernel.node, kernel.fused, kernel.reads, kernel.attention)
    return render_kernel(renamed, materialized, params, schedule).split("\n", 1)[1]


def render_library(graph: Graph, kernels: list[Kernel], materialized: set[Node], plan: BufferPlan,
                   schedules: dict[str, KernelSchedule] | None = None, always_barrier: bool = False) -> str:
    """The whole program as one C file: kernels, then `lumos_forward`, the one-call driver, with
    a UNIT_BREAK before each kernel and before the driver (which declares every kernel), so that
    the cache can compile it as several translation units at once. `schedules` by kernel name
    (default: the renderer's heuristic); `always_barrier` ends every kernel with a barrier, so
    that the timed driver measures each kernel alone."""
    params = {node: f"b{node.id}" for node in graph.nodes}
    schedules = schedules or {}
    parts = [HEADER]
    keep = [True] * len(kernels) if always_barrier else barriers(graph, kernels, plan)
    prototypes = []
    for kernel, barrier in zip(kernels, keep, strict=True):
        text = render_kernel(kernel, materialized, params, schedules.get(kernel.name), barrier)
        parts += [UNIT_BREAK, text]
        signature = next(line for line in text.splitlines() if line.startswith("LUMOS_KERNEL "))  # after its comment
        prototypes.append(signature.removesuffix(" {") + ";")
    parts += [UNIT_BREAK, "\n".join(prototypes)]
    inputs = list(graph.inputs.values())
    tensors = tensor_names(graph)
    outputs = list(graph.outputs.values())

    def pointer(node: Node) -> str:
        if node.op is Op.INPUT:
            return f"inputs[{inputs.index(node)}]"
        if node.op is Op.CONST:
            return f"tensors[{tensors.index(node.arg)}]"
        if node in outputs:
            return f"outputs[{outputs.index(node)}]"
        return f"(float*)(arena + {plan.buffers[node].offset})"

    calls = [f"    {k.name}(n, {', '.join(pointer(node) for node in [k.node, *k.reads])});" for k in kernels]
    timed = [f"{call}\n    #pragma omp master\n    times[{i + 1}] = omp_get_wtime();" for i, call in enumerate(calls)]
    signature = ("const float* const* inputs, float* const* outputs, const float* const* tensors, char* arena, int n, "
                 "int threads")
    parts.append(
        "/* Runs the whole graph: inputs, outputs and constant tensors in the plan's order; arena holds\n"
        f"   every intermediate ({plan.arena_bytes} bytes, 64-byte aligned); n rows (at most {graph.batch}) when\n"
        "   the batch is symbolic, else ignored; on `threads` threads. */\n"
        f"void lumos_forward({signature}) {{\n"
        "  #pragma omp parallel num_threads(threads)\n  {\n" + "\n".join(calls) + "\n  }\n}\n"
    )
    parts.append(
        "/* The same, recording the time at which each kernel ends (for profiling). */\n"
        f"void lumos_forward_timed({signature}, double* times) {{\n"
        "  #pragma omp parallel num_threads(threads)\n  {\n    #pragma omp master\n    times[0] = omp_get_wtime();\n"
        + "\n".join(timed)
        + "\n  }\n}\n"
    )
    return "\n\n".join(parts)


def tensor_names(graph: Graph) -> list[str]:
    """Constant tensors in the order the driver takes them."""
    return sorted({node.arg for node in graph.nodes if node.op is Op.CONST and isinstance(node.arg, str)})
