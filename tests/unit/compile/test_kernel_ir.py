"""The kernel IR and the passes on it: what lowering builds and what the layouts are decided on.
(The numerics of every layout are checked against the interpreter and torch elsewhere:
test_compile_ops, test_blocked_matmul, test_search.)"""

from __future__ import annotations

from test_blocked_matmul import block_layer

from lumos.compile.ir.graph import Graph
from lumos.compile.ir.hl_ops import Tensor, cat, mark_output
from lumos.compile.kernel.ir import Compare, Let, Load, Reduce, Var
from lumos.compile.kernel.lower import lower_kernel
from lumos.compile.kernel.passes import match_matmul, row_wise
from lumos.compile.schedule.kernels import schedule
from lumos.compile.schedule.layout import transpose_weights


def lowered(graph: Graph):
    transpose_weights(graph)
    kernels, materialized = schedule(graph)
    params = {node: f"b{node.id}" for node in graph.nodes}
    return [lower_kernel(kernel, materialized, params) for kernel in kernels]


def test_a_linear_layer_after_layer_norm_is_one_matmul_with_its_prologue_and_epilogue():
    kernels = lowered(block_layer(3, 17, 19, 37)[0])
    matmuls = [(ir, match_matmul(ir, 4)) for ir in kernels]
    matched = [(ir, match) for ir, match in matmuls if match is not None]
    assert len(matched) == 2  # W1 (layer norm before, bias and GELU after) and W2 (residual after)
    for ir, match in matched:
        assert isinstance(match.weight, Load) and match.column is ir.loops[-1] and match.row is ir.loops[-2]
        assert match.reduce is ir.body[0] and match.rest[-1] is ir.body[-1]  # the epilogue ends with the store
    first = min(matched, key=lambda pair: pair[0].name)[1]
    assert first.hoisted and first.prologue  # the normalized value, computed per row and step
    assert row_wise(matched[0][0], interchange=True) is not None


def test_a_value_used_twice_is_computed_once_into_a_local():
    graph = Graph()
    x = Tensor.input(graph, "x", (3, 17))
    doubled = x * 2.0
    mark_output(graph, "y", (doubled * doubled.exp2()).sum(-1))
    (ir,) = lowered(graph.prune())
    reduce = ir.body[0]
    assert isinstance(reduce, Reduce) and reduce.straight and reduce.vector
    assert [s.name for s in reduce.body if isinstance(s, Let)] == ["v3"]  # x * 2, read by both factors


def test_a_padding_condition_of_an_outer_loop_versions_the_element_loop():
    graph = Graph()
    first = Tensor.input(graph, "first", (3, 1, 16))
    rest = Tensor.input(graph, "rest", (3, 9, 16))
    mark_output(graph, "y", cat([first, rest * 2.0], 1))
    (ir,) = lowered(graph.prune())
    # The user token's slot (i1 < 1), then the history (i1 >= 1): either condition splits the loop.
    assert ir.version_on in (Compare(Var("i1"), "<", 1), Compare(Var("i1"), ">=", 1))


def test_2_to_a_power_that_cannot_be_positive_takes_the_cheaper_exponent():
    """erf's exp(-x²) in an exact GELU: a square times a negative number is never positive; a
    plain product or difference may be, and keeps the general lumos_exp2f."""
    from lumos.compile.ir.graph import Op
    from lumos.compile.kernel.ir import Binary, Num, Ref, Unary
    from lumos.compile.render.cstyle import expr

    x, y = Ref("x"), Ref("y")
    square = Binary(Op.MUL, x, x)
    never_positive = [Binary(Op.MUL, square, Num(-1.44)), Binary(Op.MUL, Num(-2.0), Binary(Op.ADD, square, Num(1.0))),
                      Binary(Op.ADD, Binary(Op.MUL, square, Num(-1.0)), Num(-3.0)), Num(0.0)]
    maybe_positive = [Binary(Op.MUL, x, Num(-1.44)), Binary(Op.MUL, Binary(Op.MUL, x, y), Num(-1.0)),
                      Binary(Op.ADD, Binary(Op.MUL, square, Num(-1.0)), Num(0.5)), square]
    assert all(expr(Unary(Op.EXP2, e)).startswith("lumos_exp2f_nonpositive(") for e in never_positive)
    assert not any("nonpositive" in expr(Unary(Op.EXP2, e)) for e in maybe_positive)


