"""Printing the kernel IR as C-style code: what the C and CUDA renderers share.

Expressions and statements print the same in C and CUDA C; a `Dialect` holds the few things
that differ (the restrict qualifier, loop pragmas). Each renderer adds its own kernel frame: the
C one OpenMP loops, the CUDA one thread indices (render/c.py, render/cuda.py).

Half precision is storage only: a buffer at the program's boundary stored in bfloat16 or float16
(ir/graph.py: Storage) is widened to float32 where a kernel loads it and rounded where it stores
it, by the header's `lumos_from_<dtype>` / `lumos_to_<dtype>` (and their vector forms); all
arithmetic and accumulation stay float32. The kernel IR does not know dtypes: the renderer names
the kernel's half buffers (`stored_as`) while it prints, and every load and store of such a buffer
goes through the conversion. A statement that would update a half buffer in place is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from lumos.compile.ir.graph import BINARY, REDUCE, UNARY, Op
from lumos.compile.kernel.cpu_ir import (
    Accumulate,
    Arith,
    Assign,
    Declare,
    Declares,
    Exp2NonPositive,
    FirstLanes,
    For,
    Identity,
    If,
    InterleavedStore,
    IntLet,
    LaneReduce,
    MulAdd,
    PairLoad,
    Prefetch,
    Rescale,
    Scope,
    Skip,
    Splat,
    TileStmt,
    Transpose,
    VectorLoad,
    VectorStore,
)
from lumos.compile.kernel.ir import (
    NEVER,
    Affine,
    Binary,
    Clamp,
    Compare,
    Cond,
    Digit,
    Element,
    Expr,
    Index,
    IntCond,
    IntExpr,
    IntOp,
    KernelIR,
    Let,
    Lit,
    Load,
    Masked,
    Num,
    Reduce,
    Ref,
    RowOf,
    Stmt,
    Store,
    Unary,
    Var,
)

UNARY_C = {
    Op.EXP2: "lumos_exp2f({})",
    Op.LOG2: "log2f({})",
    Op.SIN: "sinf({})",
    Op.RECIP: "(1.0f / {})",
    Op.SQRT: "sqrtf({})",
}
BINARY_C = {
    Op.ADD: "({} + {})",
    Op.MUL: "({} * {})",
    Op.MOD: "fmodf({}, {})",
    Op.LESS_THAN: "({} < {} ? 1.0f : 0.0f)",
    Op.SUM: "({} + {})",  # two terms of a written-out reduction
    Op.MAX: "lumos_max({}, {})",  # NaN wins, as in torch (each header defines it)
}
# A primitive without a printer fails here, at import, not in the middle of a compile.
assert set(UNARY_C) == UNARY, f"UNARY_C must print exactly the unary ops; differs by {set(UNARY_C) ^ UNARY}"
assert set(BINARY_C) == BINARY | REDUCE, f"BINARY_C must print the binary and reduce ops; differs by {set(BINARY_C) ^ (BINARY | REDUCE)}"


_STORED: ContextVar[Mapping[str, str] | None] = ContextVar("stored", default=None)


@contextmanager
def stored_as(dtypes: Mapping[str, str]) -> Iterator[None]:
    """While printing one kernel: its buffers (by the names it gives them) stored in a half
    dtype, and that dtype ("bfloat16" or "float16"); the others are float32."""
    token = _STORED.set(dtypes)
    try:
        yield
    finally:
        _STORED.reset(token)


def stored(buffer: str | None) -> str | None:
    """The half dtype `buffer` is stored in; None: float32."""
    return (_STORED.get() or {}).get(buffer)


def buffer_name(e) -> str | None:
    return e.buffer if isinstance(e, Load) else e.array if isinstance(e, Element) else None


def address(e: Load | Element) -> str:
    """The element's place, as it is stored (no conversion): what `&` takes."""
    return f"{e.buffer}[{index(e.offset)}]" if isinstance(e, Load) else element(e)


def narrowed(buffer: str | None, value: str) -> str:
    """`value` as the buffer stores it."""
    dtype = stored(buffer) if buffer else None
    return value if dtype is None else f"lumos_to_{dtype}({value})"


def literal(value: float) -> str:
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(float(value))
    if not any(c in text for c in ".e"):
        text += ".0"
    return f"{text}f" if value >= 0 else f"({text}f)"


def initial(value: float) -> str:
    """An accumulator's first value."""
    return "-INFINITY" if value == -math.inf else literal(value)


@dataclass(frozen=True)
class Dialect:
    restrict: str
    unroll: str
    """The pragma that unrolls the next loop ({} = the factor)."""
    vector_reduce: str | None
    """The pragma that vectorizes a reduction loop ({op}, {acc}); None: none."""
    simd: str | None = None
    """The pragma that vectorizes a loop; None: none."""


