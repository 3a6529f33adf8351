"""The schedule ruleset: the loop-nest variants of one kernel, as an e-graph of equivalent schedules.

A kernel's loop nest is the term `Sched(interchange, tile, collapse, unroll, simd, rows, lanes, wide)`
(the fields of schedule.KernelSchedule; interchange 0 = the renderer's heuristic, 1 = reduction loop
outside the last output loop, 2 = never). Each rule is one local loop transformation, legal only under facts
about this kernel's loops (which the caller asserts as relations):

- swap: move the reduction loop outside the last output loop (row-wise matmul), or keep it inside;
- split/tile: split the last output loop into tiles whose accumulators stay in registers;
- block: also split an outer loop into blocks of rows, a rows × columns block of sums held in
  vector registers (the register-blocked matmul micro-kernel; it unrolls its own reduction loop);
- parallelize: share out only the outermost loop instead of the merged (collapsed) outer loops;
- unroll: unroll the reduction loop;
- vectorize: mark the innermost output loop `omp simd`;
- key blocks (fused attention): how many keys' scores are computed before one rescaling;
- query blocks (fused attention): how many queries share each key's value row;
- wide vectors (fused attention, AVX-512 hosts): its scores and output rows in 16-float vectors;
- wide loops (AVX-512 hosts, kernels with a 2^x, log, sine, reciprocal or square root): gcc
  vectorizes the kernel's own loops in 16-float vectors too (its default on these hosts is 8).

All the terms end in the kernel's root e-class (they compute the same thing), and every one of
them is extracted as a candidate for the search to measure: a static cost cannot tell which is
fastest on this machine.
"""

from __future__ import annotations

import functools
import re

from egglog import EGraph, Expr, i64, i64Like, relation, rule, ruleset, union, vars_

from lumos.compile.ir.graph import UNARY
from lumos.compile.runtime.kernel_cache import host_cpu
from lumos.compile.schedule.kernels import Kernel, KernelSchedule

TILES = (8, 16, 32, 64)
UNROLL = 4
BLOCKS = ((2, 32), (4, 16), (4, 32), (6, 16), (8, 16), (6, 32))
"""(rows, columns) of the register-blocked matmul: rows × columns / 8 vector accumulators, plus
columns / 8 weight vectors and one broadcast value, fit AVX2's 16 registers (8 × 16 spills a few
there; 6 × 32, 24 accumulators, fits only AVX-512's 32); which is fastest depends on the machine
and the matmul's sizes (6 × 32 won the quickstart model's feed-forward layers here: 4.7 against
5.3 ms for the best of the others; 12 × 16 never won and is not offered)."""
WIDE_BLOCKS = ((4, 32), (6, 32), (4, 64), (6, 64))
"""(rows, columns) of the register block in 16-lane vectors (AVX-512 hosts only): rows × columns /
16 accumulators of the 32 registers. Where the host has two 512-bit FMA units, they double the
FMA rate of 8-lane vectors (measured by benchmarks/fma_peak.py: 334 against 182 GFLOP/s on a
2-core Sapphire Rapids slice); where 512-bit vectors run as two halves, the search finds no gain."""
QUERY_BLOCKS = (1, 2, 4, 8)
"""Queries per fused attention block (besides the renderer's default, which is one of them)."""
AUTO, ROW_WISE, DOT = 0, 1, 2


class Sched(Expr):
    def __init__(self, interchange: i64Like, tile: i64Like, collapse: i64Like, unroll: i64Like, simd: i64Like,
                 rows: i64Like, lanes: i64Like, wide: i64Like) -> None: ...


