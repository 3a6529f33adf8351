"""Matrix products of one value as one kernel with several outputs (CUDA target, Options.join_products).

A self-attention's query, key and value projections multiply the same normed input by three
weights. As three kernels, each stages the input again (and recomputes the layer norm fused
before it) and each is a launch of its own. Joined, the tiled matmul stages each slice of the
input once and multiplies it by every weight's slice, one sum per output, and writes each
output's epilogue (its bias) to its own buffer (kernel/gpu_tiles.py: tiled_matmuls). Widths may
differ (the Lumos model projects the query and the concatenated key/value: 64 and 128 columns).

The C target gets the same sharing by concatenating the weights into one wider matmul instead
(schedule/horizontal.py): there the register-blocked micro-kernel and the search apply to one
output only, and one matmul of width 3d fills its register blocks better than three of width d,
so that stays its way. The CUDA target has no weight concatenation (its plans bind the model's
own tensors), hence this join.

Which kernels may join is the e-graph's (egraph/programs.py: the products rule, over the facts
`product_read` gives): each is one matrix product of a weight (a constant tensor) by the same
value, read through the same view (the same node: a layer norm inlined into each computes the
same numbers), into outputs that differ in their last dim at most (an output the layout pass
lays out anew, a key transposed for the attention, counts as the product it copies: the joined
kernel stores it through its own steps), and the later one reads nothing
written from the earlier one up to itself (it moves up to the earlier one's place). This module
lowers the pairs the rule found: each later kernel joins the earliest kernel it pairs with (not
itself joined into another), while that one has fewer than MAX_OUTPUTS outputs and the joined
kernel maps to one tiled matmul (`lowers`). The joined kernel takes the first's place and name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lumos.compile.ir.graph import Node, Op, is_matmul
from lumos.compile.schedule.kernels import Kernel
from lumos.compile.schedule.layout import relayout

MAX_OUTPUTS = 4
"""Outputs per joined kernel: each adds a 16×17 shared weight tile and a sum register per thread."""

Lowers = Callable[[Kernel], bool]
"""Whether a joined kernel maps to one tiled matmul (render/cuda.py: joins_as_tiles)."""


def product_read(kernel: Kernel) -> tuple[Node, tuple] | None:
    """What a kernel of one matrix product multiplies by its weight, and how: (the value's node,
    (its operand position, its view but the weight's rows, the output's shape but its last dim));
    None for any other kernel."""
    if kernel.attention is not None or kernel.also:
        return None
    sums = [node for node in kernel.unique_fused if is_matmul(node)]
    if len(sums) != 1:
        return None
    product = sums[0].srcs[0]
    if sums[0].arg != len(product.shape) - 1:
        return None
    weights = [index for index, src in enumerate(product.srcs) if src.op is Op.CONST and not src.is_scalar_const]
    if len(weights) != 1:
        return None
    index = 1 - weights[0]
    view = product.views[index]
    if view.mask is not None:
        return None
    columns = len(product.shape) - 2  # the weight's rows: the one dim the outputs may differ in
    read = (view.shape[:columns] + view.shape[columns + 1:], view.strides[:columns] + view.strides[columns + 1:],
            view.offset)
    moved = relayout(kernel.node)  # how the output is written does not matter: a relaid one is stored
    written = moved.source if moved is not None else kernel.node  # through its own steps (lower_products)
    return product.srcs[index], (index, read, written.shape[:-1])


def join_products(kernels: list[Kernel], pairs: set[tuple[Node, Node]], lowers: Lowers) -> tuple[list[Kernel], list[str]]:
    """`kernels` with the pairs the products rule found, (earlier node, later node), joined, and
    the names of the joined kernels."""
    position_of = {kernel.node: position for position, kernel in enumerate(kernels)}
    partners: dict[int, list[int]] = {}  # a later kernel's earlier partners
    for earlier, later in pairs:
        partners.setdefault(position_of[later], []).append(position_of[earlier])
    members: dict[int, list[int]] = {}  # a kernel that others join: their positions, its own first
    absorbed: set[int] = set()
    for later in sorted(partners):
        first = min((position for position in partners[later] if position not in absorbed), default=None)
        if first is None:
            continue
        group = members.get(first, [first])
        if len(group) < MAX_OUTPUTS and lowers(_joined([kernels[m] for m in [*group, later]])):
            members[first] = [*group, later]
            absorbed.add(later)
    result = [_joined([kernels[m] for m in members[position]]) if position in members else kernel
              for position, kernel in enumerate(kernels) if position not in absorbed]
    return result, [kernels[position].name for position in sorted(members)]


def _joined(members: list[Kernel]) -> Kernel:
    first = members[0]
    outputs = {node for member in members for node in member.outputs}
    reads = [node for member in members for node in member.reads if node not in outputs]
    return replace(first, also=[member.node for member in members[1:]],
                   fused=[node for member in members for node in member.fused], reads=list(dict.fromkeys(reads)))
