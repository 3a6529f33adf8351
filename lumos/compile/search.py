"""Schedule search by measurement: for each distinct kernel, try schedule variants and keep the
fastest one that computes what the interpreter computes.

    kernels → group identical ones (same C modulo buffer names) → candidates per group (egraph.py's
    schedule ruleset) → rounds: render every kernel with one untried candidate of its group, build,
    check each kernel's buffer against the reference interpreter, time each kernel (warm-up,
    repeats, median) → best verified candidate per group → search cache

One round builds and runs the whole program once, so one gcc call times a candidate of every
group at the same time. Rounds run while the budget lasts; candidates that render to the same C
as one already tried are skipped (de-duplication by source hash). A group's baseline is the
renderer's own heuristic (round 0, always run), so the search never does worse than no search,
and no candidate is ever chosen without having been verified.
"""

from __future__ import annotations

import hashlib
import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from lumos.compile.cache import BuildError, KernelCache
from lumos.compile.interpret import read_view, run_node
from lumos.compile.ir import LEAF, Graph, Node, Op, View, prod
from lumos.compile.plan import FLOAT_BYTES, plan_buffers
from lumos.compile.render_c import canonical_kernel_source, render_library, tensor_names
from lumos.compile.runtime import NativeProgram
from lumos.compile.schedule import Kernel, KernelSchedule
from lumos.compile.search_cache import SearchCache, SearchEntry

VERIFY_ROWS = 3
"""Rows of a symbolic batch that candidates are checked on (an awkward size; the interpreter is slow)."""
TOLERANCE = 1e-4
"""Relative to the largest magnitude of the reference buffer (sums reassociate)."""
WARMUP, REPEATS = 1, 5


# ---------------------------------------------------------------------------------------------
# The reference: the interpreter on a few rows


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float inputs; an input used as gather ids gets valid row numbers of its table."""
    rng = np.random.default_rng(seed)
    rows_of: dict[Node, int] = {}
    for node in graph.nodes:
        if node.op is Op.GATHER and node.srcs[1].op is Op.INPUT:
            rows_of[node.srcs[1]] = node.views[0].shape[0]
    inputs = {}
    for name, node in graph.inputs.items():
        if node in rows_of:
            inputs[name] = rng.integers(0, rows_of[node], node.shape).astype(np.float32)
        else:
            inputs[name] = rng.standard_normal(node.shape).astype(np.float32)
    return inputs


def _rows_view(view: View, rows: int, batch: int, src_batched: bool) -> View:
    """The operand view of a batched consumer at `rows` instead of `batch` rows."""
    if not view.shape or view.shape[0] != batch or not (src_batched or view.strides[0] == 0):
        return view
    mask = None
    if view.mask is not None:
        lo, hi = view.mask[0]
        mask = ((min(lo, rows), min(hi, rows)), *view.mask[1:])
    return View((rows, *view.shape[1:]), view.strides, view.offset, mask)


def row_mixed(graph: Graph) -> set[Node]:
    """Nodes that are not batched but read batched ones (a layout copy that moves the batch dim
    inward): at fewer rows than traced, only the parts of them that batched consumers read are
    defined, so they are checked through those consumers, not on their own."""
    mixed: set[Node] = set()
    for node in graph.nodes:
        if not node.batched and any(src.batched or src in mixed for src in node.srcs):
            mixed.add(node)
    return mixed


def reference_values(graph: Graph, inputs: Mapping[str, np.ndarray], keep: set[Node], rows: int | None) -> dict[Node, np.ndarray]:
    """The interpreter's value of every node in `keep`, on the first `rows` rows of a symbolic
    batch (None: the whole traced shape). Other values are dropped once no node needs them."""
    mixed = row_mixed(graph) if rows is not None else set()
    uses = {node: 0 for node in graph.nodes}
    for node in graph.nodes:
        for src in node.srcs:
            uses[src] += 1
    values: dict[Node, np.ndarray] = {}
    kept: dict[Node, np.ndarray] = {}
    for node in graph.nodes:
        if node.op is Op.INPUT:
            value = np.asarray(inputs[node.arg], np.float32)
            values[node] = value[:rows] if rows is not None and node.batched else value
        else:
            operands = []
            for src, view in zip(node.srcs, node.views, strict=True):
                source = values[src]
                if rows is not None and node.batched:
                    view = _rows_view(view, rows, graph.batch, src.batched or src in mixed)
                elif node in mixed and src.batched:  # zeros for the rows not given
                    source = np.pad(source, [(0, graph.batch - rows)] + [(0, 0)] * (source.ndim - 1))
                operands.append(read_view(source, view))
            value = run_node(node, operands, graph.tensors)
            values[node] = value
        if node in keep:
            kept[node] = values[node]
        for src in node.srcs:
            uses[src] -= 1
            if uses[src] == 0 and src not in keep:
                values.pop(src, None)
    return kept


# ---------------------------------------------------------------------------------------------
# Groups of identical kernels and their candidates


def kernel_key(kernel: Kernel, materialized: set[Node]) -> str:
    """Identifies a kernel up to buffer names: identical layers share it, so they are searched once."""
    return hashlib.sha256(canonical_kernel_source(kernel, materialized).encode()).hexdigest()[:24]


@dataclass
class Candidate:
    schedule: KernelSchedule
    source_hash: str
    ms: float | None = None
    """Summed median time of the group's kernels; None until measured."""
    verified: bool = False
    rejected: str = ""