C = Dialect(restrict="restrict", unroll="#pragma GCC unroll {}", vector_reduce="#pragma omp simd reduction({op}:{acc})",
            simd="#pragma omp simd")


def index(i: Index) -> str:
    if isinstance(i, Var):
        return i.name
    if isinstance(i, Lit):
        return str(i.value)
    if isinstance(i, Affine):
        parts = [index(term) if coef == 1 else f"{coef} * {index(term)}" for coef, term in i.live_terms]
        if i.constant or not parts:
            parts.append(str(i.constant))
        return parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"
    if isinstance(i, Digit):
        return f"(({index(i.flat)} / {i.stride}) % {i.size})"
    if isinstance(i, RowOf):
        return f"(int){expr(i.value)}"
    raise TypeError(f"not an index: {i!r}")


PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def int_expr(e: IntExpr, outer: int = 0) -> str:
    """An integer expression with parentheses only where precedence needs them."""
    if isinstance(e, IntOp):
        own = PRECEDENCE[e.op]
        text = f"{int_expr(e.a, own)} {e.op} {int_expr(e.b, own + 1)}"
        return f"({text})" if own < outer else text
    if isinstance(e, Element):
        return element(e)
    if isinstance(e, Clamp):
        return f"{int_expr(e.index)} < {int_expr(e.bound)} ? {int_expr(e.index)} : {int_expr(e.last)}"
    return index(e)


def element(e: Element) -> str:
    return e.array + "".join(f"[{int_expr(i)}]" for i in e.at)


def int_cond(c: IntCond | tuple[IntCond, ...]) -> str:
    conds = c if isinstance(c, tuple) else (c,)
    return " && ".join(f"{int_expr(part.a)} {part.op} {int_expr(part.b)}" for part in conds)


def compare(c: Compare) -> str:
    return f"{index(c.index)} {c.op} {c.bound}"


def expr(e: Expr) -> str:
    if isinstance(e, Num):
        return literal(e.value)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, (Load, Element)):
        dtype = stored(buffer_name(e))
        return address(e) if dtype is None else f"lumos_from_{dtype}({address(e)})"
    if isinstance(e, Unary):
        if e.op is Op.EXP2 and nonpositive(e.x):
            return f"lumos_exp2f_nonpositive({expr(e.x)})"
        return UNARY_C[e.op].format(expr(e.x))
    if isinstance(e, Binary):
        return BINARY_C[e.op].format(expr(e.a), expr(e.b))
    if isinstance(e, Masked):
        return f"(({cond(e.cond)}) ? {expr(e.x)} : 0.0f)"
    if isinstance(e, Identity):
        return initial(0.0 if e.op is Op.SUM else -math.inf)
    return vector_expr(e)


VECTOR_C = {
    "type": "lumos_f{w}",
    "load": "lumos_load{w}{dtype}(&{at})",
    "load_first": "lumos_load{w}_first{dtype}(&{at}, {n})",
    "store": "lumos_store{w}{dtype}(&{at}, {x});",
    "max": "{t} = lumos_max{w}({t}, {x});",
    "first_lanes": "lumos_first{w}({x}, {n}, {fill})",
    "sum_lanes": "lumos_sum_lanes{w}({x})",
    "max_lanes": "lumos_max_lanes{w}({x})",
    "exp2_nonpositive": "lumos_exp2_nonpositive{w}({x})",
    "transpose": "lumos_transpose{w}({array});",
    "prefetch": "__builtin_prefetch(&{at});",
}
"""The fast kernels' vectors of {w} floats as the C header spells them (lumos_cpu.h: GCC's vector
extension); only the C renderer's passes build them. {dtype} is "" for a float32 buffer, else "_"
and its storage dtype (the header's converting loads and stores)."""


def vector_dtype(at: Expr) -> str:
    dtype = stored(buffer_name(at))
    return "" if dtype is None else f"_{dtype}"