reduces = relation("reduces")
"""The kernel has a top-level reduction loop (its loops can be swapped)."""
row_wise_legal = relation("row_wise_legal")
tile_fits = relation("tile_fits", i64)
"""The last output loop splits evenly into tiles of this size."""
register_block = relation("register_block", i64, i64, i64)
"""A block of this many rows × columns, in vectors of this many lanes (0: 8), fits the matmul's
output (the renderer checks the rest: a contiguous weight read shared by the rows; else the
schedule renders as plain row-wise)."""
many_outer = relation("many_outer")
"""More than one outer loop is shared out to threads (so sharing only the first is a variant)."""
elementwise = relation("elementwise")
key_block = relation("key_block", i64)
"""A fused attention kernel can take its keys in blocks of this size."""
query_block = relation("query_block", i64)
"""A fused attention kernel can take its queries in blocks of this size (the `rows` field)."""
wide_vectors = relation("wide_vectors")
"""A fused attention kernel can run in 16-float vectors (the host has AVX-512, and its head size
is a multiple of 16)."""
wide_loops = relation("wide_loops")
"""gcc may vectorize the kernel's loops in 16-float vectors (the host has AVX-512). gcc's own
choice there is 8 (-mprefer-vector-width=256), which is right for some kernels and not for others:
on a Sapphire Rapids slice, 16 made a feed-forward matmul whose prologue computes GELU (erf: a
2^x and a division per element) 20% faster, 0.62 → 0.50 ms, and a matmul whose prologue is a layer
norm 15% slower, 1.21 → 1.40 ms. Hence a per-kernel choice the search measures, offered only where
the kernel computes such a function: the kernels it can help."""

a, t, c, u, s, m, n, w, x = vars_("a t c u s m n w x", i64)

schedule_rules = ruleset(
    rule(Sched(AUTO, 0, c, u, s, 0, w, x), row_wise_legal(), name="swap:row-wise").then(
        union(Sched(AUTO, 0, c, u, s, 0, w, x)).with_(Sched(ROW_WISE, 0, c, u, s, 0, w, x))),
    rule(Sched(AUTO, 0, c, u, s, 0, w, x), reduces(), name="swap:dot").then(
        union(Sched(AUTO, 0, c, u, s, 0, w, x)).with_(Sched(DOT, 0, c, u, s, 0, w, x))),
    rule(Sched(ROW_WISE, 0, c, u, s, 0, w, x), tile_fits(n), name="tile:registers").then(
        union(Sched(ROW_WISE, 0, c, u, s, 0, w, x)).with_(Sched(ROW_WISE, n, c, u, s, 0, w, x))),
    rule(Sched(ROW_WISE, 0, c, 0, s, 0, 0, x), register_block(m, n, w), name="block:registers").then(
        union(Sched(ROW_WISE, 0, c, 0, s, 0, 0, x)).with_(Sched(ROW_WISE, n, c, 0, s, m, w, x))),
    rule(Sched(AUTO, 0, c, u, s, 0, w, x), key_block(n), name="tile:key-block").then(
        union(Sched(AUTO, 0, c, u, s, 0, w, x)).with_(Sched(AUTO, n, c, u, s, 0, w, x))),
    rule(Sched(AUTO, t, c, u, s, 0, w, x), query_block(m), name="block:queries").then(
        union(Sched(AUTO, t, c, u, s, 0, w, x)).with_(Sched(AUTO, t, c, u, s, m, w, x))),
    rule(Sched(AUTO, t, c, u, s, m, 0, x), wide_vectors(), name="vectorize:16-lanes").then(
        union(Sched(AUTO, t, c, u, s, m, 0, x)).with_(Sched(AUTO, t, c, u, s, m, 16, x))),
    rule(Sched(a, t, 0, u, s, m, w, x), many_outer(), name="parallelize:outermost").then(
        union(Sched(a, t, 0, u, s, m, w, x)).with_(Sched(a, t, 1, u, s, m, w, x))),
    rule(Sched(a, t, c, 0, s, 0, w, x), reduces(), name="unroll:reduction").then(
        union(Sched(a, t, c, 0, s, 0, w, x)).with_(Sched(a, t, c, UNROLL, s, 0, w, x))),
    rule(Sched(a, t, c, u, 0, m, w, x), elementwise(), name="vectorize:inner").then(
        union(Sched(a, t, c, u, 0, m, w, x)).with_(Sched(a, t, c, u, 1, m, w, x))),
    rule(Sched(a, t, c, u, s, m, w, 0), wide_loops(), name="vectorize:wide-loops").then(
        union(Sched(a, t, c, u, s, m, w, 0)).with_(Sched(a, t, c, u, s, m, w, 1))),
)


@functools.cache
def has_avx512() -> bool:
    """Whether this host's CPU has AVX-512 (which `-march=native` then lets gcc use)."""
    return "avx512f" in host_cpu().replace(";", " ").split()


_TERM = re.compile(r"Sched\(" + ", ".join([r"(-?\d+)"] * 8) + r"\)")


Fact = tuple
"""A fact about one kernel's loops, as plain values: ("key_block", 64), ("reduces",), …"""