@dataclass
class Group:
    key: str
    kernels: list[Kernel]
    candidates: list[Candidate]
    rules: dict[str, int] = field(default_factory=dict)
    """egglog rules that fired while building the candidates, with their match counts."""
    cached: SearchEntry | None = None
    queue: list[int] = field(default_factory=list)

    @property
    def best(self) -> Candidate | None:
        measured = [c for c in self.candidates if c.verified and c.ms is not None]
        return min(measured, key=lambda c: c.ms) if measured else None

    @property
    def worst(self) -> Candidate | None:
        measured = [c for c in self.candidates if c.verified and c.ms is not None]
        return max(measured, key=lambda c: c.ms) if measured else None

    def report(self) -> dict:
        kernel = self.kernels[0]
        base = {"key": self.key, "kernels": [k.name for k in self.kernels], "kind": kernel.kind,
                "shape": list(kernel.node.shape), "origin": kernel.node.origin}
        if self.cached is not None:
            return {**base, **self.cached.report(), "cached": True}
        best, worst = self.best, self.worst
        return {**base, "cached": False, "rules": self.rules, "candidates": len(self.candidates),
                "tried": sum(c.ms is not None or bool(c.rejected) for c in self.candidates),
                "rejected": sum(bool(c.rejected) for c in self.candidates),
                "baseline_ms": self.candidates[0].ms, "best": best.schedule.describe() if best else None,
                "best_ms": best.ms if best else None, "worst": worst.schedule.describe() if worst else None,
                "worst_ms": worst.ms if worst else None}


def make_groups(kernels: list[Kernel], materialized: set[Node], seed: int) -> list[Group]:
    from lumos.compile.egraph.schedule import schedule_candidates

    by_key: dict[str, list[Kernel]] = {}
    for kernel in kernels:
        by_key.setdefault(kernel_key(kernel, materialized), []).append(kernel)
    rng = random.Random(seed)
    groups = []
    for key, members in by_key.items():
        schedules, rules = schedule_candidates(members[0])
        seen: set[str] = set()
        candidates = []
        for sched in [KernelSchedule(), *schedules]:
            source = canonical_kernel_source(members[0], materialized, sched)
            digest = hashlib.sha256(source.encode()).hexdigest()
            if digest not in seen:  # a variant that renders to C already tried is the same candidate
                seen.add(digest)
                candidates.append(Candidate(sched, digest))
        queue = list(range(1, len(candidates)))
        rng.shuffle(queue)  # Monte Carlo: a budget that ends early has sampled the space evenly
        groups.append(Group(key, members, candidates, rules, queue=[0, *queue]))
    return groups


# ---------------------------------------------------------------------------------------------
# The search


@dataclass
class SearchResult:
    schedules: dict[str, KernelSchedule]
    groups: list[Group]
    rounds: int
    seconds: float
    budget_s: float

    @property
    def cache_hit(self) -> bool:
        return all(group.cached is not None for group in self.groups)

    def report(self) -> list[dict]:
        return [group.report() for group in self.groups]


def search_schedules(graph: Graph, kernels: list[Kernel], materialized: set[Node], cache: KernelCache,
                     cc: str, cflags: tuple[str, ...], budget_s: float, inputs: Mapping[str, np.ndarray] | None = None,
                     search_cache: SearchCache | None = None, seed: int = 0) -> SearchResult:
    """The fastest verified schedule of every kernel found within `budget_s` seconds (round 0, the
    baseline, always runs). Groups found in `search_cache` are not searched again."""
    started = time.perf_counter()
    groups = make_groups(kernels, materialized, seed)
    if search_cache is not None:
        for group in groups:
            group.cached = search_cache.get(group.key)
    pending = [group for group in groups if group.cached is None]
    rounds = 0
    if pending:
        inputs = inputs if inputs is not None else random_inputs(graph, seed)
        rounds = _run_rounds(graph, kernels, materialized, groups, pending, cache, cc, cflags, inputs,
                             started + budget_s)
        if search_cache is not None:
            for group in pending:
                best = group.best
                if best is not None:
                    search_cache.put(group.key, SearchEntry.from_group(group))
    schedules = {}
    for group in groups:
        chosen = group.cached.schedule if group.cached is not None else (group.best or group.candidates[0]).schedule
        for kernel in group.kernels:
            schedules[kernel.name] = chosen
    return SearchResult(schedules, groups, rounds, time.perf_counter() - started, budget_s)