def vector_expr(e: Expr, outer: int = 0) -> str:
    """The fast kernels' expressions: vectors, and arithmetic with parentheses only where needed."""
    if isinstance(e, Arith):
        own = PRECEDENCE[e.op]
        text = f"{vector_expr(e.a, own)} {e.op} {vector_expr(e.b, own + 1)}"
        return f"({text})" if own < outer else text
    if isinstance(e, VectorLoad):
        at, dtype = address(e.at), vector_dtype(e.at)
        if e.first is not None:
            return VECTOR_C["load_first"].format(w=e.width, at=at, n=int_expr(e.first), dtype=dtype)
        return VECTOR_C["load"].format(w=e.width, at=at, dtype=dtype)
    if isinstance(e, Splat):
        lanes = "0" if e.value == 0 else ", ".join([initial(e.value)] * e.width)
        return f"({VECTOR_C['type'].format(w=e.width)}){{{lanes}}}"
    if isinstance(e, FirstLanes):
        return VECTOR_C["first_lanes"].format(w=e.width, x=expr(e.x), n=int_expr(e.n), fill=initial(e.fill))
    if isinstance(e, LaneReduce):
        return VECTOR_C["sum_lanes" if e.op is Op.SUM else "max_lanes"].format(w=e.width, x=expr(e.x))
    if isinstance(e, Exp2NonPositive):
        if e.width:
            return VECTOR_C["exp2_nonpositive"].format(w=e.width, x=expr(e.x))
        return f"lumos_exp2f_nonpositive({expr(e.x)})"
    if isinstance(e, (IntOp, Clamp, Var, Lit)):
        return int_expr(e)
    if isinstance(e, (Num, Ref, Load, Unary, Binary, Masked, Element, Identity)):
        return expr(e)
    raise TypeError(f"not an expression: {e!r}")


def nonpositive(e: Expr) -> bool:
    """Whether `e` is <= 0 (or NaN) whatever its inputs, by its form: a non-positive number, a
    square times one, a sum of them (erf's exp(-x²) in an exact GELU). Then 2^e takes the cheaper
    lumos_exp2f_nonpositive (each header defines it)."""
    if isinstance(e, Num):
        return e.value <= 0
    if isinstance(e, Binary) and e.op is Op.MUL:
        return (nonnegative(e.a) and nonpositive(e.b)) or (nonpositive(e.a) and nonnegative(e.b))
    if isinstance(e, Binary) and e.op is Op.ADD:
        return nonpositive(e.a) and nonpositive(e.b)
    return False


def nonnegative(e: Expr) -> bool:
    if isinstance(e, Num):
        return e.value >= 0
    if isinstance(e, Binary) and e.op is Op.MUL:
        return e.a == e.b or (nonnegative(e.a) and nonnegative(e.b)) or (nonpositive(e.a) and nonpositive(e.b))
    if isinstance(e, Binary) and e.op is Op.ADD:
        return nonnegative(e.a) and nonnegative(e.b)
    return False


def cond(c: Cond) -> str:
    return "0" if c == NEVER else " && ".join(map(compare, c))


def update(op: Op, acc: str, value: str) -> str:
    return f"{acc} += {value};" if op is Op.SUM else f"{acc} = lumos_max({acc}, {value});"


def target(t: Element | Ref | Load) -> str:
    """What a statement updates in place (never a half buffer: that would round each step)."""
    if stored(buffer_name(t)):
        raise NotImplementedError(f"updating the half-precision buffer {buffer_name(t)} in place")
    return t.name if isinstance(t, Ref) else expr(t)


def declared(s: Declare) -> str:
    return f"{s.name}{''.join(f'[{d}]' for d in s.dims)}" + ("" if s.value is None else f" = {expr(s.value)}")


def kind(s: Declare) -> str:
    name = "long" if s.long else "int" if s.integer else VECTOR_C["type"].format(w=s.width) if s.width else "float"
    return f"const {name}" if s.constant else name


def tile_lines(s: TileStmt, dialect: Dialect) -> list[str]:
    """The fast kernels' statements (kernel/ir.py's vectors, register tiles and online softmax)."""
    if isinstance(s, Declare):
        return [f"{kind(s)} {declared(s)};" + (f"  /* {s.note} */" if s.note else "")]
    if isinstance(s, Declares):
        return [f"{kind(s.declares[0])} {', '.join(map(declared, s.declares))};"]
    if isinstance(s, IntLet):
        bound = [(s.name, s.value), *s.also]
        note = f"  /* {s.note} */" if s.note else ""
        return [f"const {'long' if s.long else 'int'} {', '.join(f'{name} = {int_expr(value)}' for name, value in bound)};{note}"]
    if isinstance(s, Assign):
        if isinstance(s.target, Ref):
            place = s.target.name
        else:
            place = address(s.target)
        value = narrowed(buffer_name(s.target), expr(s.value))
        return [f"{place} = {value};" + (f"  /* {s.note} */" if s.note else "")]
    if isinstance(s, Accumulate):
        if s.width and s.op is Op.MAX:
            return [VECTOR_C["max"].format(w=s.width, t=target(s.target), x=expr(s.value))]
        return [update(s.op, target(s.target), expr(s.value))]
    if isinstance(s, MulAdd):
        return [f"{target(s.target)} += {expr(s.a)} * {expr(s.b)};"]
    if isinstance(s, Rescale):
        return [f"{target(s.target)} *= {expr(s.factor)};"]
    if isinstance(s, VectorStore):
        return [VECTOR_C["store"].format(w=s.width, at=element(s.at), x=expr(s.value), dtype=vector_dtype(s.at))]
    if isinstance(s, PairLoad):
        return [f"lumos_load{s.width}_pair_bfloat16(&{address(s.at)}, &{element(s.even)}, &{element(s.odd)});"]
    if isinstance(s, InterleavedStore):
        return [f"lumos_store{s.width}_interleaved(&{element(s.at)}, {expr(s.even)}, {expr(s.odd)});"]
    if isinstance(s, Prefetch):
        return [VECTOR_C["prefetch"].format(at=address(s.at) if isinstance(s.at, (Load, Element)) else expr(s.at))]
    if isinstance(s, Transpose):
        return [VECTOR_C["transpose"].format(w=s.width, array=s.array)]
    if isinstance(s, Skip):
        return [f"if (!({int_cond(s.unless)})) continue;"]
    if isinstance(s, If):
        note = f"  /* {s.note} */" if s.note else ""
        return [f"if ({int_cond(s.cond)}) {{{note}", *indent(block_lines(s.body, dialect)), "}"]
    if isinstance(s, Scope):
        body = block_lines(s.body, dialect)
        if s.inline:
            return ["{ " + " ".join(body) + " }"]
        return ["{ " + body[0], *indent(body[1:]), "}"]
    if isinstance(s, For):
        return for_lines(s, dialect)
    raise TypeError(f"not a statement: {s!r}")


def indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def for_lines(s: For, dialect: Dialect) -> list[str]:
    """A loop; one statement of one line goes on the loop's line, one loop under it, else a block."""
    pragmas = [dialect.unroll.format(s.unroll)] if s.unroll else []
    pragmas += [dialect.simd] if s.simd else []
    if s.reduction:
        op, acc = s.reduction
        pragmas.append(dialect.vector_reduce.format(op="+" if op is Op.SUM else "max", acc=acc))
    test = int_cond(s.test) if s.test else f"{s.var} < {int_expr(s.stop)}" + (f" && {int_cond(s.also)}" if s.also else "")
    step = f"{s.var}++" if s.step is None else f"{s.var} += {s.step}"
    start = "" if s.start is None else f"int {s.var} = {int_expr(s.start)}"
    head = f"for ({start}; {test}; {step})"
    body = block_lines(s.body, dialect)
    if len(s.body) == 1 and not s.braces and isinstance(s.body[0], For):
        return [*pragmas, head, *indent(body)]
    if len(s.body) == 1 and not s.braces and len(body) == 1:
        return [*pragmas, f"{head} {body[0]}"]
    note = f"  /* {s.note} */" if s.note else ""
    return [*pragmas, head + " {" + note, *indent(body), "}"]


def stmt_lines(s: Stmt, dialect: Dialect) -> list[str]:
    if isinstance(s, Let):
        if s.note:
            return [f"const float {s.name} = {expr(s.value)};  /* {s.note} */"]
        if s.guard:
            return [f"float {s.name} = {initial(s.init)};", f"if ({cond(s.guard)}) {s.name} = {expr(s.value)};"]
        return [f"const float {s.name} = {expr(s.value)};"]
    if isinstance(s, Store):
        return [f"{s.buffer}[{index(s.offset)}] = {narrowed(s.buffer, expr(s.value))};"]
    if isinstance(s, Reduce):
        lines = [f"float {s.acc} = {initial(s.init)};"]
        if s.guard:
            lines.append(f"if ({cond(s.guard)})")
        lines.append("{")
        if s.unroll:
            lines.append(dialect.unroll.format(s.unroll))
        elif s.vector and dialect.vector_reduce:
            lines.append(dialect.vector_reduce.format(op="+" if s.op is Op.SUM else "max", acc=s.acc))
        lines.append(f"for (int {s.var} = 0; {s.var} < {s.length}; {s.var}++) {{")
        lines += ["  " + line for inner in s.body for line in stmt_lines(inner, dialect)]
        lines.append("  " + update(s.op, s.acc, expr(s.value)))
        lines += ["}", "}"]
        return lines
    return tile_lines(s, dialect)


def comment_text(text: str) -> str:
    """Text that can sit inside a /* comment */."""
    return text.replace("*/", "* /")


def kernel_comment(ir: KernelIR) -> str:
    """What a kernel computes, for the comment above it."""
    node = ir.node
    also = "".join(f" and %{other.id} {other.op.name}" for other in ir.also)
    return f"{ir.name}: %{node.id} {node.op.name}{list(node.shape)}{also}, {ir.ops} ops; {comment_text(node.origin)}"


def block_lines(stmts: list[Stmt], dialect: Dialect) -> list[str]:
    return [line for s in stmts for line in stmt_lines(s, dialect)]