_RELATIONS = {"reduces": reduces, "row_wise_legal": row_wise_legal, "tile_fits": tile_fits,
              "register_block": register_block, "many_outer": many_outer, "elementwise": elementwise,
              "key_block": key_block, "query_block": query_block, "wide_vectors": wide_vectors,
              "wide_loops": wide_loops}
WHOLE_KEYS_MAX = 1024
"""A fused attention kernel can take all its keys as one block (one pass, no rescaling) up to
this many: its scores row per query stays on the stack."""


def kernel_facts(kernel: Kernel, register_blocks: bool = True) -> tuple[Fact, ...]:
    node = kernel.node if kernel.attention is None else kernel.attention.out  # its loops: not the copy it may write
    loops = [size for size in node.shape if size > 1]
    facts: list[Fact] = []
    if kernel.attention is not None:
        keys = kernel.attention.product.shape[node.arg]
        # Blocks of 8 … 128 keys, and all the keys at once (at 101 keys, one block of 101 ran
        # 11.6 ms against 15 ms for the best block of 64: the last, partial block costs a rescaling).
        blocks = {block for block in (8, 16, 64, 128) if block < keys} | ({keys} if keys <= WHOLE_KEYS_MAX else set())
        facts += [("key_block", block) for block in sorted(blocks)]
        queries = loops[-2] if len(loops) >= 2 else 1  # (..., queries, value width)
        facts += [("query_block", block) for block in QUERY_BLOCKS if block < queries]
        if has_avx512() and loops[-1] % 16 == 0:
            facts.append(("wide_vectors",))
        return tuple(facts + [("many_outer",)] * (len(loops) >= 3))
    if kernel.kind == "reduce" and len(loops) >= 2:
        facts.append(("reduces",))
        if loops[-1] <= 1024:
            facts.append(("row_wise_legal",))
            facts += [("tile_fits", tile) for tile in TILES if loops[-1] % tile == 0 and loops[-1] > tile]
            if register_blocks:
                facts += [("register_block", rows, cols, 0) for rows, cols in BLOCKS if cols <= loops[-1]]
                if has_avx512():
                    facts += [("register_block", rows, cols, 16) for rows, cols in WIDE_BLOCKS if cols <= loops[-1]]
    if len(loops) >= 3:
        facts.append(("many_outer",))
    if kernel.kind == "elementwise" and len(loops) >= 2:
        facts.append(("elementwise",))
    if has_avx512() and any(node.op in UNARY for node in kernel.unique_fused):
        facts.append(("wide_loops",))
    return tuple(facts)


def schedule_candidates(kernel: Kernel, limit: int = 256,
                        register_blocks: bool = True) -> tuple[list[KernelSchedule], dict[str, int]]:
    """Every schedule the rules reach from the renderer's default, and how often each rule fired
    (without `register_blocks`: no register-blocked matmuls, to measure what they gain)."""
    schedules, fired = _candidates(kernel_facts(kernel, register_blocks), limit)
    return list(schedules), dict(fired)


@functools.cache
def _candidates(facts: tuple[Fact, ...], limit: int) -> tuple[tuple[KernelSchedule, ...], tuple[tuple[str, int], ...]]:
    """The e-graph run for one set of facts: kernels with the same facts (every layer's copy of a
    kernel, most elementwise kernels) share it; each run prints its terms, which egglog formats
    one by one (2.6 s of a 46 s search before)."""
    egraph = EGraph()
    root = egraph.let("root", Sched(AUTO, 0, 0, 0, 0, 0, 0, 0))
    if facts:
        egraph.register(*(_RELATIONS[name](*map(i64, values)) for name, *values in facts))
    report = egraph.run(schedule_rules.saturate())
    terms = egraph.extract_multiple(root, limit)
    schedules = []
    for term in terms:
        match = _TERM.fullmatch(str(term))
        if match is None:
            continue
        interchange, tile, collapse, unroll, simd, rows, lanes, wide = map(int, match.groups())
        schedules.append(KernelSchedule({AUTO: None, ROW_WISE: True, DOT: False}[interchange], tile, collapse,
                                        unroll, bool(simd), rows, lanes, bool(wide)))
    schedules.sort(key=lambda sched: sched != KernelSchedule())
    fired = {getattr(rule_, "name", None) or str(rule_): count for rule_, count in report.num_matches_per_rule.items() if count}
    return tuple(schedules), tuple(fired.items())
