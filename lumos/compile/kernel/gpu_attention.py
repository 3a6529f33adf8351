"""GPU thread mappings of a fused attention (egraph/attention.py's online softmax): an
AttentionIR in, a KernelIR whose body says which thread computes what out; render/cuda.py prints it.

- *flash* (when the score is q · k and the value one read): one block per (batch·head, tile of 64
  queries), a thread per query with its query row, running max, sum and output row in registers,
  key and value rows staged in shared memory 32 keys at a time for the whole block; the score
  matrix is never stored;
- *attention_warp* (any other online softmax): one warp per query, each lane taking every 32nd key
  with its own running max, sum and output row, merged across the warp at the end.
"""

from __future__ import annotations

from lumos.compile.kernel.gpu_ir import (
    Barrier,
    ClampedRow,
    Grid,
    MergeLanes,
    OnlineSoftmax,
    OverStaged,
    QueryRow,
    Shared,
    SharedRead,
    SliceLoop,
    SoftmaxState,
    SoftmaxStore,
    StagedDot,
    StageRows,
    Strided,
    TileOffset,
)
from lumos.compile.kernel.gpu_tiles import THREADS, WARP, digits, rows
from lumos.compile.kernel.ir import AttentionIR, KernelIR, Load, Loop, RowOf, expr_vars
from lumos.compile.kernel.passes import match_scores, stride_along

FLASH_QUERIES = 64
"""Queries per block of the flash-attention kernel (one thread each)."""
FLASH_KEYS = 32
"""Keys per shared-memory tile of the flash-attention kernel."""
FLASH_WIDTH = 128
"""Widest query, key or value row the flash-attention kernel keeps in registers."""


def map_attention(ir: AttentionIR) -> KernelIR:
    return flash_attention(ir) or warp_per_query(ir)


def flash_attention(ir: AttentionIR) -> KernelIR | None:
    """One block per (batch·head, tile of FLASH_QUERIES queries), one thread per query holding its
    query row, running max, sum and output row in registers; the keys in tiles of FLASH_KEYS
    whose key and value rows the block stages in shared memory once for all its queries. The
    score (dot product, then its epilogue: scale, mask) and the online softmax per key; no score
    matrix. Needs the score to be q · k with k one read (passes.match_scores) and the value one
    read; else None (the warp-per-query kernel)."""
    query = ir.rows[-1]
    scores = match_scores(ir, query.var, contiguous=False)  # staged through shared memory: any layout
    if (scores is None or query.batch or ir.value_stmts or not isinstance(ir.value, Load)
            or any(isinstance(i, RowOf) for i in ir.value.indices) or query.var in expr_vars(ir.value)
            or max(ir.width, scores.dot.length) > FLASH_WIDTH):
        return None
    dot, others = scores.dot, ir.rows[:-1]
    depth, width = dot.length, ir.width
    tiles = -(-query.extent // FLASH_QUERIES)
    batched, static = rows(others)
    grid = Grid("flash", (FLASH_QUERIES, 1, 1), batched, static * tiles, 1, 1, [("query_tile", tiles), *digits(others)],
                guarded=False)
    # Neighbouring threads read neighbouring addresses: along the keys when the key rows are
    # stored that way round (layout.transpose_activations), else along the key row.
    stage_keys = StageRows("key_tile", "stage the keys", dot.var, FLASH_KEYS, depth, FLASH_QUERIES, scores.key,
                           along_keys=stride_along(scores.key, "j") == 1)
    stage_values = StageRows("value_tile", "and the values", "dd", FLASH_KEYS, width, FLASH_QUERIES, ir.value,
                             along_keys=False)
    per_key = [StagedDot(dot.acc, dot.var, depth, "key_tile"), *scores.epilogue,
               OnlineSoftmax(ir.score, ir.scale, width, [], SharedRead("value_tile", ("jj", "dd")))]
    body = [
        Shared("key_tile", (FLASH_KEYS, depth + 1)),
        Shared("value_tile", (FLASH_KEYS, width + 1)),
        grid,
        ClampedRow(query.var, "query_at", TileOffset("query_tile", FLASH_QUERIES, "threadIdx.x"), query.extent),
        SoftmaxState(width, QueryRow(dot.var, depth, scores.query_value)),
        SliceLoop("j0", ir.keys, FLASH_KEYS, [Barrier("the previous tile is used up"), stage_keys, stage_values,
                                              Barrier(), OverStaged(per_key)], count="jn"),
        SoftmaxStore(width, ir.out, Loop("query_at", query.extent)),
    ]
    return KernelIR(ir.name, ir.node, ir.params, ir.rows, body, ops=0)


def warp_per_query(ir: AttentionIR) -> KernelIR:
    batched, static = rows(ir.rows)
    grid = Grid("attention_warp", (THREADS, 1, 1), batched, static, THREADS // WARP, 1, digits(ir.rows), guarded=True)
    per_key = [*ir.score_stmts, OnlineSoftmax(ir.score, ir.scale, ir.width, ir.value_stmts, ir.value)]
    body = [grid, SoftmaxState(ir.width),
            Strided("j", "lane", ir.keys, WARP, per_key, "this lane's keys: online softmax"),
            MergeLanes(ir.scale, ir.width, ir.out)]
    return KernelIR(ir.name, ir.node, ir.params, ir.rows, body, ops=0)
