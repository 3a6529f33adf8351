"""Buffer planning: intermediates share one arena, placed by liveness.

A buffer lives from the kernel that writes it to the last kernel that reads it (both included,
so a kernel never writes over what it reads). Buffers are placed largest first at the lowest
offset that overlaps no placed buffer with an overlapping lifetime (greedy by size, as in
TFLite's arena planner). Graph outputs are written straight into the caller's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from lumos.compile.ir.graph import LEAF, Graph, Node
from lumos.compile.schedule.kernels import Kernel

ALIGN = 64  # bytes: one cache line, and enough for any vector load
FLOAT_BYTES = 4


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Buffer:
    node: Node
    offset: int
    bytes: int
    first: int
    """Index of the kernel that writes it."""
    last: int
    """Index of the last kernel that reads it."""


@dataclass
class BufferPlan:
    buffers: dict[Node, Buffer]
    arena_bytes: int
    """Peak memory of the intermediates, as planned."""
    unshared_bytes: int
    """The same intermediates, one buffer each (no reuse)."""
    per_node_bytes: int
    """One buffer per primitive node (no fusion, no reuse): what a node-at-a-time executor needs."""


def plan_buffers(graph: Graph, kernels: list[Kernel], reuse: bool = True) -> BufferPlan:
    outputs = set(graph.outputs.values())
    first = {node: index for index, kernel in enumerate(kernels) for node in kernel.outputs}
    last = dict(first)
    for index, kernel in enumerate(kernels):
        for node in kernel.reads:
            if node in first:
                last[node] = max(last[node], index)
    intermediates = [node for kernel in kernels for node in kernel.outputs if node not in outputs]
    placed: list[Buffer] = []
    order = sorted(intermediates, key=lambda node: (-node.size, first[node]))
    for node in order:
        size = _aligned(node.size * FLOAT_BYTES)
        offset = 0
        if reuse:
            clashes = sorted((b for b in placed if b.first <= last[node] and first[node] <= b.last), key=lambda b: b.offset)
            for other in clashes:
                if offset + size <= other.offset:
                    break
                offset = max(offset, other.offset + other.bytes)
        else:
            offset = max((b.offset + b.bytes for b in placed), default=0)
        placed.append(Buffer(node, offset, size, first[node], last[node]))
    arena = max((b.offset + b.bytes for b in placed), default=0)
    per_node = sum(node.size * FLOAT_BYTES for node in graph.nodes if node.op not in LEAF)
    return BufferPlan({b.node: b for b in placed}, arena, sum(b.bytes for b in placed), per_node)
