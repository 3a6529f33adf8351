"""The IR: a static DAG of primitive ops, each operand read through a view.

A node's output is one contiguous float32 tensor of `node.shape`. Every operand is a `View` of its
source's output (shape, strides, offset, padding mask), so permute, reshape, expand, slice and pad
create no nodes. The op set is small on purpose (after Luminal): every high-level op is written
once in these primitives (ir/hl_ops.py), and later passes (fusion, e-graph rewrites) only have to
understand these.

One dtype for computing: float32. Ids (embedding lookups) and masks (0/1) are float32 too; ids stay
exact up to 2**24, far above any vocabulary this model sees. What the program reads and writes at
its boundary may be stored narrower: `Storage` names the inputs, outputs and weights held in
bfloat16 or float16 (a half-precision module's), which the kernels widen as they load them and
round as they store them; every intermediate is float32 (render/cstyle.py).

Shapes are concrete except the batch: a graph is traced at one (batch, sequence) shape, and
`mark_batch` makes dim 0 symbolic where it is the batch (kernels then loop over the rows given,
up to the traced batch). The sequence length stays fixed; the engine serves shorter histories by
padding, which is exact for the Lumos model (padded positions are masked out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The op set lives in ir/ops.py; its users import it with the graph.
from lumos.compile.ir.ops import (  # noqa: F401 (re-exported)
    ASSOCIATIVE,
    BINARY,
    COMMUTATIVE,
    ELEMENTWISE,
    LEAF,
    OPS,
    REDUCE,
    UNARY,
    Op,
)

LITERAL_PREFIX = "literal:"
"""Names of constant tensors that belong to the graph itself (positions, folded constants), as
opposed to weights, which are bound from the model when a plan is loaded."""


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step if size != 1 else 0)
        step *= size
    return tuple(reversed(strides))


def prod(values) -> int:
    return math.prod(values)


@dataclass(frozen=True)
class View:
    """How an operand reads its source: element i is at `offset + sum(i[d] * strides[d])` of the
    source's contiguous buffer when `mask` holds (lo <= i[d] < hi for every d), else it is 0."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    mask: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        # A size-1 dim's stride never matters; 0 makes equal views compare equal.
        if any(size == 1 and stride for size, stride in zip(self.shape, self.strides, strict=True)):
            strides = tuple(0 if size == 1 else stride for size, stride in zip(self.shape, self.strides, strict=True))
            object.__setattr__(self, "strides", strides)

    @staticmethod
    def contiguous(shape: tuple[int, ...]) -> View:
        return View(tuple(shape), contiguous_strides(tuple(shape)))

    @property
    def is_identity(self) -> bool:
        """Reads the whole source in order: no index arithmetic needed."""
        return self.mask is None and self.offset == 0 and self.strides == contiguous_strides(self.shape)

    @property
    def broadcasts(self) -> bool:
        """Some element of the source is read more than once (a stride-0 dim of size > 1)."""
        return any(stride == 0 and size > 1 for size, stride in zip(self.shape, self.strides, strict=True))

    @property
    def repeats(self) -> bool:
        """Some element may be read more than once: a broadcast, or dims whose steps overlap, as
        the sliding windows of a convolution or pooling (`Tensor.unfold`). Taken by growing
        stride, each dim must step past everything the smaller ones reach (over its unmasked
        part: padding reads nothing)."""
        if self.broadcasts:
            return True
        sizes = self.shape if self.mask is None else tuple(end - start for start, end in self.mask)
        reach = 0  # the farthest offset the dims of smaller stride reach from the first element
        for size, stride in sorted(((size, abs(stride)) for size, stride in zip(sizes, self.strides, strict=True)
                                    if size > 1 and stride != 0), key=lambda dim: dim[1]):
            if stride <= reach:
                return True
            reach += (size - 1) * stride
        return False

    def permute(self, order: tuple[int, ...]) -> View:
        assert sorted(order) == list(range(len(self.shape))), order
        mask = None if self.mask is None else tuple(self.mask[d] for d in order)
        return View(tuple(self.shape[d] for d in order), tuple(self.strides[d] for d in order), self.offset, mask)

    def expand(self, shape: tuple[int, ...]) -> View:
        assert len(shape) == len(self.shape), (self.shape, shape)
        strides, mask = list(self.strides), None if self.mask is None else list(self.mask)
        for d, (old, new) in enumerate(zip(self.shape, shape, strict=True)):
            if old != new:
                assert old == 1, f"cannot expand {self.shape} to {shape}"
                strides[d] = 0
                if mask is not None:
                    mask[d] = (0, new) if mask[d] == (0, 1) else (0, 0)
        return View(tuple(shape), tuple(strides), self.offset, None if mask is None else tuple(mask))

    def shrink(self, bounds: tuple[tuple[int, int], ...], steps: tuple[int, ...] | None = None) -> View:
        """Slice every dim to [start, end) with an optional step (a basic-indexing slice)."""
        steps = steps or (1,) * len(bounds)
        offset = self.offset + sum(start * stride for (start, _), stride in zip(bounds, self.strides, strict=True))
        shape = tuple(-(-(end - start) // step) for (start, end), step in zip(bounds, steps, strict=True))
        strides = tuple(stride * step for stride, step in zip(self.strides, steps, strict=True))
        mask = None
        if self.mask is not None:
            mask = []
            for (lo, hi), (start, _), step, size in zip(self.mask, bounds, steps, shape, strict=True):
                first = max(0, -(-(lo - start) // step))
                last = min(size, -(-(hi - start) // step))
                mask.append((first, max(first, last)))
            mask = tuple(mask)
        return View(shape, strides, offset, mask)

    def pad(self, pads: tuple[tuple[int, int], ...]) -> View:
        """Zeros before and after each dim."""
        shape = tuple(size + before + after for size, (before, after) in zip(self.shape, pads, strict=True))
        offset = self.offset - sum(before * stride for (before, _), stride in zip(pads, self.strides, strict=True))
        old_mask = self.mask or tuple((0, size) for size in self.shape)
        mask = tuple((lo + before, hi + before) for (lo, hi), (before, _) in zip(old_mask, pads, strict=True))
        return View(shape, self.strides, offset, mask)

    def reshape(self, shape: tuple[int, ...]) -> View | None:
        """The same elements in row-major order under a new shape, or None when no single view can
        express it (the caller then copies the operand into a contiguous node first)."""
        shape = tuple(shape)
        assert prod(shape) == prod(self.shape), (self.shape, shape)
        if self.mask is not None:
            # Only inserting or removing size-1 dims keeps a mask expressible.
            real = [(size, stride, bounds) for size, stride, bounds in zip(self.shape, self.strides, self.mask,
                                                                             strict=True) if size != 1]
            if [size for size in shape if size != 1] != [size for size, _, _ in real]:
                return None
            if any(bounds == (0, 0) for size, bounds in zip(self.shape, self.mask, strict=True) if size == 1):
                return None
            items = iter(real)
            strides, mask = [], []
            for size in shape:
                if size == 1:
                    strides.append(0)
                    mask.append((0, 1))
                else:
                    _, stride, bounds = next(items)
                    strides.append(stride)
                    mask.append(bounds)
            return View(shape, tuple(strides), self.offset, tuple(mask))
        strides = _reshape_strides(self.shape, self.strides, shape)
        return None if strides is None else View(shape, strides, self.offset)


def _reshape_strides(old_shape, old_strides, new_shape) -> tuple[int, ...] | None:
    """Strides for `new_shape` over the same memory, or None (numpy's attempt_nocopy_reshape)."""
    old = [(size, stride) for size, stride in zip(old_shape, old_strides, strict=True) if size != 1]
    new_strides = [0] * len(new_shape)
    new_real = [d for d, size in enumerate(new_shape) if size != 1]
    i = j = 0
    while i < len(old) and j < len(new_real):
        old_end, new_end = i + 1, j + 1
        old_size, new_size = old[i][0], new_shape[new_real[j]]
        while old_size != new_size:
            if old_size < new_size:
                old_size *= old[old_end][0]
                old_end += 1
            else:
                new_size *= new_shape[new_real[new_end]]
                new_end += 1
        # The old dims of the group must be one stretch of memory.
        for k in range(i, old_end - 1):
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        stride = old[old_end - 1][1]
        for k in range(new_end - 1, j - 1, -1):
            new_strides[new_real[k]] = stride
            stride *= new_shape[new_real[k]]
        i, j = old_end, new_end
    return tuple(new_strides)


@dataclass(eq=False)
class Node:
    """One primitive op. Identity is the node itself (nodes are hashed by id)."""

    op: Op
    srcs: tuple[Node, ...]
    views: tuple[View, ...]
    shape: tuple[int, ...]
    arg: Any = None
    origin: str = ""
    """Where it came from (the torch op and model module), for messages and plans."""
    id: int = -1
    batched: bool = False
    """Dim 0 is the batch: symbolic, at most its size here (see `mark_batch`)."""

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def is_scalar_const(self) -> bool:
        return self.op is Op.CONST and isinstance(self.arg, float)

    def __repr__(self) -> str:
        return f"%{self.id} = {self.op.name}{list(self.shape)}({', '.join(f'%{s.id}' for s in self.srcs)}){'' if self.arg is None else f' arg={self.arg!r}'}"


HALF = ("bfloat16", "float16")
"""The storage dtypes besides float32 (torch's names)."""

ROUNDING = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
"""How far (relative) a value stored in each half dtype may be from a float32 result: half a unit
in the last place for the rounding, doubled because a result within float32's error of the exact
one may round to the neighbouring half value."""


@dataclass
class Storage:
    """The dtype of each buffer at the program's boundary that is not float32, by name: inputs,
    outputs and constant tensors (weights). Values in the graph (`Graph.tensors`, the interpreter,
    every intermediate) stay float32: widening a half value is exact."""

    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        odd = {dtype for names in (self.inputs, self.outputs, self.tensors) for dtype in names.values()} - set(HALF)
        if odd:
            raise ValueError(f"storage dtypes are {HALF} (float32 is the default); got {sorted(odd)}")

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs or self.tensors)


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    """In creation order, which is topological."""
    inputs: dict[str, Node] = field(default_factory=dict)
    outputs: dict[str, Node] = field(default_factory=dict)
    output_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """The shape each output has for the caller (its node holds the same elements, maybe with size-1 dims)."""
    tensors: dict[str, Any] = field(default_factory=dict)
    """Constant tensors (numpy float32) by name: weights, and literals such as positions."""
    batch: int | None = None
    """The batch size the graph was traced at, when the batch dim is symbolic (`mark_batch`)."""
    storage: Storage = field(default_factory=Storage)
    """Inputs, outputs and weights stored in a half dtype (empty: all float32)."""
    origin: str = ""
    """Set by the frontend while it lowers one torch op: the default origin of new nodes."""
    _scalars: dict[float, Node] = field(default_factory=dict)

    def add(self, op: Op, srcs=(), views=(), shape=(), arg=None, origin: str = "") -> Node:
        node = Node(op, tuple(srcs), tuple(views), tuple(shape), arg, origin or self.origin, id=len(self.nodes))
        self.nodes.append(node)
        return node

    def scalar(self, value: float) -> Node:
        value = float(value)
        if value not in self._scalars:
            self._scalars[value] = self.add(Op.CONST, arg=value, origin="literal")
        return self._scalars[value]

    def consumers(self) -> dict[Node, list[tuple[Node, int]]]:
        uses: dict[Node, list[tuple[Node, int]]] = {node: [] for node in self.nodes}
        for node in self.nodes:
            for index, src in enumerate(node.srcs):
                uses[src].append((node, index))
        return uses

    def live_nodes(self) -> list[Node]:
        """Nodes some output depends on, in topological order."""
        keep: set[Node] = set()
        stack = list(self.outputs.values())
        while stack:
            node = stack.pop()
            if node not in keep:
                keep.add(node)
                stack.extend(node.srcs)
        return [node for node in self.nodes if node in keep]

    def prune(self) -> Graph:
        """Drop nodes no output needs (and inputs nothing reads), renumbering the rest."""
        live = self.live_nodes()
        for index, node in enumerate(live):
            node.id = index
        self.nodes = live
        alive = set(live)
        self.inputs = {name: node for name, node in self.inputs.items() if node in alive}
        names = {node.arg for node in live if node.op is Op.CONST and isinstance(node.arg, str)}
        self.tensors = {name: value for name, value in self.tensors.items() if name in names}
        self._scalars = {value: node for value, node in self._scalars.items() if node in alive}
        return self

    def stored_dtypes(self) -> dict[Node, str]:
        """The nodes whose buffers `storage` keeps in a half dtype, with that dtype (an output
        node stored half is read back widened by any later kernel, as an input is)."""
        stored = {node: self.storage.inputs[name] for name, node in self.inputs.items() if name in self.storage.inputs}
        stored |= {node: self.storage.tensors[node.arg] for node in self.nodes
                   if node.op is Op.CONST and isinstance(node.arg, str) and node.arg in self.storage.tensors}
        for name, node in self.outputs.items():
            if name in self.storage.outputs:
                if stored.get(node, self.storage.outputs[name]) != self.storage.outputs[name]:
                    raise ValueError(f"output {name!r} is stored as {self.storage.outputs[name]} and as {stored[node]}")
                stored[node] = self.storage.outputs[name]
        return stored

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op.name] = counts.get(node.op.name, 0) + 1
        return counts


def own_half_outputs(graph: Graph) -> None:
    """Give each half output that other nodes read a node of its own (a copy, x + 0, rounded as
    it is stored), so that they read the float32 value, not the rounded one in the output buffer.
    A pass after the e-graph's (which removes x + 0); the copy is batched as its source is."""
    uses = graph.consumers()
    for name in graph.storage.outputs:
        node = graph.outputs[name]
        if not uses.get(node):
            continue
        zero = graph.scalar(0.0)
        copy = graph.add(Op.ADD, (node, zero), (View.contiguous(node.shape), View(node.shape, (0,) * len(node.shape))),
                         node.shape, origin=node.origin)
        copy.batched = node.batched
        graph.outputs[name] = copy


def is_product_sum(node: Node) -> bool:
    """`node` sums a product: a SUM whose operand is a MUL (a matrix product, or over a length-1
    axis an elementwise multiply)."""
    return node.op is Op.SUM and node.srcs[0].op is Op.MUL


def is_matmul(node: Node) -> bool:
    """`node` is a matrix product: the sum of a product over an axis longer than 1, 2·M·N·K flops
    (K that axis's length, M·N the node's size)."""
    return is_product_sum(node) and node.views[0].shape[node.arg] > 1


def matmul_sum(product: Node, uses: dict[Node, list[tuple[Node, int]]]) -> Node | None:
    """The SUM that reads `product`, a MUL, whole (an identity view) as its only use, else None: the
    two are then one matrix product, whose M·N·K terms are summed as they are made, never stored.
    `uses` is `Graph.consumers()`."""
    if product.op is not Op.MUL or len(uses[product]) != 1:
        return None
    reduction, index = uses[product][0]
    if reduction.op is not Op.SUM or not reduction.views[index].is_identity:
        return None
    return reduction


def _same_view(a: View, b: View, batched: bool) -> bool:
    """Equal views, up to the size of a batch dim 0 (a full-range mask on it counts as none)."""
    def mask(view: View):
        if view.mask is None:
            return None
        return tuple(None if bounds == (0, size) else bounds for bounds, size in zip(view.mask, view.shape, strict=True))
    shapes_match = a.shape[1:] == b.shape[1:] and (a.shape[:1] == b.shape[:1] or batched)
    return shapes_match and a.strides == b.strides and a.offset == b.offset and mask(a) == mask(b)


def mark_batch(graph: Graph, other: Graph) -> bool:
    """Make the batch dim symbolic, given the same program traced at one more row (`other`).

    Dims that differ between the traces are batch dims. The batch is symbolic when every such
    dim is dim 0 of its node, no view's strides, offset or padding depend on it and nothing
    reduces over it: then a smaller batch is the same computation over a prefix of every buffer,
    and a kernel only has to loop to the runtime row count instead of the traced one.
    Returns whether it did; the graph stays static otherwise.
    """
    if len(graph.nodes) != len(other.nodes) or set(graph.outputs) != set(other.outputs):
        return False
    batched = {}
    for node, twin in zip(graph.nodes, other.nodes, strict=True):
        if node.op is not twin.op or node.arg != twin.arg or len(node.shape) != len(twin.shape):
            return False
        differs = [d for d, (a, b) in enumerate(zip(node.shape, twin.shape, strict=True)) if a != b]
        if differs not in ([], [0]) or (differs and twin.shape[0] != node.shape[0] + 1):
            return False
        if node.op is Op.INPUT and not differs:
            return False
        batched[node] = bool(differs)
        if node.op in REDUCE and node.arg == 0 and batched[node]:
            return False
        for src, view, twin_view in zip(node.srcs, node.views, twin.views, strict=True):
            view_batched = view.shape[:1] != twin_view.shape[:1]
            if (view_batched and not batched[node]) or not _same_view(view, twin_view, view_batched):
                return False
            # Row i of a batched source must be read as row i of the operand, nothing else.
            first = view.offset + sum(lo * stride for (lo, _), stride in zip((view.mask or ())[1:], view.strides[1:], strict=False))
            if batched.get(src) and not (view_batched and view.strides[0] == contiguous_strides(src.shape)[0]
                                         and 0 <= first < max(view.strides[0], 1)):
                return False
    if not all(batched[node] for node in graph.outputs.values()):
        return False
    for node, flag in batched.items():
        node.batched = flag
    graph.batch = next(node.shape[0] for node in graph.inputs.values())
    return True


class IRError(AssertionError):
    """The graph breaks an invariant: a bug in a pass, named by `check_graph`."""


def check_graph(graph: Graph) -> None:
    """The invariants every pass keeps; run between passes."""
    seen: set[Node] = set()
    for node in graph.nodes:
        where = f"{node!r} ({node.origin})"
        if any(src not in seen for src in node.srcs):
            raise IRError(f"{where}: a source comes later in the node list")
        if len(node.srcs) != len(node.views):
            raise IRError(f"{where}: {len(node.srcs)} sources but {len(node.views)} views")
        for src, view in zip(node.srcs, node.views, strict=True):
            if len(view.strides) != len(view.shape) or (view.mask is not None and len(view.mask) != len(view.shape)):
                raise IRError(f"{where}: malformed view {view}")
            if view.mask is None and src.size and _view_span(view) > src.size:
                raise IRError(f"{where}: view {view} reads past the end of %{src.id} {list(src.shape)}")
        if node.op in ELEMENTWISE:
            if len(node.srcs) != OPS[node.op].arity:
                raise IRError(f"{where}: wrong number of sources")
            if any(view.shape != node.shape for view in node.views):
                raise IRError(f"{where}: operand shapes {[v.shape for v in node.views]} differ from the output")
        elif node.op in REDUCE:
            (view,) = node.views
            reduced = tuple(1 if d == node.arg else size for d, size in enumerate(view.shape))
            if reduced != node.shape:
                raise IRError(f"{where}: reducing {view.shape} over axis {node.arg} does not give {node.shape}")
        elif node.op is Op.GATHER:
            table, ids = node.views
            if len(table.shape) != 2 or node.shape != ids.shape + table.shape[1:]:
                raise IRError(f"{where}: gather of {table.shape} by {ids.shape} cannot give {node.shape}")
        elif node.op is Op.CONST and isinstance(node.arg, str) and node.arg not in graph.tensors:
            raise IRError(f"{where}: constant tensor {node.arg!r} is missing")
        seen.add(node)
    for name, node in graph.outputs.items():
        if node not in seen:
            raise IRError(f"output {name!r} is not in the graph")
        if node.op in LEAF:  # kernels write the outputs: an input or constant as is would never be copied out
            raise IRError(f"output {name!r} is the leaf {node!r}, which no kernel writes (hl_ops.mark_output copies it)")


def _view_span(view: View) -> int:
    """One past the last element the view can touch."""
    if any(size == 0 for size in view.shape):
        return 0
    return view.offset + sum((size - 1) * stride for size, stride in zip(view.shape, view.strides, strict=True)) + 1
