"""Scheduling: which nodes get a buffer, and the kernels that compute them.

A node is *materialized* (written to memory by its own kernel) unless it can be computed inside
its one consumer's loop at no extra cost. Everything not materialized is inlined: elementwise
chains fuse into one loop, a reduction fuses with its elementwise producers (computed inside the
reduction loop) and with its elementwise consumer (the reduced value is used in the same loop).

A node is materialized when
- it is a graph output, or it has more than one use (no recomputation), unless it is a cheap
  elementwise node (a few ops, no reduction) read without broadcast by every consumer;
- its consumer reads it with broadcast (a stride-0 dim) or in overlapping windows (a convolution's
  or pooling's unfolded input): inlining would recompute it once per repeat, e.g. each input of a
  matmul — except an input of a matmul that runs row-wise, which
  is computed once per row and reduction step anyway (layer norm, GELU, softmax → next matmul);
- it is padded (read through a masked view, nothing else summed in) and it inlines a reduction: its loop
  would run per padded element under the padding's guard, outside the fast matmul loops (a
  convolution's matmul, batch norm and ReLU read by the next convolution's padded copy or a padded
  pooling: materialized, they are one row-wise matmul kernel with its epilogue); or the table of a
  gather (read at a data-dependent row);
- it holds a matrix product and would put it in a kernel with a second product, or inside another
  reduction (`_one_product_per_kernel`: a residual's two convolutions, a convolution read by the
  global pooling), where neither runs as a matmul.
A node used several times inside one kernel only, at the same index, is not stored either: the
kernel computes it once into a local.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lumos.compile.ir.graph import ELEMENTWISE, LEAF, REDUCE, Graph, Node, Op, matmul_sum

CHEAP_OPS = 4
"""An elementwise subtree of at most this many ops (no reduction) is recomputed rather than stored."""
REDUCTION_COST = 10**6
"""The cost of a subtree holding a reduction or gather: never cheap."""


@dataclass(frozen=True)
class KernelSchedule:
    """How the renderer lays out one kernel's loops (search.py picks one per kernel by measuring).

    The default is the renderer's own heuristic; every other value is a legal variant of the same
    computation (the search verifies each against the interpreter anyway)."""

    interchange: bool | None = None
    """Row-wise matmul (reduction loop outside the last output loop): None = the renderer's
    heuristic, True = whenever legal, False = never (one dot product per output)."""
    tile: int = 0
    """With interchange: split the last output loop into tiles of this many columns whose
    accumulators stay in registers for the whole reduction (0: one row-wide accumulator array)."""
    collapse: int = 0
    """How many outer loops OpenMP shares out (0: all but the last)."""
    unroll: int = 0
    """Unroll reduction loops by this factor (#pragma GCC unroll; 0: leave it to gcc)."""
    simd: bool = False
    """Vectorize the innermost output loop explicitly (#pragma omp simd)."""
    rows: int = 0
    """With interchange: the register-blocked matmul micro-kernel, a block of `rows` output rows ×
    `tile` columns summed in vector registers (each weight load shared by `rows` rows, each input
    load by `tile` columns); remainders of rows and columns are handled (0: off). In a fused
    attention kernel: queries per block, which share each key's value row (0: the default)."""
    lanes: int = 0
    """With `rows`: floats per vector of the register block (0: 8, one AVX2 register; 16: one
    AVX-512 register, offered where the host has AVX-512, so a block holds twice the sums). In a
    fused attention kernel: the same for its score tiles and output rows."""
    wide: bool = False
    """gcc vectorizes this kernel's loops in 16-float vectors (prefer-vector-width=512; its default
    on AVX-512 hosts is 8). Offered where the host has AVX-512 and the kernel computes a 2^x, log,
    sine, reciprocal or square root."""

    def describe(self) -> str:
        parts = [{None: "auto", True: "row-wise", False: "dot"}[self.interchange]]
        if self.rows:
            parts.append(f"block {self.rows}x{self.tile or 'auto'}" + (f" ({self.lanes} lanes)" if self.lanes else ""))
        else:
            parts += [f"tile {self.tile}"] * bool(self.tile) + [f"{self.lanes} lanes"] * bool(self.lanes)
        parts += [f"collapse {self.collapse}"] * bool(self.collapse)
        parts += [f"unroll {self.unroll}"] * bool(self.unroll) + ["simd"] * self.simd
        parts += ["512-bit loops"] * self.wide
        return ", ".join(parts)


@dataclass
class Kernel:
    name: str
    node: Node
    """The materialized node it writes."""
    fused: list[Node] = field(default_factory=list)
    """Every primitive it computes: the inlined nodes and `node`, once per path that reaches it
    from `node` (lowering counts the paths: a node used twice is computed once, into a local)."""
    reads: list[Node] = field(default_factory=list)
    """Buffers it reads: materialized nodes, inputs and constant tensors."""
    attention: Any = None
    """An egraph.attention.AttentionMatch: `node` is computed by one online-softmax pass."""
    also: list[Node] = field(default_factory=list)
    """Further nodes it writes, each to its own buffer, in the same output loops after `node`
    (sibling row statistics: schedule/siblings.py); `fused` holds their primitives too."""

    @property
    def outputs(self) -> list[Node]:
        """Every node it writes, in the order it computes them."""
        return [self.node, *self.also]

    @property
    def unique_fused(self) -> list[Node]:
        """`fused` with each node once, in order: what to count or walk over."""
        return list(dict.fromkeys(self.fused))

    @property
    def kind(self) -> str:
        ops = {node.op for node in self.fused}
        if self.attention is not None:
            return "attention"
        if Op.GATHER in ops:
            return "gather"
        return "reduce" if ops & REDUCE else "elementwise"


def is_buffer(node: Node, materialized: set[Node]) -> bool:
    return node in materialized or (node.op in LEAF and not node.is_scalar_const)


def choose_materialized(graph: Graph, recompute_cheap: bool = True) -> set[Node]:
    return materialized_and_forced(graph, recompute_cheap)[0]


def materialized_and_forced(graph: Graph, recompute_cheap: bool = True) -> tuple[set[Node], set[Node]]:
    """The heuristic's buffers, and those among them that no program may inline (outputs, reads
    with broadcast or overlapping windows that are not row-wise, gather tables, reductions read
    through padding): the legality facts of the e-graph's fusion rules (egraph/programs.py)."""
    uses = graph.consumers()
    outputs = set(graph.outputs.values())
    materialized: set[Node] = set()
    forced: set[Node] = set()
    row_wise: set[Node] = set()
    cost: dict[Node, int] = {}
    for node in graph.nodes:
        if node.op in LEAF:
            cost[node] = 0
            continue
        inlined_cost = sum(cost[src] for src in node.srcs if src not in materialized)
        cost[node] = 1 + inlined_cost if node.op in ELEMENTWISE else REDUCTION_COST
        views = [consumer.views[index] for consumer, index in uses[node]]
        if len(uses[node]) == 1 and cost[node] < REDUCTION_COST and _row_wise_operand(*uses[node][0], uses, materialized):
            row_wise.add(node)
        if (node in outputs or any(view.repeats for view in views) and node not in row_wise
                or any(consumer.op is Op.GATHER and index == 0 for consumer, index in uses[node])
                or (node.op in REDUCE and any(view.mask is not None for view in views))):
            forced.add(node)
            materialized.add(node)
        elif len(uses[node]) > 1 and not (recompute_cheap and cost[node] <= CHEAP_OPS):
            materialized.add(node)
    materialized = _share_within_kernels(graph, uses, materialized, forced, row_wise, cost)
    materialized = _stored_before_padding(graph, uses, materialized)
    return _one_product_per_kernel(graph, uses, materialized), forced


def _row_wise_operand(product: Node, index: int, uses, materialized: set[Node]) -> bool:
    """Operand `index` of `product` is an input of a matmul that the renderer will run row-wise
    (kernel_passes.row_wise): `product` is summed over its last axis, the operand is repeated
    only along the output's last dim j, and the other operand is a buffer contiguous along j and
    strided along the sum. Then computing the operand inline costs nothing extra: it is the same
    for every j, and is computed once per (row, reduction step) — layer norm, GELU or softmax
    fused into the next matmul."""
    reduction = matmul_sum(product, uses)
    axis = len(product.shape) - 1
    if reduction is None or reduction.arg != axis:
        return False
    outer = [d for d in range(axis) if product.shape[d] > 1]
    if not outer or _reaches_padding(reduction, uses):
        return False
    j = outer[-1]
    view, other, other_view = product.views[index], product.srcs[1 - index], product.views[1 - index]
    repeated = {d for d, (size, stride) in enumerate(zip(view.shape, view.strides, strict=True)) if stride == 0 and size > 1}
    return (repeated == {j} and (other in materialized or other.op in LEAF) and other_view.mask is None
            and other_view.strides[j] == 1 and other_view.strides[axis] > 1)


def _reaches_padding(node: Node, uses) -> bool:
    """`node` flows into a padded view through its chain of single uses: then its loop runs under a
    guard, which keeps the renderer from running it row-wise."""
    while len(uses[node]) == 1:
        consumer, index = uses[node][0]
        if consumer.views[index].mask is not None:
            return True
        if consumer.op not in ELEMENTWISE:
            return False
        node = consumer
    return False


def _share_within_kernels(graph: Graph, uses, materialized: set[Node], forced: set[Node],
                          row_wise: set[Node], cost: dict[Node, int]) -> set[Node]:
    """A node used several times, but only inside one kernel and at the same index everywhere
    (e.g. a matmul feeding GELU's x * Φ(x)), is computed once there into a local (the renderer
    shares it) instead of a buffer. Not when a reduction would then run inside a row-wise
    matmul's operand: its loop would run once per output of the row."""
    roots: dict[Node, frozenset[Node]] = {}
    in_row: dict[Node, bool] = {}
    for node in reversed(graph.nodes):
        if node.op in LEAF:
            continue
        consumer_roots = frozenset().union(*(roots[consumer] for consumer, _ in uses[node]))
        in_row[node] = node in row_wise or any(in_row[c] for c, _ in uses[node] if c not in materialized)
        if in_row[node] and cost[node] >= REDUCTION_COST:  # a reduction would end up inside the row loop
            roots[node] = frozenset({node}) if node in materialized else consumer_roots
            continue
        if node in materialized and node not in forced and len(consumer_roots) == 1:
            views = [consumer.views[index] for consumer, index in uses[node]]
            if all(view == views[0] for view in views):
                materialized.discard(node)
        roots[node] = frozenset({node}) if node in materialized else consumer_roots
    return materialized


def _padded(consumer: Node, index: int) -> bool:
    """`consumer` pads its operand `index`: reads it through a masked view, with nothing but
    constants besides (a scalar, or max pooling's border of -inf); a piece of a concatenation
    is summed with the other pieces, computed ones: not a pad."""
    return consumer.views[index].mask is not None and all(
        src.op is Op.CONST for other, src in enumerate(consumer.srcs) if other != index)


def _stored_before_padding(graph: Graph, uses, materialized: set[Node]) -> set[Node]:
    """A node padded (`_padded`) that inlines a reduction is stored: else the
    reduction's loop runs once per padded element under the padding's guard, outside the fast
    matmul loops (a convolution's matmul, batch norm and ReLU computed inside the next
    convolution's padded copy). Stored, they are one matmul kernel with its epilogue."""
    holds_reduction: dict[Node, bool] = {}
    for node in graph.nodes:
        if node.op in LEAF:
            holds_reduction[node] = False
            continue
        holds_reduction[node] = node.op in REDUCE or any(
            holds_reduction[src] and src not in materialized for src in node.srcs)
        if node not in materialized and holds_reduction[node] and any(_padded(*use) for use in uses[node]):
            materialized.add(node)
    return materialized


def _one_product_per_kernel(graph: Graph, uses, materialized: set[Node]) -> set[Node]:
    """A kernel computes at most one matrix product inline, and never inside another reduction:
    - where an elementwise node adds two products (a ResNet block's convolution and its strided
      1×1 shortcut), the second is stored: a kernel with two sums is no matmul the renderer can
      run row-wise or register-blocked, and falls back to one strided dot product per output;
    - a node that inlines a product and is summed or maxed (over more than one element) by a
      reduction that is not itself a matmul (a ResNet's last convolution, batch norm and ReLU inside the global average pooling)
      is stored, for the same reason: the product's dot products would run in that reduction's
      loops, strided (60% of a ResNet call). Stored, each is one matmul kernel with its epilogue."""
    def is_product(node: Node) -> bool:  # a matmul's SUM
        return node.op is Op.SUM and any(matmul_sum(src, uses) is node for src in node.srcs)

    products: dict[Node, frozenset[Node]] = {}  # the matrix products a node computes inline
    for node in graph.nodes:
        if node.op in LEAF:
            products[node] = frozenset()
            continue
        inlined = [src for src in dict.fromkeys(node.srcs) if src not in materialized and products[src]]
        if node.op in ELEMENTWISE and len(frozenset().union(*(products[src] for src in inlined))) > 1:
            materialized.update(inlined[1:])
            inlined = inlined[:1]
        products[node] = frozenset({node} if is_product(node) else ()).union(*(products[src] for src in inlined))
        if node not in materialized and products[node] and any(
                consumer.op in REDUCE and consumer.views[index].shape[consumer.arg] > 1 and not is_product(consumer)
                for consumer, index in uses[node]):
            materialized.add(node)
    return materialized


def schedule(graph: Graph, recompute_cheap: bool = True) -> tuple[list[Kernel], set[Node]]:
    """One kernel per materialized node, in topological order."""
    materialized = choose_materialized(graph, recompute_cheap)
    return build_kernels(graph, materialized), materialized


def build_kernels(graph: Graph, materialized: set[Node]) -> list[Kernel]:
    kernels = []
    for node in graph.nodes:
        if node not in materialized or node.op in LEAF:
            continue
        kernels.append(kernel_for(f"k{len(kernels)}", node, materialized))
    return kernels


def kernel_for(name: str, node: Node, materialized: set[Node]) -> Kernel:
    """The kernel that computes the materialized `node` alone: what it inlines, what it reads."""
    kernel = Kernel(name, node)
    _collect(node, materialized, kernel, top=True)
    return kernel


def _collect(node: Node, materialized: set[Node], kernel: Kernel, top: bool = False) -> None:
    if not top and is_buffer(node, materialized):
        if node not in kernel.reads:
            kernel.reads.append(node)
        return
    if node.is_scalar_const:
        return
    kernel.fused.append(node)
    for src in node.srcs:
        _collect(src, materialized, kernel)
