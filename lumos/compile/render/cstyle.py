"""Printing the kernel IR as C-style code: what the C and CUDA renderers share.

Expressions and statements print the same in C and CUDA C; a `Dialect` holds the few things
that differ (the restrict qualifier, loop pragmas). Each renderer adds its own kernel frame: the
C one OpenMP loops, the CUDA one thread indices (render/c.py, render/cuda.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lumos.compile.ir.graph import BINARY, REDUCE, UNARY, Op
from lumos.compile.kernel.ir import (
    NEVER,
    Affine,
    Binary,
    Compare,
    Cond,
    Digit,
    Expr,
    Index,
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


C = Dialect(restrict="restrict", unroll="#pragma GCC unroll {}", vector_reduce="#pragma omp simd reduction({op}:{acc})")


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


def compare(c: Compare) -> str:
    return f"{index(c.index)} {c.op} {c.bound}"


def expr(e: Expr) -> str:
    if isinstance(e, Num):
        return literal(e.value)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Load):
        return f"{e.buffer}[{index(e.offset)}]"
    if isinstance(e, Unary):
        if e.op is Op.EXP2 and nonpositive(e.x):
            return f"lumos_exp2f_nonpositive({expr(e.x)})"
        return UNARY_C[e.op].format(expr(e.x))
    if isinstance(e, Binary):
        return BINARY_C[e.op].format(expr(e.a), expr(e.b))
    if isinstance(e, Masked):
        return f"(({cond(e.cond)}) ? {expr(e.x)} : 0.0f)"
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


def stmt_lines(s: Stmt, dialect: Dialect) -> list[str]:
    if isinstance(s, Let):
        if s.guard:
            return [f"float {s.name} = {initial(s.init)};", f"if ({cond(s.guard)}) {s.name} = {expr(s.value)};"]
        return [f"const float {s.name} = {expr(s.value)};"]
    if isinstance(s, Store):
        return [f"{s.buffer}[{index(s.offset)}] = {expr(s.value)};"]
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
    raise TypeError(f"not a statement: {s!r}")


def block_lines(stmts: list[Stmt], dialect: Dialect) -> list[str]:
    return [line for s in stmts for line in stmt_lines(s, dialect)]
