"""The C renderer: one function per kernel, and a driver that runs them all in one native call.

A kernel loops over its output's elements (the outer dims shared out to OpenMP threads) and
computes each element as one C expression: inlined producers become sub-expressions, reading
their own operands at indices mapped through the views; an inlined reduction becomes an
accumulator loop emitted before the expression. The driver opens one OpenMP parallel region and
calls every kernel in launch order; each kernel's `omp for` ends with the barrier that orders it
before the next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lumos.compile.ir import Graph, Node, Op, View, contiguous_strides, prod
from lumos.compile.kernel_ir import Compare, KernelIR, Loop, lower_kernel
from lumos.compile.plan import BufferPlan
from lumos.compile.render_cstyle import BINARY_C, UNARY_C, C, block_lines, literal
from lumos.compile.schedule import Kernel, KernelSchedule, is_buffer

HEADER = """\
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

/* 2^x without a library call, so that loops over it vectorize: x = n + f with n = rint(x) and
   |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (relative error < 1e-7), 2^n by building
   the exponent bits. Results below 2^-126 flush to 0 (as masked attention scores should). */
static inline float lumos_max(float a, float b) { return (b > a || b != b) ? b : a; }

static inline float lumos_exp2f(float x) {
  const float c = x < -127.0f ? -127.0f : (x > 128.0f ? 128.0f : x);  /* no libm calls: they stop vectorizing */
  const float n = rintf(c);
  const float f = c - n;
  float p = 1.525273380405984e-05f;
  p = p * f + 1.5403530393381608e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.618129107628477e-03f;
  p = p * f + 5.550410866482158e-02f;
  p = p * f + 2.402265069591007e-01f;
  p = p * f + 6.931471805599453e-01f;
  p = p * f + 1.0f;
  const int bits = ((int)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float result = n <= -127.0f ? 0.0f : (n >= 128.0f ? INFINITY : p * scale);
  return x != x ? x : result;
}

/* The register-blocked matmul's vectors: 8 floats, one AVX2 register. GCC's vector extension
   lowers them to what the target has (two SSE registers, or scalars), so the code stays portable;
   memcpy is how an unaligned vector load or store is spelled without intrinsics (it compiles to
   one vmovups). a * w + c on them becomes one FMA where the target has it. */
typedef float lumos_f8 __attribute__((vector_size(32)));
static inline lumos_f8 lumos_load8(const float* p) { lumos_f8 v; memcpy(&v, p, sizeof v); return v; }
static inline void lumos_store8(float* p, lumos_f8 v) { memcpy(p, &v, sizeof v); }
"""

def _sum(constant: int, terms: list[tuple[int, str]]) -> str:
    """`constant + coef * index + …` with the trivial parts left out."""
    parts = [index if coef == 1 else f"{coef} * {index}" for coef, index in terms if coef != 0 and index != "0"]
    if constant or not parts:
        parts.append(str(constant))
    return parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"


def view_offset(view: View, idx: list[str]) -> str:
    """The element of the source that logical index `idx` of the view reads."""
    return _sum(view.offset, [(stride, i) for stride, i in zip(view.strides, idx, strict=True)])


def view_valid(view: View, idx: list[str]) -> str | None:
    """The C condition under which `idx` falls inside the view's padding mask (None: always)."""
    if view.mask is None:
        return None
    checks = []
    for (lo, hi), size, i in zip(view.mask, view.shape, idx, strict=True):
        if lo >= hi:
            return "0"
        if lo > 0:
            checks.append(f"{i} >= {lo}")
        if hi < size:
            checks.append(f"{i} < {hi}")
    return " && ".join(checks) or None


def source_indices(view: View, idx: list[str], shape: tuple[int, ...]) -> list[str]:
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
        terms: list[list[tuple[int, str]]] = [[] for _ in shape]
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
            return [_sum(start[k], terms[k]) if shape[k] > 1 else "0" for k in range(len(shape))]
    flat = view_offset(view, idx)
    return [f"(({flat} / {stride}) % {size})" if size > 1 else "0" for size, stride in zip(shape, strides, strict=True)]


@dataclass
class TopReduce:
    """A reduction loop at the top of a kernel body, which may be moved outside the last output loop."""

    acc: str
    var: str
    length: int
    init: str
    update: str
    start: int
    end: int
    """Its statements in the kernel body: lines[start:end]."""
    loads: list[tuple[View, list[str]]]
    body: list[str]
    """Straight-line statements (locals) before the update, inside the loop."""
    factors: tuple[str, str] | None = None
    """A sum of a product: the product's two operands as C expressions."""
    summand: str = ""
    """What the update adds: the product itself, or the local it was computed into."""
    reads: dict[str, tuple[View, list[str]]] = field(default_factory=dict)
    """Each buffer read of the loop body as rendered (`b7[(…)]`), with its view and indices."""


def _coefficient(view: View, idx: list[str], var: str) -> int:
    """How far a read through `view` at `idx` moves when loop variable `var` steps by one."""
    pattern = re.compile(rf"\b{var}\b")
    return sum(abs(stride) for stride, i in zip(view.strides, idx, strict=True) if pattern.search(i))


def _strided_reads(loads: list[tuple[View, list[str]]], var: str) -> int:
    return sum(1 for view, idx in loads if _coefficient(view, idx, var) > 1)


def _local_name(line: str) -> str:
    return line.split("=")[0].split()[-1]


def _split_row_locals(lines: list[str], last: str) -> tuple[list[str], list[str]]:
    """A reduction body's locals that do not change along the output row `last` (hoisted: once
    per reduction step) and those that do (inner: once per output)."""
    hoisted, inner, varying = [], [], {last}
    for line in lines:
        name = _local_name(line)
        if any(_mentions(line.split("=", 1)[1], var) for var in varying):
            inner.append(line)
            varying.add(name)
        else:
            hoisted.append(line)
    return hoisted, inner


def _and(*conditions: str | None) -> str | None:
    """C conjunction of conditions, each once."""
    parts: list[str] = []
    for condition in conditions:
        for part in (condition or "").split(" && "):
            if part and part not in parts:
                parts.append(part)
    return " && ".join(parts) or None


ATTENTION_BLOCK = 32
"""Keys per block of a fused attention kernel (its schedule's `tile` overrides it)."""
ATTENTION_QUERIES = 4
"""Queries per block of a fused attention kernel (its schedule's `rows` overrides it)."""
VECTOR = 8
"""Floats per lumos_f8 vector of the register-blocked matmul (HEADER)."""
BLOCK_UNROLL = 4
"""The blocked matmul's reduction loop is unrolled this far: more independent loads in flight."""
UNROLLED_REDUCTION = 4
"""Reductions this short are written out as one expression rather than a loop."""


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


class KernelRenderer:
    def __init__(self, kernel: Kernel, materialized: set[Node], params: dict[Node, str], uses: dict[Node, int],
                 schedule: KernelSchedule | None = None):
        self.kernel, self.materialized, self.params, self.uses = kernel, materialized, params, uses
        self.schedule = schedule or KernelSchedule()
        self.inner_simd = True
        self.lines: list[str] = []
        self.counter = 0
        self.block = 0
        """Which block statements go to now (the kernel body, or a reduction loop's body)."""
        self.shared: dict[tuple, str] = {}
        """Values already computed in this block: (node, indices, guard, block) → local variable."""
        self.top_reduces: list[TopReduce] = []
        self.loads: list[tuple[View, list[str]]] | None = None
        """Buffer reads of the reduction being rendered: which loop order suits them."""
        self.reads: dict[str, tuple[View, list[str]]] = {}
        """The same reads by their C text (which of them a vector load can replace)."""
        self.products: dict[str, tuple[str, str]] = {}
        """Every product rendered, by its C text (or the local it went into): its two operands."""

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def operand(self, node: Node, index: int, idx: list[str], guard: str | None = None) -> str:
        """Operand `index` of `node` at `idx`; `guard` is the condition under which it is needed at
        all (inside padding), which loops of inlined reductions must respect."""
        src, view = node.srcs[index], node.views[index]
        valid = view_valid(view, idx)
        if src.is_scalar_const:
            value = literal(src.arg)
        elif is_buffer(src, self.materialized):
            value = f"{self.params[src]}[{view_offset(view, idx)}]"
            if self.loads is not None:
                self.loads.append((view, list(idx)))
                self.reads[value] = (view, list(idx))
        else:
            inner = _and(guard, valid)
            value = self.compute(src, source_indices(view, idx, src.shape), guard=inner)
            if view.broadcasts and inner is None and not value.isidentifier():
                local = self.fresh("v")  # the same for every repeat: a local that loops can hoist
                self.lines.append(f"const float {local} = {value};")
                value = local
        if valid is None:
            return value
        return "0.0f" if valid == "0" else f"(({valid}) ? {value} : 0.0f)"

    def compute(self, node: Node, idx: list[str], guard: str | None = None) -> str:
        """`node` at `idx` as a C expression; a value used more than once is computed once per
        block into a local variable."""
        if self.uses.get(node, 0) <= 1 and node.op not in (Op.SUM, Op.MAX):
            return self.expression(node, idx, guard)
        key = (node.id, tuple(idx), guard, self.block)
        if key not in self.shared:
            value = self.expression(node, idx, guard)
            if node.op in (Op.SUM, Op.MAX):
                self.shared[key] = value  # already a local: the accumulator
            else:
                local = self.fresh("v")
                if guard:
                    self.lines += [f"float {local} = 0.0f;", f"if ({guard}) {local} = {value};"]
                else:
                    self.lines.append(f"const float {local} = {value};")
                if value in self.products:
                    self.products[local] = self.products[value]
                self.shared[key] = local
        return self.shared[key]

    def expression(self, node: Node, idx: list[str], guard: str | None = None) -> str:
        if node.op in (Op.SUM, Op.MAX):
            return self.reduce(node, idx, guard)
        if node.op in UNARY_C:
            return UNARY_C[node.op].format(self.operand(node, 0, idx, guard))
        if node.op in BINARY_C:
            a, b = self.operand(node, 0, idx, guard), self.operand(node, 1, idx, guard)
            if node.op is Op.ADD and b == "0.0f":  # a contiguous copy (x + 0)
                return a
            text = BINARY_C[node.op].format(a, b)
            if node.op is Op.MUL:
                self.products[text] = (a, b)
            return text
        if node.op is Op.GATHER:
            row = f"(int){self.operand(node, 1, idx[:-1], guard)}"
            return self.operand_at(node, 0, [row, idx[-1]])
        if node.op in (Op.SUM, Op.MAX):
            return self.reduce(node, idx, guard)
        raise NotImplementedError(f"the C renderer has no rule for {node.op.name}")

    def operand_at(self, node: Node, index: int, idx: list[str]) -> str:
        return f"{self.params[node.srcs[index]]}[{view_offset(node.views[index], idx)}]"

    def reduce(self, node: Node, idx: list[str], guard: str | None) -> str:
        axis, length = node.arg, node.views[0].shape[node.arg]
        if length <= UNROLLED_REDUCTION:
            return self.unrolled_reduce(node, idx, guard)
        acc, r = self.fresh("acc"), self.fresh("r")
        inner = list(idx)
        inner[axis] = r
        top = self.block == 0 and not guard
        outer_lines, self.lines = self.lines, []
        outer_block, self.block = self.block, self.counter
        self.loads, self.reads = ([] if top else None), {}
        value = self.operand(node, 0, inner)
        body, self.lines, self.block = self.lines, outer_lines, outer_block
        if node.op is Op.SUM:
            init, update, clause = "0.0f", f"{acc} += {value};", f"reduction(+:{acc})"
        else:
            # NaN wins, as in torch; written out because fmaxf is a library call that stops vectorizing
            init, update, clause = "-INFINITY", f"{acc} = lumos_max({acc}, {value});", f"reduction(max:{acc})"
        start, loads, reads, self.loads = len(self.lines), self.loads, self.reads, None
        factors = self.products.get(value) if node.op is Op.SUM else None
        self.lines.append(f"float {acc} = {init};")
        if guard:
            self.lines.append(f"if ({guard})")
        self.lines.append("{")
        if self.schedule.unroll:  # gcc takes one loop pragma: unrolled, not explicitly vectorized
            self.lines.append(f"#pragma GCC unroll {self.schedule.unroll}")
        elif self.inner_simd and all(line.startswith("const float ") for line in body):  # straight-line: vectorizes
            self.lines.append(f"#pragma omp simd {clause}")
        self.lines.append(f"for (int {r} = 0; {r} < {length}; {r}++) {{")
        self.lines.extend("  " + line for line in body)
        self.lines.append(f"  {update}")
        self.lines.append("}")
        self.lines.append("}")
        if top and all(line.startswith("const float ") for line in body):
            self.top_reduces.append(TopReduce(acc, r, length, init, update, start, len(self.lines), loads, body,
                                              factors, value, reads))
        return acc

    def unrolled_reduce(self, node: Node, idx: list[str], guard: str | None) -> str:
        """A reduction over a few elements (a linear layer over 1 or 2 numeric features) as one
        expression: as a loop nested in the element loop, it kept that loop from vectorizing."""
        axis, acc = node.arg, self.fresh("acc")
        values = []
        for k in range(node.views[0].shape[axis]):
            inner = list(idx)
            inner[axis] = str(k)
            values.append(self.operand(node, 0, inner, guard))
        combine = (lambda a, b: f"({a} + {b})") if node.op is Op.SUM else (lambda a, b: f"lumos_max({a}, {b})")
        value = values[0]
        for other in values[1:]:
            value = combine(value, other)
        if guard:
            init = "0.0f" if node.op is Op.SUM else "-INFINITY"
            self.lines += [f"float {acc} = {init};", f"if ({guard}) {acc} = {value};"]
        else:
            self.lines.append(f"const float {acc} = {value};")
        return acc

    def render(self, barrier: bool = True) -> str | None:
        """The kernel function in one of the row-wise layouts (register-blocked matmul, or the
        reduction loop outside the last output loop); None when neither applies (the kernel IR
        is then printed as it is, `render_kernel`). Without `barrier`, threads go on to the next
        kernel at once."""
        if self.kernel.attention is not None:
            return self.render_attention(barrier)
        node = self.kernel.node
        loops = [(f"i{d}", size) for d, size in enumerate(node.shape) if size > 1]
        idx = [f"i{d}" if size > 1 else "0" for d, size in enumerate(node.shape)]
        value = self.expression(node, idx)
        out = f"out[{_sum(0, [(stride, i) for stride, i in zip(contiguous_strides(node.shape), idx, strict=True)])}]"
        body = [*self.lines, f"{out} = {value};"]
        blocked = self.register_block(loops, body)
        if blocked is not None:
            loops, body = blocked
        else:
            interchanged = self.interchange(loops, body)
            if interchanged is None:
                return None
            loops, body = loops[:-1], interchanged
        lines = [f"/* {self.kernel.name}: %{node.id} {node.op.name}{list(node.shape)}, "
                 f"{len(set(map(id, self.kernel.fused)))} ops; {node.origin.replace('*/', '* /')} */",
                 f"static void {self.kernel.name}({', '.join(self._params())}) {{"]
        frame = [Loop(var, size, batch=node.batched and var == "i0") for var, size in loops]
        outer = frame[:-1] if len(frame) > 1 else frame
        outer = outer[:self.schedule.collapse] if self.schedule.collapse else outer
        return "\n".join(lines + _omp_loops(frame, len(outer), body, barrier))

    def _params(self) -> list[str]:
        return ["const int n", "float* restrict out"] + [f"const float* restrict {self.params[src]}"
                                                         for src in self.kernel.reads]

    def render_attention(self, barrier: bool = True) -> str:
        """sum_j softmax(x)_j · v_j in one pass over j (online softmax, egraph/attention.py): a
        running max, sum and output row per query; the scores x are computed inline (their dot
        product too) and never stored. Keys go in blocks (schedule.tile) between rescalings, and
        queries in blocks (schedule.rows) that share every load of a key's vectors."""
        match = self.kernel.attention
        out, product = match.out, match.product
        probs_view = product.views[match.probs_index]
        idx = []
        for d, size in enumerate(product.shape):
            if d == out.arg:
                idx.append("j")
            elif size == 1:
                idx.append("0")
            elif probs_view.strides[d] == 0:
                idx.append("dd")
            else:
                idx.append(f"i{d}")
        value_dims = [d for d, i in enumerate(idx) if i == "dd"]
        rows = [(f"i{d}", size) for d, (i, size) in enumerate(zip(idx, product.shape, strict=True)) if i == f"i{d}"]
        width = product.shape[value_dims[0]]
        scale = literal(match.scale)
        self.block, self.lines, self.top_reduces = 0, [], []  # block 0: the score's dot product is a TopReduce
        self.inner_simd = False  # the score loop is vectorized across keys instead
        score = self.compute(match.scores, source_indices(probs_view, idx, product.srcs[match.probs_index].shape))
        score_lines, self.lines = self.lines, []
        dot = self.top_reduces[0] if len(self.top_reduces) == 1 else None
        self.block = -2
        value = self.operand(product, 1 - match.probs_index, idx)
        value_lines, self.lines = self.lines, []
        out_index = _sum(0, [(stride, "0" if d == out.arg else i)
                             for d, (stride, i) in enumerate(zip(contiguous_strides(out.shape), idx, strict=True))])
        keys = product.shape[out.arg]
        block = min(self.schedule.tile or ATTENTION_BLOCK, keys)
        query, queries = rows[-1]
        # A block of queries shares each key's value row: as many independent accumulations as
        # queries, where one query's sum over keys is one chain of dependent FMAs. Not when the
        # values depend on the query (never for attention; the rule would still be legal).
        shared = not any(_mentions(line, query) for line in [value, *value_lines])
        batch = out.batched and query == "i0"  # as many as given: no static size to block
        per_block = min(self.schedule.rows or ATTENTION_QUERIES, queries) if shared and not batch else 1
        # Inside a block, the query index is defined per query; a last, partial block repeats its
        # last query rather than read past the end.
        this_query = ([f"const int {query} = {query}_0 + q < {queries} ? {query}_0 + q : {queries - 1};"]
                      if per_block > 1 else [])
        stored = f"q < {per_block} && {query}_0 + q < {queries}" if per_block > 1 else "q < 1"
        # The values as vectors when they are one contiguous read along the value width: then each
        # query's output row is width / 8 vector registers, and a key's value row is loaded once
        # for the whole block of queries (as in the register-blocked matmul).
        value_src, value_view = product.srcs[1 - match.probs_index], product.views[1 - match.probs_index]
        vectors = (not value_lines and width % VECTOR == 0 and is_buffer(value_src, self.materialized)
                   and value_view.mask is None and _coefficient(value_view, idx, "dd") == 1)
        lanes = width // VECTOR
        if vectors:
            declare = f"lumos_f8 o[{per_block}][{lanes}];"
            clear = f"  for (int v = 0; v < {lanes}; v++) o[q][v] = (lumos_f8){{0}};"
            rescale = f"    for (int v = 0; v < {lanes}; v++) o[q][v] *= corr[q];"
            accumulate = [
                "  for (int jj = 0; jj < jn; jj++) {",
                "    const int j = j0 + jj;",
                f"    lumos_f8 vv[{lanes}];  /* the key's value row: loaded once for every query of the block */",
                f"    #pragma GCC unroll {lanes}",
                f"    for (int v = 0; v < {lanes}; v++) {{",
                f"      const int dd = {VECTOR} * v;",
                f"      vv[v] = lumos_load8(&{value});",
                "    }",
                f"    #pragma GCC unroll {per_block}",
                f"    for (int q = 0; q < {per_block}; q++) {{",
                "      const float p = s[q][jj];",
                f"      #pragma GCC unroll {lanes}",
                f"      for (int v = 0; v < {lanes}; v++) o[q][v] += p * vv[v];",
                "    }",
                "  }",
            ]
            store = [f"  float row[{width}];",
                     f"  for (int v = 0; v < {lanes}; v++) lumos_store8(&row[{VECTOR} * v], o[q][v]);",
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
        per_query_scores = [
            "    #pragma omp simd",
            "    for (int jj = 0; jj < jn; jj++) {  /* a block of scores, vectorized across keys, kept in L1 */",
            "      const int j = j0 + jj;",
            *("      " + line for line in score_lines),
            f"      s[q][jj] = {score};",
            "    }",
        ]
        blocked = self._blocked_scores(dot, score_lines, score, query, block, per_block, this_query)
        if blocked is None:
            scores = [f"  for (int q = 0; q < {per_block}; q++) {{", *("  " + line for line in this_query),
                      *per_query_scores, "  }"]
        else:
            scores = [f"  if (jn == {block}) {{", *("  " + line for line in blocked), "  } else {",
                      f"    for (int q = 0; q < {per_block}; q++) {{", *("    " + line for line in this_query),
                      *("  " + line for line in per_query_scores), "    }", "  }"]
        # Every access to o is in a fully unrolled loop, so that gcc keeps it in registers.
        body = [
            f"float m[{per_block}], l[{per_block}], corr[{per_block}], s[{per_block}][{block}];",
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
            "    float bm = -INFINITY;",
            "    #pragma omp simd reduction(max:bm)",
            "    for (int jj = 0; jj < jn; jj++) bm = lumos_max(bm, s[q][jj]);",
            "    const float mn = lumos_max(m[q], bm);",
            f"    corr[q] = lumos_exp2f((m[q] - mn) * {scale});  /* the max-rescaling identity */",
            "    float lq = l[q] * corr[q];",
            "    #pragma omp simd reduction(+:lq)",
            "    for (int jj = 0; jj < jn; jj++) {",
            f"      s[q][jj] = lumos_exp2f((s[q][jj] - mn) * {scale});",
            "      lq += s[q][jj];",
            "    }",
            "    l[q] = lq;",
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
        params = ["const int n", "float* restrict out"] + [f"const float* restrict {self.params[src]}"
                                                           for src in self.kernel.reads]
        lines = [f"/* {self.kernel.name}: %{out.id} attention{list(out.shape)}, online softmax over {product.shape[out.arg]} keys "
                 f"(scores never stored), {per_block} queries at a time; {out.origin.replace('*/', '* /')} */",
                 f"static void {self.kernel.name}({', '.join(params)}) {{"]
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

    def _blocked_scores(self, dot: TopReduce | None, score_lines: list[str], score: str, query: str, block: int,
                        per_block: int, this_query: list[str]) -> list[str] | None:
        """A whole block of keys' scores for the block of queries as one register-blocked product
        (per_block × block / 8 vector sums; each key vector loaded once for every query), then the
        score's epilogue (scale, mask) per score. Needs the score to be a dot product q·k whose key
        operand is read contiguously along the keys; else None (one query's scores at a time)."""
        if (dot is None or dot.start != 0 or dot.init != "0.0f" or dot.factors is None or block % VECTOR
                or per_block < 2 or any(_local_name(line) != dot.summand for line in dot.body)):
            return None
        keyed = [factor for factor in dot.factors if _mentions(factor, "j")]
        if len(keyed) != 1 or _mentions(keyed[0], query):
            return None
        key = keyed[0]
        query_value = dot.factors[1 - dot.factors.index(key)]
        read = dot.reads.get(key)
        if read is None or _coefficient(*read, "j") != 1:
            return None
        lanes, r = block // VECTOR, dot.var
        epilogue = score_lines[dot.end:]
        return [
            f"lumos_f8 sa[{per_block}][{lanes}];",
            f"#pragma GCC unroll {per_block}",
            f"for (int q = 0; q < {per_block}; q++)",
            f"  for (int v = 0; v < {lanes}; v++) sa[q][v] = (lumos_f8){{0}};",
            f"for (int {r} = 0; {r} < {dot.length}; {r}++) {{",
            f"  lumos_f8 kv[{lanes}];  /* loaded once, used by every query of the block */",
            f"  #pragma GCC unroll {lanes}",
            f"  for (int v = 0; v < {lanes}; v++) {{",
            f"    const int j = j0 + {VECTOR} * v;",
            f"    kv[v] = lumos_load8(&{key});",
            "  }",
            f"  #pragma GCC unroll {per_block}",
            f"  for (int q = 0; q < {per_block}; q++) {{",
            *("    " + line for line in this_query),
            f"    const float x = {query_value};",
            f"    #pragma GCC unroll {lanes}",
            f"    for (int v = 0; v < {lanes}; v++) sa[q][v] += x * kv[v];",
            "  }",
            "}",
            f"#pragma GCC unroll {per_block}",
            f"for (int q = 0; q < {per_block}; q++)",
            f"  for (int v = 0; v < {lanes}; v++) lumos_store8(&s[q][{VECTOR} * v], sa[q][v]);",
            f"for (int q = 0; q < {per_block}; q++) {{",
            *("  " + line for line in this_query),
            "  #pragma omp simd",
            f"  for (int jj = 0; jj < {block}; jj++) {{",
            "    const int j = j0 + jj;",
            f"    const float {dot.acc} = s[q][jj];",
            *("    " + line for line in epilogue),
            f"    s[q][jj] = {score};",
            "  }",
            "}",
        ]

    def interchange(self, loops: list[tuple[str, int]], body: list[str]) -> list[str] | None:
        """Move the kernel's one reduction loop outside its last output loop when that makes the
        reduction's reads contiguous (e.g. x @ Wᵀ with W stored transposed, or P @ V):
        accumulate a row of outputs at once, one vectorized pass per reduction step."""
        if len(loops) < 2 or len(self.top_reduces) != 1 or self.top_reduces[0].start != 0:
            return None
        reduce = self.top_reduces[0]
        last, size = loops[-1]
        if size > 1024 or self.schedule.interchange is False:
            return None
        if self.schedule.interchange is None and _strided_reads(reduce.loads, last) >= _strided_reads(reduce.loads, reduce.var):
            return None
        rest = body[reduce.end:]  # after the reduction's statements
        hoisted, inner = _split_row_locals(reduce.body, last)
        row = f"{reduce.acc}_row"
        update = reduce.update.replace(f"{reduce.acc} ", f"{row}[{last}] ", 1).replace(f"lumos_max({reduce.acc},", f"lumos_max({row}[{last}],")
        prelude, per_step = self._vectorize_hoisted(hoisted, inner + [update], reduce)
        tile = self.schedule.tile
        if tile and size % tile == 0 and size > tile:
            # Register accumulators: a tile of columns is summed over the whole reduction at once.
            acc = f"{reduce.acc}_tile"
            tile_update = update.replace(f"{row}[{last}]", f"{acc}[jj]")
            return [
                f"float {row}[{size}];",
                *prelude,
                f"for (int {last}_0 = 0; {last}_0 < {size}; {last}_0 += {tile}) {{",
                f"  float {acc}[{tile}];",
                f"  for (int jj = 0; jj < {tile}; jj++) {acc}[jj] = {reduce.init};",
                f"  for (int {reduce.var} = 0; {reduce.var} < {reduce.length}; {reduce.var}++) {{",
                *("    " + line for line in per_step),
                "    #pragma omp simd",
                f"    for (int jj = 0; jj < {tile}; jj++) {{",
                f"      const int {last} = {last}_0 + jj;",
                *("      " + line for line in inner),
                f"      {tile_update}",
                "    }",
                "  }",
                f"  for (int jj = 0; jj < {tile}; jj++) {row}[{last}_0 + jj] = {acc}[jj];",
                "}",
                f"for (int {last} = 0; {last} < {size}; {last}++) {{",
                f"  const float {reduce.acc} = {row}[{last}];",
                *("  " + line for line in rest),
                "}",
            ]
        return [
            f"float {row}[{size}];",
            f"for (int {last} = 0; {last} < {size}; {last}++) {row}[{last}] = {reduce.init};",
            *prelude,
            f"for (int {reduce.var} = 0; {reduce.var} < {reduce.length}; {reduce.var}++) {{",
            *("  " + line for line in per_step),
            "  #pragma omp simd",
            f"  for (int {last} = 0; {last} < {size}; {last}++) {{",
            *("    " + line for line in inner),
            f"    {update}",
            "  }",
            "}",
            f"for (int {last} = 0; {last} < {size}; {last}++) {{",
            f"  const float {reduce.acc} = {row}[{last}];",
            *("  " + line for line in rest),
            "}",
        ]


    def register_block(self, loops: list[tuple[str, int]], body: list[str]) -> tuple[list, list[str]] | None:
        """The register-blocked matmul micro-kernel (schedule.rows × schedule.tile): the kernel's
        one reduction is a sum of `value · weight` where `weight` is a buffer read contiguous
        along the output row and the same for every row of some outer loop `row` (x @ Wᵀ with W
        stored (in, out), or P @ V). Then a block of `rows` rows × `tile` columns is summed at once
        in vector registers: per reduction step, `tile / 8` weight vectors are loaded once and
        shared by the block's rows, and each row's value is loaded once and shared by its
        columns, so the loop does rows·tile/8 FMAs per rows + tile/8 loads (the row-wise loop: one
        FMA, one load and one store of its row accumulator each).

        Rows past the last are clamped to the last (computed, not stored), columns past the last
        whole tile take one dot product each. The prologue (the value's locals: layer norm, GELU)
        is computed once per row and step into arrays before the tiles; the epilogue (bias, GELU,
        residual: the statements after the sum) runs per output on the summed tile. Returns the
        loops (the row loop stepping by blocks, the column loop gone) and body, or None when the
        kernel has no such shape (the schedule then renders as plain row-wise)."""
        rows, tile = self.schedule.rows, self.schedule.tile
        if not rows or not tile or tile % VECTOR or len(loops) < 2 or len(self.top_reduces) != 1:
            return None
        reduce = self.top_reduces[0]
        last, size = loops[-1]
        if reduce.start != 0 or reduce.init != "0.0f" or reduce.factors is None or not tile <= size <= 1024:
            return None
        # The product's own local (when it was shared) is replaced by the blocked update.
        lines = [line for line in reduce.body if _local_name(line) != reduce.summand]
        hoisted, inner = _split_row_locals(lines, last)
        along = [factor for factor in reduce.factors if _mentions(factor, last)]
        if inner or len(along) != 1 or any(_mentions(line, reduce.summand) for line in lines):
            return None
        weight = along[0]
        value = reduce.factors[1 - reduce.factors.index(weight)]
        read = reduce.reads.get(weight)
        locals_ = [_local_name(line) for line in hoisted]
        if read is None or _coefficient(*read, last) != 1 or any(_mentions(weight, name) for name in locals_):
            return None  # not one contiguous vector load per step, or not the same for every row
        shared = [(var, extent) for var, extent in loops[:-1] if not _mentions(weight, var)]
        if not shared:
            return None
        row, extent = next(((var, e) for var, e in reversed(shared) if e >= rows), shared[-1])
        bound = "n" if self.kernel.node.batched and row == "i0" else str(extent)
        blocks = f"({bound} + {rows - 1}) / {rows}" if bound == "n" else -(-extent // rows)
        loops = [(f"{row}_b", blocks) if var == row else (var, e) for var, e in loops[:-1]]

        acc, r, steps = reduce.acc, reduce.var, reduce.length
        m, v, lanes = f"{acc}_m", f"{acc}_v", tile // VECTOR
        full = size - size % tile
        rest = body[reduce.end:]  # the epilogue, once per output
        prologue, per_step = self._block_prologue(hoisted, value, reduce, row, m, rows)
        lines = [
            f"const int {row}_0 = {row}_b * {rows};",
            f"int {row}_rows[{rows}];  /* rows past the last: the last again (computed, not stored) */",
            f"for (int {m} = 0; {m} < {rows}; {m}++) {row}_rows[{m}] = {row}_0 + {m} < {bound} ? {row}_0 + {m} : {bound} - 1;",
            *prologue,
            f"for (int {last}_0 = 0; {last}_0 < {full}; {last}_0 += {tile}) {{",
            f"  lumos_f8 {acc}_blk[{rows}][{lanes}];  /* the block's sums: {rows * lanes} vector registers */",
            f"  #pragma GCC unroll {rows}",
            f"  for (int {m} = 0; {m} < {rows}; {m}++)",
            f"    for (int {v} = 0; {v} < {lanes}; {v}++) {acc}_blk[{m}][{v}] = (lumos_f8){{0}};",
            f"  #pragma GCC unroll {BLOCK_UNROLL}",
            f"  for (int {r} = 0; {r} < {steps}; {r}++) {{",
            f"    lumos_f8 {acc}_w[{lanes}];  /* loaded once, used by every row of the block */",
            f"    #pragma GCC unroll {lanes}",
            f"    for (int {v} = 0; {v} < {lanes}; {v}++) {{",
            f"      const int {last} = {last}_0 + {VECTOR} * {v};",
            f"      {acc}_w[{v}] = lumos_load8(&{weight});",
            "    }",
            f"    #pragma GCC unroll {rows}",
            f"    for (int {m} = 0; {m} < {rows}; {m}++) {{",
            f"      const int {row} = {row}_rows[{m}];",
            *("      " + line for line in per_step),
            f"      const float {acc}_x = {value};  /* used by every column of the block */",
            f"      #pragma GCC unroll {lanes}",
            f"      for (int {v} = 0; {v} < {lanes}; {v}++) {acc}_blk[{m}][{v}] += {acc}_x * {acc}_w[{v}];",
            "    }",
            "  }",
            f"  float {acc}_tile[{rows}][{tile}];",
            f"  for (int {m} = 0; {m} < {rows}; {m}++)",
            f"    for (int {v} = 0; {v} < {lanes}; {v}++) lumos_store8(&{acc}_tile[{m}][{VECTOR} * {v}], {acc}_blk[{m}][{v}]);",
            f"  for (int {m} = 0; {m} < {rows} && {row}_0 + {m} < {bound}; {m}++) {{",
            f"    const int {row} = {row}_0 + {m};",
            f"    for (int {last} = {last}_0; {last} < {last}_0 + {tile}; {last}++) {{",
            f"      const float {acc} = {acc}_tile[{m}][{last} - {last}_0];",
            *("      " + line for line in rest),
            "    }",
            "  }",
            "}",
        ]
        if full < size:  # the columns past the last whole tile: one dot product each
            lines += [
                f"for (int {m} = 0; {m} < {rows} && {row}_0 + {m} < {bound}; {m}++) {{",
                f"  const int {row} = {row}_0 + {m};",
                f"  for (int {last} = {full}; {last} < {size}; {last}++) {{",
                f"    float {acc} = 0.0f;",
                f"    for (int {r} = 0; {r} < {steps}; {r}++) {{",
                *("      " + line for line in per_step),
                f"      {acc} += {value} * {weight};",
                "    }",
                *("    " + line for line in rest),
                "  }",
                "}",
            ]
        return loops, lines

    @staticmethod
    def _block_prologue(hoisted: list[str], value: str, reduce: TopReduce, row: str, m: str,
                        rows: int) -> tuple[list[str], list[str]]:
        """The value's per-step locals (layer norm, GELU of the previous layer) for every row of
        the block, computed once before the column tiles in one vectorized loop per row, into
        arrays that the tiles read; per_step reads row `m`'s. Very long reductions compute them
        in place instead (per_step is then the locals themselves)."""
        needed = [_local_name(line) for line in hoisted if _mentions(value, _local_name(line))]
        if not hoisted or reduce.length > 4096:
            return [], hoisted
        r = reduce.var
        prologue = [f"float {name}_steps[{rows}][{reduce.length}];" for name in needed]
        prologue += [f"for (int {m} = 0; {m} < {rows}; {m}++) {{", f"  const int {row} = {row}_rows[{m}];",
                     "  #pragma omp simd", f"  for (int {r} = 0; {r} < {reduce.length}; {r}++) {{",
                     *("    " + line for line in hoisted),
                     *(f"    {name}_steps[{m}][{r}] = {name};" for name in needed), "  }", "}"]
        return prologue, [f"const float {name} = {name}_steps[{m}][{r}];" for name in needed]

    @staticmethod
    def _vectorize_hoisted(hoisted: list[str], users: list[str], reduce: TopReduce) -> tuple[list[str], list[str]]:
        """The per-step locals (e.g. GELU of the previous layer) computed for all steps first, in
        one vectorized loop into arrays, instead of one scalar evaluation per step."""
        if not hoisted or reduce.length > 4096:
            return [], hoisted
        names = [line.split("=")[0].split()[-1] for line in hoisted]
        needed = [name for name in names if any(re.search(rf"\b{name}\b", line) for line in users)]
        r = reduce.var
        prelude = [f"float {name}_steps[{reduce.length}];" for name in needed]
        prelude += ["#pragma omp simd", f"for (int {r} = 0; {r} < {reduce.length}; {r}++) {{",
                    *("  " + line for line in hoisted), *(f"  {name}_steps[{r}] = {name};" for name in needed), "}"]
        return prelude, [f"const float {name} = {name}_steps[{r}];" for name in needed]


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
    for index, kernel in enumerate(kernels):
        reads, write = [region(node) for node in kernel.reads], region(kernel.node)
        conflict = any(
            any(overlap(r, earlier_write) for r in reads)  # reads what an earlier one writes
            or any(overlap(write, r) for r in earlier_reads + [earlier_write])  # overwrites its inputs or output
            for earlier_reads, earlier_write in in_flight
        )
        if conflict and index > 0:
            keep[index - 1] = True
            in_flight = []
        elif index > 0:
            keep[index - 1] = False
        in_flight.append((reads, write))
    return keep


def render_kernel(kernel: Kernel, materialized: set[Node], params: dict[Node, str],
                  schedule: KernelSchedule | None = None, barrier: bool = True) -> str:
    uses: dict[Node, int] = {}
    for node in kernel.fused:  # a node reached by several paths is computed once, into a local
        uses[node] = uses.get(node, 0) + 1
    rowwise = KernelRenderer(kernel, materialized, params, uses, schedule).render(barrier)
    if rowwise is not None:
        return rowwise
    return print_kernel(lower_kernel(kernel, materialized, params, schedule), barrier)


def print_kernel(ir: KernelIR, barrier: bool = True) -> str:
    """A kernel IR in its plain layout: OpenMP shares out the parallel loops, the innermost loop
    runs the body per element (vectorized or versioned on an invariant guard as annotated)."""
    params = ["const int n", "float* restrict out"] + [f"const float* restrict {name}" for name in ir.params]
    lines = [f"/* {ir.comment} */", f"static void {ir.name}({', '.join(params)}) {{"]
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
    innermost = len(loops) > 1 and not loops[-1].parallel
    bound = {loop.var: "n" if loop.batch else loop.extent for loop in loops}  # the batch: as many rows as given
    for depth, loop in enumerate(loops[:-1] if innermost else loops):
        lines.append("  " * depth + f"for (int {loop.var} = 0; {loop.var} < {bound[loop.var]}; {loop.var}++) {{")
    depth = len(loops) - 1 if innermost else len(loops)
    if innermost:
        last = loops[-1]
        inner = ["#pragma omp simd"] if last.vector else []
        inner += [f"for (int {last.var} = 0; {last.var} < {bound[last.var]}; {last.var}++) {{", *("  " + line for line in body), "}"]
        if version_on is not None:
            inner = [f"if ({version_on}) {{", *("  " + line for line in inner), "} else {", *("  " + line for line in inner), "}"]
        lines += ["  " * depth + line for line in inner]
    else:
        lines += ["  " * depth + line for line in body]
    lines += ["  " * d + "}" for d in range(depth - 1, -1, -1)]
    return lines + ["}"]


def canonical_kernel_source(kernel: Kernel, materialized: set[Node], schedule: KernelSchedule | None = None) -> str:
    """The kernel's C with buffer and kernel names replaced by positional ones: identical layers
    (same computation on different weights and buffers) give the same text."""
    params = {node: f"p{index}" for index, node in enumerate(kernel.reads)}
    renamed = Kernel("kernel", kernel.node, kernel.fused, kernel.reads, kernel.attention)
    return render_kernel(renamed, materialized, params, schedule).split("\n", 1)[1]


def render_library(graph: Graph, kernels: list[Kernel], materialized: set[Node], plan: BufferPlan,
                   schedules: dict[str, KernelSchedule] | None = None, always_barrier: bool = False) -> str:
    """The whole program as one C file: kernels, then `lumos_forward`, the one-call driver.
    `schedules` by kernel name (default: the renderer's heuristic); `always_barrier` ends every
    kernel with a barrier, so that the timed driver measures each kernel alone."""
    params = {node: f"b{node.id}" for node in graph.nodes}
    schedules = schedules or {}
    parts = [HEADER]
    keep = [True] * len(kernels) if always_barrier else barriers(graph, kernels, plan)
    for kernel, barrier in zip(kernels, keep, strict=True):
        parts.append(render_kernel(kernel, materialized, params, schedules.get(kernel.name), barrier))
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
