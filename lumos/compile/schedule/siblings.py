"""Sibling row statistics as one kernel with several outputs (C target, Options.multi_output).

A layer norm is two reductions over the same row: Σx (the mean), then Σ(x − mean)² (the
variance), each its own kernel: two launches with a barrier between them, and the mean written
and read back. Kernels that reduce the same input into outputs of the same shape become one
kernel here that writes each output to its own buffer (kernel/lower.py: _lower_joined): per block
of 8 rows, the first output over the block, then the next, which reads the first from the buffer
the same thread just stored it to, while the block's input rows are still in cache. The variance
stays two-pass (the mean first, then the squared deviations from it): the same arithmetic as two
kernels, so the same values bit for bit, and no E[x²] − E[x]² cancellation (on rows of
1000 + randn that one-pass variance is off by 1e3; benchmarks/layer_norm_stats.py). A softmax's
max and Σexp(x − max), and a chain of layer norms (the next one's mean of this one's output,
computed inline from the same row), join the same way.

Kernels are joined when, for the later one B and the earlier one A:
- both are plain reductions (no attention, no matrix product: a product's own layouts, row-wise
  and register blocks, are worth more than a shared loop) with the same output shape;
- they read a common buffer (the row they both pass over);
- B reads nothing written between A and B (it moves up to A's place);
- B reads A (if at all) only at the element it is computing: lowering checks this, since a read of
  another row would race with the thread that writes it.
The joined kernel takes A's place and name, and the renderer's default schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from lumos.compile.ir.graph import Node, Op
from lumos.compile.schedule.kernels import Kernel

Lowers = Callable[[Kernel], bool]
"""Whether a kernel with several outputs lowers with each earlier output read in place
(kernel/lower.py: reads_siblings_in_place)."""


def _is_product(node: Node) -> bool:
    """A sum of a product whose operands broadcast: a matrix product."""
    return (node.op is Op.SUM and node.srcs[0].op is Op.MUL
            and any(view.broadcasts for view in node.srcs[0].views))


def _row_statistic(kernel: Kernel) -> bool:
    return (kernel.attention is None and kernel.kind == "reduce"
            and not any(_is_product(node) for node in kernel.fused))


def join_siblings(kernels: list[Kernel], lowers: Lowers,
                  allowed: Callable[[Kernel, Kernel], bool] | None = None) -> tuple[list[Kernel], list[str]]:
    """`kernels` with sibling row statistics joined, and the names of the kernels that changed
    (a joined kernel's name is its first member's; their searched schedules no longer apply).
    With `allowed` (earlier, later), only the pairs it allows (the genome's, search/genome.py)."""
    written_at = {node: position for position, kernel in enumerate(kernels) for node in kernel.outputs}
    joined: list[Kernel] = []
    changed: list[str] = []
    for kernel in kernels:
        target = _sibling_for(kernel, joined, written_at, lowers, allowed) if _row_statistic(kernel) else None
        if target is None:
            joined.append(kernel)
            continue
        index, merged = target
        joined[index] = merged
        changed.append(merged.name)
    return joined, list(dict.fromkeys(changed))


def _sibling_for(kernel: Kernel, joined: list[Kernel], written_at: dict[Node, int], lowers: Lowers,
                 allowed: Callable[[Kernel, Kernel], bool] | None = None) -> tuple[int, Kernel] | None:
    """The earliest kernel of `joined` that `kernel` can join, as (its index, the joined kernel)."""
    for index, earlier in enumerate(joined):
        if not _row_statistic(earlier) or earlier.node.shape != kernel.node.shape:
            continue
        if allowed is not None and not allowed(earlier, kernel):
            continue
        own = set(earlier.outputs)
        if not (set(earlier.reads) - own) & (set(kernel.reads) - own):
            continue
        if any(node not in own and written_at.get(node, -1) > written_at[earlier.node] for node in kernel.reads):
            continue  # it reads what a kernel between the two writes
        merged = replace(earlier, also=[*earlier.also, *kernel.outputs], fused=[*earlier.fused, *kernel.fused],
                         reads=list(dict.fromkeys(node for node in [*earlier.reads, *kernel.reads] if node not in own)))
        if lowers(merged):
            return index, merged
    return None
