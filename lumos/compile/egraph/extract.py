"""Extraction: the cheapest program in an e-graph, read back as a graph (and the buffers it stores).

egglog's own extraction returns nested terms; turning them back into nodes by printing and
comparing them took minutes on the quickstart model. Here the e-graph is serialized once (its
e-nodes, their e-classes and children), each e-class gets its cheapest e-node by a fixpoint over
costs (which never picks a cycle, e.g. x in the e-class of `view(x, identity)`), and the graph is
built from those choices, one node per e-class, so shared subterms stay shared.

Every node of the input graph is marked `original(term, id)` in the e-graph, so a node of the extracted
graph that is equivalent to an original one takes its origin (the torch op, for messages) and its
batch flag; a new node (e.g. `a + b` of a·c + b·c → (a + b)·c) is batched when one of its sources
is and it keeps the batch dim.

`store` survives extraction: an extracted `store(x)` is a buffer, returned with the graph, so a
fusion decision made in the e-graph (store or inline, see fusion.py) is what the scheduler uses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from egglog import EGraph, i64

from lumos.compile.egraph.terms import CONSTRUCTORS, Encoding, original, to_terms
from lumos.compile.ir.graph import OPS, REDUCE, Graph, Node, Op, View, contiguous_strides

_NAMES = {f"Term.{OPS[op].term}": op for op in CONSTRUCTORS}
"""egglog's name of each op's term (ir/ops.py's table names them)."""
LET_PREFIX = "n"
"""`let` name of an original node's term (n<id>): lets keep the terms shallow."""


@dataclass
class ENode:
    op: str
    children: list[str]
    eclass: str


@dataclass
class Serialized:
    """The e-graph's Term e-nodes by id, the e-classes they form, the literals, the original nodes."""

    nodes: dict[str, ENode]
    classes: dict[str, list[str]]
    literals: dict[str, str]
    """A primitive e-class (i64, f64, String) → its value as egglog prints it."""
    originals: dict[int, str] = field(default_factory=dict)
    """Node id of the encoded graph → its e-class."""

    @property
    def term_nodes(self) -> int:
        return len(self.nodes)

    @property
    def term_classes(self) -> int:
        return len(self.classes)


def serialize(egraph: EGraph) -> Serialized:
    data = json.loads(egraph._serialize(split_primitive_outputs=False).to_json())
    nodes, classes, literals, originals_raw = {}, {}, {}, []
    eclass_of = {node_id: raw["eclass"] for node_id, raw in data["nodes"].items()}  # children are e-node ids
    for node_id, raw in data["nodes"].items():
        if node_id.startswith("primitive-"):
            literals[raw["eclass"]] = raw["op"]
            continue
        if raw["op"] == "original":
            originals_raw.append(raw["children"])
        if not raw["op"].startswith("Term."):
            continue  # relations (facts about views, originals)
        nodes[node_id] = ENode(raw["op"], [eclass_of[child] for child in raw["children"]], raw["eclass"])
        classes.setdefault(raw["eclass"], []).append(node_id)
    originals = {int(literals[eclass_of[node_id]]): eclass_of[term] for term, node_id in originals_raw}
    return Serialized(nodes, classes, literals, originals)


def default_cost(node: ENode) -> float:
    """Work, roughly: one per computed op; views and stores almost free (a view that composes or
    vanishes still wins); leaves free."""
    if node.op == "Term.view":
        return 0.01
    if node.op == "Term.store":
        return 0.01
    if node.op in ("Term.input", "Term.tensor"):
        return 0.0
    if node.op == "Term.num":
        return 0.001
    return 1.0


def choose(serialized: Serialized, cost: Callable[[ENode], float], cut: tuple[str, ...] = ()) -> dict[str, str]:
    """The cheapest e-node of every e-class (tree cost: the sum over children), by fixpoint; an
    e-node whose op is in `cut` costs only its own (a stored buffer: reading it does not redo the
    work below it)."""
    best: dict[str, tuple[float, str]] = {}
    nodes = serialized.nodes
    changed = True
    while changed:
        changed = False
        for node_id, node in nodes.items():
            total = cost(node)
            for child in node.children:
                if child in serialized.literals or node.op in cut:
                    continue
                entry = best.get(child)
                if entry is None:
                    total = math.inf
                    break
                total += entry[0]
            if total < best.get(node.eclass, (math.inf, ""))[0]:
                best[node.eclass] = (total, node_id)
                changed = True
    return {eclass: node_id for eclass, (_, node_id) in best.items()}


def encode(egraph: EGraph, graph: Graph, stores: set[Node] | None = None) -> Encoding:
    """`graph` in `egraph`, every node's term marked `original(term, id)`, to find it after the
    rules ran (a let names one e-class once: two nodes with the same term would lose a name)."""
    encoding = to_terms(graph, stores, bind=lambda node, term: egraph.let(f"{LET_PREFIX}{node.id}", term))
    egraph.register(*(original(term, i64(node.id)) for node, term in encoding.terms.items()))
    return encoding


def _literal(text: str):
    if text.startswith('"'):
        return json.loads(text)
    return float(text) if any(c in text for c in ".eE") or text in ("inf", "-inf", "NaN") else int(text)


def build_graph(encoding: Encoding, serialized: Serialized, chosen: dict[str, str]) -> tuple[Graph, set[Node]]:
    """A new graph computing the original outputs from the chosen e-nodes, and the nodes whose
    e-node was a `store` (the buffers the extraction chose)."""
    old = encoding.graph
    graph = Graph(tensors=dict(old.tensors), output_shapes=dict(old.output_shapes), batch=old.batch)
    graph.inputs = {name: graph.add(Op.INPUT, shape=node.shape, arg=name, origin=node.origin)
                    for name, node in old.inputs.items()}
    for name, node in graph.inputs.items():
        node.batched = old.inputs[name].batched
    tensor_shapes = {node.arg: node.shape for node in old.nodes if node.op is Op.CONST and isinstance(node.arg, str)}
    original: dict[str, Node] = {}
    for node in reversed(old.nodes):  # the first node of an e-class names it
        eclass = serialized.originals.get(node.id)
        if eclass is not None:
            original[eclass] = node
    built: dict[str, Node] = {}
    stored: set[Node] = set()

    def read(eclass: str) -> str:
        """The e-class whose node an operand of this e-class reads (a view's source: views are no nodes)."""
        enode = serialized.nodes[chosen[eclass]]
        return enode.children[0] if enode.op == "Term.view" else eclass

    def needs(eclass: str) -> list[str]:
        """The e-classes whose nodes must exist before this one's."""
        enode = serialized.nodes[chosen[eclass]]
        if enode.op in ("Term.view", "Term.store"):
            return [enode.children[0]]
        return [read(c) for c in enode.children if c not in serialized.literals]

    def operand(eclass: str) -> tuple[Node, View]:
        enode = serialized.nodes[chosen[eclass]]
        if enode.op == "Term.view":
            return built[enode.children[0]], encoding.views[int(serialized.literals[enode.children[1]])]
        node = built[eclass]  # a bare tensor as an operand: read in order
        return node, View.contiguous(node.shape)

    def make(eclass: str) -> Node:
        enode = serialized.nodes[chosen[eclass]]
        op, children = enode.op, enode.children
        like = original.get(eclass)
        origin = like.origin if like is not None else ""
        if op == "Term.input":
            return graph.inputs[_literal(serialized.literals[children[0]])]
        if op == "Term.tensor":
            name = _literal(serialized.literals[children[0]])
            return graph.add(Op.CONST, shape=tensor_shapes[name], arg=name, origin=origin)
        if op == "Term.num":
            return graph.scalar(_literal(serialized.literals[children[0]]))
        if op == "Term.store":
            node = built[children[0]]
            stored.add(node)
            return node
        if op == "Term.view":  # a view where a node is needed: a copy (x + 0)
            source, view = operand(eclass)
            reads = [(source, view), (graph.scalar(0.0), View(view.shape, (0,) * len(view.shape)))]
            node = graph.add(Op.ADD, [s for s, _ in reads], [v for _, v in reads], view.shape, origin=origin)
        elif _NAMES.get(op) in REDUCE:
            source, view = operand(children[0])
            axis = int(serialized.literals[children[1]])
            shape = tuple(1 if d == axis else size for d, size in enumerate(view.shape))
            node = graph.add(_NAMES[op], (source,), (view,), shape, arg=axis, origin=origin)
        elif op in _NAMES:
            reads = [operand(child) for child in children]
            shape = reads[1][1].shape + reads[0][1].shape[1:] if _NAMES[op] is Op.GATHER else reads[0][1].shape
            node = graph.add(_NAMES[op], [s for s, _ in reads], [v for _, v in reads], shape, origin=origin)
        else:
            raise NotImplementedError(f"extracting {op}")
        node.batched = like.batched if like is not None else _batched(node, graph.batch)
        return node

    for name, node in old.outputs.items():
        root = serialized.originals[node.id]
        stack = [(root, False)]
        while stack:  # depth first, sources before users, without recursion (graphs are deep)
            eclass, ready = stack.pop()
            if eclass in built:
                continue
            if ready:
                built[eclass] = make(eclass)
                continue
            stack.append((eclass, True))
            stack.extend((child, False) for child in needs(eclass) if child not in built)
        graph.outputs[name] = built[root]
    return graph, stored


def _batched(node: Node, batch: int | None) -> bool:
    """A node no original one is equivalent to: batched when it keeps a batched source's rows."""
    if batch is None or not node.shape or node.shape[0] != batch:
        return False
    if node.op in REDUCE and node.arg == 0:
        return False
    return any(src.batched and view.shape[:1] == (batch,) and view.strides[0] == contiguous_strides(src.shape)[0]
               for src, view in zip(node.srcs, node.views, strict=True))


def replace_graph(graph: Graph, new: Graph) -> None:
    """Make `graph` the extracted one in place (callers keep their handle, as with layout.py)."""
    graph.nodes, graph.inputs, graph.outputs = new.nodes, new.inputs, new.outputs
    graph.output_shapes, graph.tensors, graph._scalars = new.output_shapes, new.tensors, new._scalars
    graph.prune()


def term_sizes(serialized: Serialized) -> dict[str, int]:
    return {"enodes": serialized.term_nodes, "eclasses": serialized.term_classes}



def stored_nodes(serialized: Serialized, chosen: dict[str, str], nodes, outputs) -> set:
    """The nodes (of `nodes`) whose e-class the extracted program `chosen` reaches from `outputs`
    through a `store`: that program's buffers. Identical nodes share an e-class (and a choice)."""
    by_class: dict[str, list] = {}
    for node in nodes:
        if (eclass := serialized.originals.get(node.id)) is not None:
            by_class.setdefault(eclass, []).append(node)
    stored, seen = set(), set()
    stack = [serialized.originals[node.id] for node in outputs]
    while stack:  # the e-classes the extracted program reaches
        eclass = stack.pop()
        if eclass in seen or eclass not in chosen:
            continue
        seen.add(eclass)
        enode = serialized.nodes[chosen[eclass]]
        if enode.op == "Term.store":
            stored.update(by_class[eclass])
        stack.extend(c for c in enode.children if c not in serialized.literals)
    return stored
