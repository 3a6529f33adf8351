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

Kernels are joined when each is one matrix product of a weight (a constant tensor) by the same
value, read through the same view (the same node: a layer norm inlined into each computes the
same numbers), into outputs that differ in their last dim at most; when a later one reads nothing
written between the first and itself and no output of the others (it moves up to the first's
place); and when the joined kernel maps to one tiled matmul (`lowers`). The joined kernel takes
the first's place and name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lumos.compile.ir.graph import Node, Op, is_matmul
from lumos.compile.schedule.kernels import Kernel

MAX_OUTPUTS = 4
"""Outputs per joined kernel: each adds a 16×17 shared weight tile and a sum register per thread."""

Lowers = Callable[[Kernel], bool]
"""Whether a joined kernel maps to one tiled matmul (render/cuda.py: joins_as_tiles)."""


def product_value(kernel: Kernel) -> tuple | None:
    """What a kernel of one matrix product multiplies by its weight: (the value's node, its operand
    position, how it is read, the output's shape but its last dim); None for any other kernel."""
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
    return product.srcs[index], index, read, kernel.node.shape[:-1]


def join_products(kernels: list[Kernel], lowers: Lowers) -> tuple[list[Kernel], list[str]]:
    """`kernels` with matrix products of one value joined, and the names of the joined kernels."""
    written_at = {node: position for position, kernel in enumerate(kernels) for node in kernel.outputs}
    groups: dict[tuple, list[int]] = {}
    for position, kernel in enumerate(kernels):
        value = product_value(kernel)
        if value is not None:
            groups.setdefault((id(value[0]), *value[1:]), []).append(position)
    joined_into: dict[int, Kernel] = {}
    gone: set[int] = set()
    for positions in groups.values():
        first, members = positions[0], [positions[0]]
        for position in positions[1:]:
            if len(members) == MAX_OUTPUTS:
                break
            if _moves_up(kernels, written_at, [kernels[m] for m in members], position, first):
                candidate = _joined([kernels[m] for m in [*members, position]])
                if lowers(candidate):
                    members.append(position)
        if len(members) > 1:
            joined_into[first] = _joined([kernels[m] for m in members])
            gone.update(members[1:])
    result = [joined_into.get(position, kernel) for position, kernel in enumerate(kernels) if position not in gone]
    return result, [kernel.name for kernel in joined_into.values()]


def _moves_up(kernels: list[Kernel], written_at: dict[Node, int], members: list[Kernel], position: int,
              first: int) -> bool:
    """Kernel `position` can run at `first`'s place beside `members`: it reads nothing written
    between them, nor an output of theirs, and no member reads its output."""
    kernel = kernels[position]
    theirs = {node for member in members for node in member.outputs}
    if any(node in theirs or first <= written_at.get(node, -1) < position for node in kernel.reads):
        return False
    return not any(node in member.reads for member in members for node in kernel.outputs)


def _joined(members: list[Kernel]) -> Kernel:
    first = members[0]
    outputs = {node for member in members for node in member.outputs}
    reads = [node for member in members for node in member.reads if node not in outputs]
    return replace(first, also=[member.node for member in members[1:]],
                   fused=[node for member in members for node in member.fused], reads=list(dict.fromkeys(reads)))