def test_the_kernel_ir_prints_nothing_itself():
    """kernel/ never imports render/: indices, conditions and expressions print only through
    render/cstyle.py, whose tables cover every primitive."""
    import ast
    from pathlib import Path

    import lumos.compile.kernel as kernel_package
    from lumos.compile.ir.graph import BINARY, REDUCE, UNARY
    from lumos.compile.kernel.ir import NEVER, Affine, Digit, Lit
    from lumos.compile.render.cstyle import BINARY_C, UNARY_C, cond, index

    for path in Path(kernel_package.__file__).parent.glob("*.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        assert not any(name and name.startswith("lumos.compile.render") for name in imported), path.name
    assert set(UNARY_C) == UNARY and set(BINARY_C) == BINARY | REDUCE
    i, j = Var("i"), Var("j")
    assert index(Affine(0, ((1, i), (0, j), (3, Affine(0, ()))))) == "i"  # zero terms left out
    assert index(Affine(2, ((4, i), (1, j)))) == "(4 * i + j + 2)"
    assert index(Digit(Affine(0, ((8, i), (1, j))), 8, 3)) == "(((8 * i + j) / 8) % 3)"
    assert index(Lit(0)) == "0" and cond(NEVER) == "0"
    assert cond((Compare(i, ">=", 1), Compare(j, "<", 5))) == "i >= 1 && j < 5"


def test_the_register_block_is_a_pass_that_returns_tiles_of_vectors():
    """schedule.rows × schedule.tile: the column loop is gone, the row loop steps by blocks, and
    the body sums a rows × (tile / 8) register tile of 8-float vectors."""
    from lumos.compile.kernel.cpu_ir import Declare, For, MulAdd
    from lumos.compile.kernel.tiles import register_block, row_wise_layout
    from lumos.compile.schedule.kernels import KernelSchedule

    ir = next(ir for ir in lowered(block_layer(3, 17, 19, 37)[0]) if match_matmul(ir, 4) is not None)
    blocked = register_block(ir, KernelSchedule(rows=4, tile=16))
    assert [loop.var for loop in blocked.loops] == [loop.var for loop in ir.loops[:-2]] + [ir.loops[-2].var + "_b"]
    assert blocked.loops[-1].extent == -(-ir.loops[-2].extent // 4)

    def statements(stmts):
        for stmt in stmts:
            yield stmt
            if isinstance(stmt, For):
                yield from statements(stmt.body)

    vectors = [s for s in statements(blocked.body) if isinstance(s, Declare) and s.width]
    assert [(v.dims, v.width) for v in vectors] == [((4, 2), 8), ((2,), 8)]  # the sums, one step's weights
    assert any(isinstance(s, MulAdd) for s in statements(blocked.body))
    assert register_block(ir, KernelSchedule(rows=4, tile=12)) is None  # no whole vectors
    assert ir.loops[-1].var not in [loop.var for loop in row_wise_layout(ir, KernelSchedule(interchange=True)).loops]


def test_integer_expressions_print_with_parentheses_only_where_needed():
    from lumos.compile.kernel.ir import Clamp, IntOp, Lit
    from lumos.compile.render.cstyle import int_expr

    n, v = Var("n"), Var("v")
    assert int_expr(IntOp("/", IntOp("+", n, Lit(3)), Lit(4))) == "(n + 3) / 4"
    assert int_expr(IntOp("+", Var("c_0"), IntOp("*", Lit(8), v))) == "c_0 + 8 * v"
    assert int_expr(IntOp("-", n, IntOp("+", v, Lit(1)))) == "n - (v + 1)"
    assert int_expr(Clamp(IntOp("+", Var("r_0"), v), n, IntOp("-", n, Lit(1)))) == "r_0 + v < n ? r_0 + v : n - 1"
