"""The CUDA renderer: the kernel IR as CUDA C kernels, and the launch table the runtime follows.

Expressions and statements print as in C (render/cstyle.py); what differs is the frame around
them, chosen per kernel by its shape in the IR:

- *elementwise* (no long reduction at the top of the body, gathers included): one thread per
  output element, the output loops decoded from the global thread index;
- *warp*: a reduction of at least 32 steps at the top of the body (layer norm's statistics,
  softmax's max and sum, a dot product that is no tiled matmul): one warp per output element,
  its lanes taking every 32nd step and combining by shuffles (lumos_warp_sum / _max), the rest
  of the body on every lane, lane 0 storing; *block*, for reductions of 2048 steps or more: the
  same over a block of 256 threads, the warps' results combined through shared memory;
- *tiled*: the kernel's one reduction is a sum of `value · weight` where the weight does not
  depend on some output row loop and the value not on the column loop (x @ W, P @ V): 16×16
  output tiles per block, 16-step slices of both operands staged in shared memory. The value is
  computed as it is staged, so a fused layer-norm (or GELU) prologue runs there; the statements
  after the sum (bias, GELU, residual) run per output on the summed tile;
- *flash* (egraph/attention.py's online softmax, when the score is q · k and the value one read):
  one block per (batch·head, tile of 64 queries), a thread per query with its query row, running
  max, sum and output row in registers, key and value rows staged in shared memory 32 keys at a
  time for the whole block; the score matrix is never stored;
- *attention_warp* (any other online softmax): one warp per query, each lane taking every 32nd key
  with its own running max, sum and output row, merged across the warp at the end.

Gathers read a row only when its id is inside the table (else 0). Kernels are `extern "C"`, so
the runtime finds them by name, and all take (n, out, reads…) like the C ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from lumos.compile.ir.graph import Graph, Node, Op
from lumos.compile.kernel.ir import (
    AttentionIR,
    KernelIR,
    Load,
    Loop,
    Reduce,
    RowOf,
    Store,
    expr_vars,
    needed,
)
from lumos.compile.kernel.lower import lower_attention, lower_kernel
from lumos.compile.kernel.passes import match_matmul, match_scores, stride_along
from lumos.compile.render.c import tensor_names
from lumos.compile.render.cstyle import Dialect, block_lines, cond, expr, initial, literal, stmt_lines, update
from lumos.compile.schedule.buffers import BufferPlan
from lumos.compile.schedule.kernels import Kernel

HEADER = resources.files(__package__).joinpath("lumos_cuda.h").read_text()
"""The CUDA header every program starts with: the math helpers and warp reductions the kernels call."""

CUDA = Dialect(restrict="__restrict__", unroll="#pragma unroll {}", vector_reduce=None)
THREADS = 256
"""Threads per block of the elementwise, warp and attention kernels."""
WARP = 32
TILE = 16
"""Output tile edge (and reduction slice) of the tiled matmul: 16×16 threads per block."""
WARP_REDUCE_FROM = WARP
"""Top-level reductions at least this long are shared out over a warp's lanes."""
BLOCK_REDUCE_FROM = 2048
"""… and at least this long over a whole block's threads (warp shuffles, then shared memory)."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch: blocks of `block` threads, grid ⌈rows·mult / per⌉·groups blocks where
    rows is the runtime row count n for a batched kernel, else 1."""

    name: str
    kind: str
    block: tuple[int, int, int]
    batched: bool
    mult: int
    per: int
    groups: int
    buffers: tuple[tuple[str, int], ...]
    """Its pointer arguments after n, in order: ("input"|"output"|"tensor", index) or ("arena", offset)."""

    def grid(self, n: int) -> int:
        rows = n if self.batched else 1
        return -(-(rows * self.mult) // self.per) * self.groups


@dataclass
class CudaProgram:
    kernels: dict[str, str]
    """Each kernel's source by name (without the header)."""
    launches: list[Launch]

    @property
    def source(self) -> str:
        """The whole program: the header and every kernel, one compilation unit."""
        return "\n\n".join([HEADER, *self.kernels.values()]) + "\n"

    def kernel_source(self, name: str) -> str:
        """One kernel alone with the header: a unit NVRTC can compile (tests name the failing kernel)."""
        return f"{HEADER}\n\n{self.kernels[name]}\n"


# ---------------------------------------------------------------------------------------------
# Frames


def _signature(name: str, params: list[str]) -> str:
    args = ["const int n", "float* __restrict__ out"] + [f"const float* __restrict__ {p}" for p in params]
    return f'extern "C" __global__ void __launch_bounds__({THREADS}) {name}({", ".join(args)})'


def _total(loops: list[Loop]) -> tuple[str, bool, int]:
    """The element count of `loops` as C (n times the rest for a batched dim 0), whether it is
    batched, and the static factor."""
    static = 1
    batched = False
    for loop in loops:
        if loop.batch:
            batched = True
        else:
            static *= loop.extent
    return (f"n * {static}" if batched else str(static)), batched, static


def _decode(loops: list[Loop], unit: str = "u") -> list[str]:
    """Bind every loop variable from a linear index (the last loop fastest, dim 0 the remainder)."""
    lines = []
    for position, loop in enumerate(reversed(loops)):
        if position == len(loops) - 1:
            lines.append(f"const int {loop.var} = {unit};")
        else:
            lines += [f"const int {loop.var} = {unit} % {loop.extent};", f"{unit} /= {loop.extent};"]
    return lines


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["  " * depth + line for line in lines]


def elementwise(ir: KernelIR) -> tuple[list[str], tuple]:
    total, batched, static = _total(ir.loops)
    body = [f"int u = blockIdx.x * {THREADS} + threadIdx.x;", f"if (u >= {total}) return;", *_decode(ir.loops),
            *block_lines(ir.body, CUDA)]
    return body, ("elementwise", (THREADS, 1, 1), batched, static, THREADS, 1)


def warp_per_output(ir: KernelIR) -> tuple[list[str], tuple]:
    total, batched, static = _total(ir.loops)
    warps = THREADS // WARP
    body = ["const int lane = threadIdx.x % 32;", f"int u = blockIdx.x * {warps} + threadIdx.x / 32;",
            f"if (u >= {total}) return;  /* the same for every lane of a warp */", *_decode(ir.loops)]
    for stmt in ir.body:
        if isinstance(stmt, Reduce) and stmt.length >= WARP_REDUCE_FROM:
            body += _warp_reduce(stmt)
        elif isinstance(stmt, Store):
            body += ["if (lane == 0)", *_indent(stmt_lines(stmt, CUDA))]
        else:
            body += stmt_lines(stmt, CUDA)
    return body, ("warp", (THREADS, 1, 1), batched, static, warps, 1)


def _warp_reduce(reduce: Reduce, stride: int = WARP, lane: str = "lane") -> list[str]:
    """Each lane sums every 32nd step (every `stride`th from `lane`); then the lanes combine
    (outside the guard, which is the same for the whole warp, so every lane takes part in the
    shuffles)."""
    combine = "lumos_warp_sum" if reduce.op is Op.SUM else "lumos_warp_max"
    step = update(reduce.op, reduce.acc, expr(reduce.value))
    lines = [f"float {reduce.acc} = {initial(reduce.init)};"]
    if reduce.guard:
        lines.append(f"if ({cond(reduce.guard)})")
    lines += ["{", f"for (int {reduce.var} = {lane}; {reduce.var} < {reduce.length}; {reduce.var} += {stride}) {{",
              *_indent(block_lines(reduce.body, CUDA)), f"  {step}", "}", "}",
              f"{reduce.acc} = {combine}({reduce.acc});"]
    return lines


def block_per_output(ir: KernelIR) -> tuple[list[str], tuple]:
    """One block per output element for long reductions: each thread takes every 256th step, the
    warps combine by shuffles and the block through shared memory; thread 0 stores."""
    total, batched, static = _total(ir.loops)
    warps = THREADS // WARP
    body = ["__shared__ float partial[8];", "const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;",
            "int u = blockIdx.x;", f"if (u >= {total}) return;  /* the same for every thread of the block */",
            *_decode(ir.loops)]
    for stmt in ir.body:
        if isinstance(stmt, Reduce) and stmt.length >= WARP_REDUCE_FROM:
            combine = "({} + {})" if stmt.op is Op.SUM else "lumos_max({}, {})"
            body += _warp_reduce(stmt, stride=THREADS, lane="threadIdx.x")
            body += ["__syncthreads();  /* partial may still hold the previous reduction's values */",
                     f"if (lane == 0) partial[warp] = {stmt.acc};", "__syncthreads();",
                     f"{stmt.acc} = partial[0];",
                     f"for (int w = 1; w < {warps}; w++) {stmt.acc} = {combine.format(stmt.acc, 'partial[w]')};"]
        elif isinstance(stmt, Store):
            body += ["if (threadIdx.x == 0)", *_indent(stmt_lines(stmt, CUDA))]
        else:
            body += stmt_lines(stmt, CUDA)
    return body, ("block", (THREADS, 1, 1), batched, static, 1, 1)


def tiled_matmul(ir: KernelIR) -> tuple[list[str], tuple] | None:
    """The shared-memory tiled matmul for the kernels kernel_passes.match_matmul accepts (the
    same ones the C renderer can register-block), or None."""
    match = match_matmul(ir, TILE)
    if match is None:
        return None
    reduce, column, row, value, weight = match.reduce, match.column, match.row, match.value, match.weight
    others = [loop for loop in ir.loops[:-1] if loop is not row]
    r, steps = reduce.var, reduce.length
    col_tiles = -(-column.extent // TILE)
    row_bound = "n" if row.batch else str(row.extent)
    row_tiles = "(n + 15) / 16" if row.batch else str(-(-row.extent // TILE))
    static_others = [loop for loop in others if not loop.batch]
    z = 1
    for loop in static_others:
        z *= loop.extent
    body = [f"__shared__ float tile_value[{TILE}][{TILE + 1}];", f"__shared__ float tile_weight[{TILE}][{TILE + 1}];",
            "const int tx = threadIdx.x, ty = threadIdx.y;", "int u = blockIdx.x;",
            f"const int col_tile = u % {col_tiles};", f"u /= {col_tiles};"]
    if row.batch:  # the row tiles are the remainder: their count depends on n
        body += _decode_static(static_others) + ["const int row_tile = u;"]
        launch = ("tiled", (TILE, TILE, 1), True, 1, TILE, col_tiles * z)
    else:
        body += [f"const int row_tile = u % {row_tiles};", f"u /= {row_tiles};", *_decode(others)]
        batched = any(loop.batch for loop in others)
        launch = ("tiled", (TILE, TILE, 1), batched, col_tiles * int(row_tiles) * z, 1, 1)
    value_stmts = needed(match.hoisted, value)  # the weight is one read: nothing to compute first
    body += [
        "float sum = 0.0f;",
        f"for (int k0 = 0; k0 < {steps}; k0 += {TILE}) {{",
        "  {  /* the value slice, computed as it is staged (a fused prologue runs here) */",
        f"    const int {row.var} = row_tile * {TILE} + ty;",
        f"    const int {r} = k0 + tx;",
        "    float x = 0.0f;",
        f"    if ({row.var} < {row_bound} && {r} < {steps}) {{",
        *_indent(block_lines(value_stmts, CUDA), 3),
        f"      x = {expr(value)};",
        "    }",
        "    tile_value[ty][tx] = x;",
        "  }",
        "  {  /* the weight slice */",
        f"    const int {column.var} = col_tile * {TILE} + tx;",
        f"    const int {r} = k0 + ty;",
        "    float w = 0.0f;",
        f"    if ({column.var} < {column.extent} && {r} < {steps}) w = {expr(weight)};",
        "    tile_weight[ty][tx] = w;",
        "  }",
        "  __syncthreads();",
        "  #pragma unroll",
        f"  for (int kk = 0; kk < {TILE}; kk++) sum += tile_value[ty][kk] * tile_weight[kk][tx];",
        "  __syncthreads();",
        "}",
        f"const int {row.var} = row_tile * {TILE} + ty;",
        f"const int {column.var} = col_tile * {TILE} + tx;",
        f"if ({row.var} < {row_bound} && {column.var} < {column.extent}) {{  /* the epilogue, per output */",
        f"  const float {reduce.acc} = sum;",
        *_indent(block_lines(ir.body[1:], CUDA)),
        "}",
    ]
    return body, launch


def _decode_static(loops: list[Loop]) -> list[str]:
    lines = []
    for loop in reversed(loops):
        lines += [f"const int {loop.var} = u % {loop.extent};", f"u /= {loop.extent};"]
    return lines


FLASH_QUERIES = 64
"""Queries per block of the flash-attention kernel (one thread each)."""
FLASH_KEYS = 32
"""Keys per shared-memory tile of the flash-attention kernel."""
FLASH_WIDTH = 128
"""Widest query, key or value row the flash-attention kernel keeps in registers."""


def flash_attention(ir: AttentionIR) -> tuple[list[str], tuple] | None:
    """One block per (batch·head, tile of FLASH_QUERIES queries), one thread per query holding its
    query row, running max, sum and output row in registers; the keys in tiles of FLASH_KEYS
    whose key and value rows the block stages in shared memory once for all its queries. The
    score (dot product, then its epilogue: scale, mask) and the online softmax per key; no score
    matrix. Needs the score to be q · k with k one read (kernel_passes.match_scores) and the
    value one read; else None (the warp-per-query kernel)."""
    query = ir.rows[-1]
    scores = match_scores(ir, query.var, contiguous=False)  # staged through shared memory: any layout
    if (scores is None or query.batch or ir.value_stmts or not isinstance(ir.value, Load)
            or any(isinstance(i, RowOf) for i in ir.value.indices) or query.var in expr_vars(ir.value)
            or max(ir.width, scores.dot.length) > FLASH_WIDTH):
        return None
    dot, others = scores.dot, ir.rows[:-1]
    depth, width, keys = dot.length, ir.width, ir.keys
    tiles = -(-query.extent // FLASH_QUERIES)
    total, batched, static = _total(others)
    scale = literal(ir.scale)
    # Neighbouring threads read neighbouring addresses: along the keys when the key rows are
    # stored that way round (layout.transpose_activations), else along the key row.
    stage_keys = (f"jj = e % {FLASH_KEYS}, {dot.var} = e / {FLASH_KEYS}" if stride_along(scores.key, "j") == 1
                  else f"jj = e / {depth}, {dot.var} = e % {depth}")
    body = [
        f"__shared__ float key_tile[{FLASH_KEYS}][{depth + 1}];",
        f"__shared__ float value_tile[{FLASH_KEYS}][{width + 1}];",
        "int u = blockIdx.x;",
        f"const int query_tile = u % {tiles};",
        f"u /= {tiles};",
        *_decode(others),
        f"const int query_at = query_tile * {FLASH_QUERIES} + threadIdx.x;",
        f"const int {query.var} = query_at < {query.extent} ? query_at : {query.extent - 1};  /* past the end: computed, not stored */",
        f"float qv[{depth}], o[{width}], m = -INFINITY, l = 0.0f;",
        f"for (int {dot.var} = 0; {dot.var} < {depth}; {dot.var}++) qv[{dot.var}] = {expr(scores.query_value)};",
        f"for (int dd = 0; dd < {width}; dd++) o[dd] = 0.0f;",
        f"for (int j0 = 0; j0 < {keys}; j0 += {FLASH_KEYS}) {{",
        f"  const int jn = {keys} - j0 < {FLASH_KEYS} ? {keys} - j0 : {FLASH_KEYS};",
        "  __syncthreads();  /* the previous tile is used up */",
        f"  for (int e = threadIdx.x; e < {FLASH_KEYS * depth}; e += {FLASH_QUERIES}) {{  /* stage the keys */",
        f"    const int {stage_keys}, j = j0 + jj;",
        f"    key_tile[jj][{dot.var}] = jj < jn ? {expr(scores.key)} : 0.0f;",
        "  }",
        f"  for (int e = threadIdx.x; e < {FLASH_KEYS * width}; e += {FLASH_QUERIES}) {{  /* and the values */",
        f"    const int jj = e / {width}, dd = e % {width}, j = j0 + jj;",
        f"    value_tile[jj][dd] = jj < jn ? {expr(ir.value)} : 0.0f;",
        "  }",
        "  __syncthreads();",
        "  for (int jj = 0; jj < jn; jj++) {",
        "    const int j = j0 + jj;",
        f"    float {dot.acc} = 0.0f;",
        "    #pragma unroll 8",
        f"    for (int {dot.var} = 0; {dot.var} < {depth}; {dot.var}++) {dot.acc} += qv[{dot.var}] * key_tile[jj][{dot.var}];",
        *_indent(block_lines(scores.epilogue, CUDA), 2),
        f"    const float s = {expr(ir.score)};",
        "    const float mn = lumos_max(m, s);",
        f"    const float corr = lumos_exp2f((m - mn) * {scale});  /* the max-rescaling identity */",
        f"    const float p = lumos_exp2f((s - mn) * {scale});",
        "    l = l * corr + p;",
        f"    for (int dd = 0; dd < {width}; dd++) o[dd] = o[dd] * corr + p * value_tile[jj][dd];",
        "    m = mn;",
        "  }",
        "}",
        f"if (query_at < {query.extent})",
        f"  for (int dd = 0; dd < {width}; dd++) out[{ir.out}] = o[dd] / l;",
    ]
    return body, ("flash", (FLASH_QUERIES, 1, 1), batched, static * tiles, 1, 1)


def attention(ir: AttentionIR) -> tuple[list[str], tuple]:
    total, batched, static = _total(ir.rows)
    warps = THREADS // WARP
    scale = literal(ir.scale)
    body = [
        "const int lane = threadIdx.x % 32;",
        f"int u = blockIdx.x * {warps} + threadIdx.x / 32;",
        f"if (u >= {total}) return;  /* one warp per query */",
        *_decode(ir.rows),
        f"float m = -INFINITY, l = 0.0f, o[{ir.width}];",
        f"for (int dd = 0; dd < {ir.width}; dd++) o[dd] = 0.0f;",
        f"for (int j = lane; j < {ir.keys}; j += 32) {{  /* this lane's keys: online softmax */",
        *_indent(block_lines(ir.score_stmts, CUDA)),
        f"  const float s = {expr(ir.score)};",
        "  const float mn = lumos_max(m, s);",
        f"  const float corr = lumos_exp2f((m - mn) * {scale});  /* the max-rescaling identity */",
        f"  const float p = lumos_exp2f((s - mn) * {scale});",
        "  l = l * corr + p;",
        f"  for (int dd = 0; dd < {ir.width}; dd++) {{",
        *_indent(block_lines(ir.value_stmts, CUDA), 2),
        f"    o[dd] = o[dd] * corr + p * {expr(ir.value)};",
        "  }",
        "  m = mn;",
        "}",
        "const float mw = lumos_warp_max(m);  /* merge the lanes: rescale each to the warp's max */",
        f"const float c = m == -INFINITY ? 0.0f : lumos_exp2f((m - mw) * {scale});",
        "const float lw = lumos_warp_sum(l * c);",
        f"for (int dd = 0; dd < {ir.width}; dd++) {{",
        "  const float od = lumos_warp_sum(o[dd] * c);",
        f"  if (lane == 0) out[{ir.out}] = od / lw;",
        "}",
    ]
    return body, ("attention_warp", (THREADS, 1, 1), batched, static, warps, 1)


# ---------------------------------------------------------------------------------------------
# Kernels and programs


def render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str]) -> tuple[str, tuple]:
    """One kernel's CUDA source and its launch shape (kind, block, batched, mult, per, groups)."""
    node = kernel.node
    if kernel.attention is not None:
        ir = lower_attention(kernel, materialized, params, check_gathers=True)
        body, launch = flash_attention(ir) or attention(ir)
        comment = f"{kernel.name}: %{node.id} attention{list(node.shape)}, online softmax over {ir.keys} keys"
        names = ir.params
    else:
        ir = lower_kernel(kernel, materialized, params, check_gathers=True)
        frame = tiled_matmul(ir)
        if frame is None:
            longest = max((s.length for s in ir.body if isinstance(s, Reduce)), default=0)
            frame = (block_per_output(ir) if longest >= BLOCK_REDUCE_FROM else
                     warp_per_output(ir) if longest >= WARP_REDUCE_FROM else elementwise(ir))
        body, launch = frame
        comment = ir.comment
        names = ir.params
    comment = comment.replace("*/", "* /")
    source = "\n".join([f"/* {comment} ({launch[0]}) */", _signature(kernel.name, names) + " {", *_indent(body), "}"])
    return source, launch


def render_program(graph: Graph, kernels: list[Kernel], materialized: set[Node], plan: BufferPlan) -> CudaProgram:
    """Every kernel of the program in one CUDA source, and the launches in order."""
    params = {node: f"b{node.id}" for node in graph.nodes}
    inputs, outputs, tensors = list(graph.inputs.values()), list(graph.outputs.values()), tensor_names(graph)

    def pointer(node: Node) -> tuple[str, int]:
        if node.op is Op.INPUT:
            return ("input", inputs.index(node))
        if node.op is Op.CONST:
            return ("tensor", tensors.index(node.arg))
        if node in outputs:
            return ("output", outputs.index(node))
        return ("arena", plan.buffers[node].offset)

    sources, launches = {}, []
    for kernel in kernels:
        source, (kind, block, batched, mult, per, groups) = render_kernel(kernel, materialized, params)
        sources[kernel.name] = source
        launches.append(Launch(kernel.name, kind, block, batched, mult, per, groups,
                               tuple(pointer(node) for node in [kernel.node, *kernel.reads])))
    return CudaProgram(sources, launches)