def _run_rounds(graph, kernels, materialized, groups, pending, cache, cc, cflags, inputs, deadline) -> int:
    buffers = plan_buffers(graph, kernels, reuse=False)  # every intermediate stays readable
    outputs = {node: name for name, node in graph.outputs.items()}
    rows = min(VERIFY_ROWS, graph.batch) if graph.batch is not None else None
    small = {name: (value[:rows] if rows is not None else value) for name, value in inputs.items()}
    reference = reference_values(graph, small, {k.node for k in kernels}, rows)
    unchecked = row_mixed(graph) if rows is not None else set()
    readers = {kernel.name: {src for src in kernel.reads} for kernel in kernels}
    rounds, round_seconds = 0, []
    while any(group.queue for group in pending):
        if rounds and time.perf_counter() + statistics.mean(round_seconds) > deadline:
            break
        began = time.perf_counter()
        trying: dict[str, int] = {}  # group key → candidate index tried this round
        schedules = {}
        for group in groups:
            if group.cached is not None:
                index, chosen = None, group.cached.schedule
            elif group.queue:
                index = group.queue.pop(0)
                trying[group.key] = index
                chosen = group.candidates[index].schedule
            else:
                best = group.best
                chosen = (best or group.candidates[0]).schedule
            for kernel in group.kernels:
                schedules[kernel.name] = chosen
        source = render_library(graph, kernels, materialized, buffers, schedules, always_barrier=True)
        try:
            library = cache.build(source, cc, cflags).library
        except BuildError:
            if not trying or 0 in trying.values():
                raise
            for key, index in trying.items():  # one of them does not compile: none is kept
                next(g for g in groups if g.key == key).candidates[index].rejected = "does not build"
            rounds += 1
            round_seconds.append(time.perf_counter() - began)
            continue
        program = NativeProgram(library,
                                [(name, node.shape) for name, node in graph.inputs.items()],
                                [(name, node.shape) for name, node in graph.outputs.items()],
                                [graph.tensors[name] for name in tensor_names(graph)], buffers.arena_bytes,
                                symbolic_batch=graph.batch is not None)
        # Verify every kernel's buffer; a kernel downstream of a wrong one proves nothing.
        got = program(small)
        wrong: set[Node] = set()
        inconclusive: set[str] = set()
        for kernel in kernels:
            if readers[kernel.name] & wrong:
                wrong.add(kernel.node)
                inconclusive.add(kernel.name)
                continue
            if kernel.node in unchecked:
                continue
            want = reference[kernel.node]
            if kernel.node in outputs:
                have = got[outputs[kernel.node]].reshape(-1)[:want.size]
            else:
                buffer = buffers.buffers[kernel.node]
                have = program.arena[buffer.offset:buffer.offset + want.size * FLOAT_BYTES].view(np.float32)
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            if not np.allclose(have, want.reshape(-1), rtol=TOLERANCE, atol=TOLERANCE * scale, equal_nan=True):
                wrong.add(kernel.node)
        times = [program.kernel_seconds(inputs, len(kernels)) for _ in range(WARMUP + REPEATS)][WARMUP:]
        medians = np.median(np.stack(times), axis=0) * 1000
        for key, index in trying.items():
            group = next(g for g in groups if g.key == key)
            candidate = group.candidates[index]
            members = [kernels.index(k) for k in group.kernels]
            if any(kernels[m].node in wrong and kernels[m].name not in inconclusive for m in members):
                candidate.rejected = "differs from the interpreter"
            elif any(kernels[m].name in inconclusive for m in members):
                group.queue.append(index)  # try again once its inputs are right
            else:
                candidate.verified = True
                candidate.ms = float(sum(medians[m] for m in members))
            if index == 0 and candidate.rejected:
                kernel = group.kernels[0]
                raise AssertionError(f"kernel {kernel.name} ({kernel.node.origin}) differs from the interpreter with "
                                     "the renderer's default schedule: a renderer bug")
        rounds += 1
        round_seconds.append(time.perf_counter() - began)
    return rounds


def kernel_flops(kernel: Kernel) -> int:
    """2·M·N·K of the matrix products a kernel computes (0 for the rest)."""
    return sum(2 * node.views[0].shape[node.arg] * node.size for node in kernel.fused
               if node.op is Op.SUM and node.srcs[0].op is Op.MUL and node.views[0].shape[node.arg] > 1
               and node.srcs[0].op not in LEAF and prod(node.shape) > 0)
