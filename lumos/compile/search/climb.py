"""Schedule search by measurement: for each distinct kernel, try schedule variants and keep the
fastest one that computes what the interpreter computes.

    kernels → group identical ones (same C modulo buffer names) → candidates per group (egraph/
    schedule.py's ruleset), each with the cost model's predicted time → rounds: render every kernel
    with one untried candidate of its group, build, check each kernel's buffer against the
    reference interpreter, time each kernel (warm-up, repeats, median) → best verified candidate
    per group → search cache

The rounds are a mutation hill-climb over the per-kernel choices (as in Luminal): each round every
group still searching mutates its best choice so far into the untried candidate that scores
best, where the score is the cost model's prediction (search/cost_model.py) raised by how many schedule
knobs the mutation changes; what is measured faster becomes the new best. Kernel times are taken
one by one, so each kernel's mutation is kept or dropped on its own, and one build (one gcc call)
times a mutation of every group. Candidates that render to C already timed are skipped (source
hash), so no program is timed twice. A group's baseline is the renderer's own heuristic (round 0,
always run), so the search never does worse than no search, and no candidate is ever chosen
without having been verified.

Then whole programs: fused or unfused attention (the attention rules), and the fusion climb
(`_climb_fusion`, the last quarter of the budget): the e-graph holds every prologue and epilogue
stored or fused (egraph/fusion.py); one family of sites at a time is stored, the kernels that
changes are searched, and a whole call decides. Each choice is cached like the schedules.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from lumos.compile.ir.graph import LEAF, REDUCE, ROUNDING, Graph, Node, Op, View, is_matmul, is_product_sum
from lumos.compile.ir.interpret import product_sum, read_view, run_node, summed_products
from lumos.compile.render.c import canonical_kernel_source, render_library, tensor_names
from lumos.compile.runtime.kernel_cache import BuildError, KernelCache, gcc
from lumos.compile.runtime.native import NativeProgram, from_storage
from lumos.compile.schedule.buffers import FLOAT_BYTES, plan_buffers
from lumos.compile.schedule.kernels import Kernel, KernelSchedule, build_kernels
from lumos.compile.search.cache import SearchCache, SearchEntry
from lumos.compile.search.cost_model import kernel_flops, machine_rates, predict_ms, ranking_report  # noqa: F401 (kernel_flops: benchmarks)

VERIFY_ROWS = 3
"""Rows of a symbolic batch that candidates are checked on (an awkward size; the interpreter is slow)."""
TOLERANCE = 1e-4
"""Relative to the largest magnitude of the reference buffer (sums reassociate)."""
WARMUP, REPEATS = 1, 5
CONFIRM_REPEATS = 7
"""Whole calls of the baseline and of the searched program, alternately, before the search result
is kept: per-kernel times on a busy machine can mislead, a whole call is what counts."""

search_clock = time.perf_counter
"""The clock the budget is spent on (deadlines, rounds, SearchResult.seconds); kernels themselves
are timed on time.perf_counter. A test swaps in a clock that ticks once per reading, so that what a
budget allows is a count, the same on a loaded machine as on an idle one."""


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
    # At the whole traced shape (a fixed batch), matrix products are summed without their M·N·K
    # array: 15 s → about 1 s for nn.TransformerEncoder at batch 256.
    products = summed_products(graph, keep) if rows is None else set()
    for node in graph.nodes:
        released = node.srcs
        if node in products:
            continue  # computed by its SUM, which releases its operands
        if node.op is Op.INPUT:
            value = np.asarray(inputs[node.arg], np.float32)
            values[node] = value[:rows] if rows is not None and node.batched else value
        elif node.op is Op.SUM and node.srcs[0] in products:
            values[node] = product_sum(node, values)
            released = (*node.srcs, *node.srcs[0].srcs)
        else:
            operands = []
            for src, view in zip(node.srcs, node.views, strict=True):
                source = values[src]
                if rows is not None and node.batched:
                    # A literal whose rows are all alike (max pooling's padded pattern, folded to the
                    # batch's shape) is read at fewer rows too; that cannot change a value. Other
                    # literals (weights whose first dim happens to equal the batch) are read whole.
                    same_rows = (src.op is Op.CONST and source.ndim > 0 and source.shape[0] == graph.batch
                                 and bool(np.all(source == source[:1])))
                    view = _rows_view(view, rows, graph.batch, src.batched or src in mixed or same_rows)
                elif node in mixed and src.batched:  # zeros for the rows not given
                    source = np.pad(source, [(0, graph.batch - rows)] + [(0, 0)] * (source.ndim - 1))
                operands.append(read_view(source, view))
            value = run_node(node, operands, graph.tensors)
            values[node] = value
        if node in keep:
            kept[node] = values[node]
        for src in released:
            uses[src] -= 1
            if uses[src] == 0 and src not in keep:
                values.pop(src, None)
    return kept


# ---------------------------------------------------------------------------------------------
# Groups of identical kernels and their candidates


def kernel_key(kernel: Kernel, materialized: set[Node], dtypes: Mapping[Node, str] | None = None) -> str:
    """Identifies a kernel up to buffer names: identical layers share it, so they are searched once.
    The hash of its C as the program renders it, with `dtypes` (Graph.stored_dtypes): a kernel that
    reads or writes a half buffer declares it half, so its key (and search cache entry) is apart
    from its float32 twin's, while a kernel with float32 buffers only keeps the key it had."""
    return hashlib.sha256(canonical_kernel_source(kernel, materialized, dtypes=dtypes).encode()).hexdigest()[:24]


@dataclass
class Candidate:
    schedule: KernelSchedule
    source_hash: str
    ms: float | None = None
    """Summed median time of the group's kernels; None until measured."""
    verified: bool = False
    rejected: str = ""
    predicted_ms: float = 0.0
    """The cost model's estimate (search/cost_model.py): orders the search, never chooses."""


def mutations(a: KernelSchedule, b: KernelSchedule) -> int:
    """How many schedule knobs differ between two candidates (the size of a hill-climb step)."""
    return sum(getattr(a, name) != getattr(b, name) for name in KernelSchedule.__dataclass_fields__)


MUTATION_PENALTY = 0.25
"""Each knob a step changes raises its score by this fraction: the climb stays near the best."""


@dataclass
class Group:
    key: str
    kernels: list[Kernel]
    candidates: list[Candidate]
    rules: dict[str, int] = field(default_factory=dict)
    """egglog rules that fired while building the candidates, with their match counts."""
    cached: SearchEntry | None = None
    queue: list[int] = field(default_factory=list)
    """Candidates not yet timed (by index)."""
    retry: list[int] = field(default_factory=list)
    """Candidates to time again: they read a buffer another kernel's candidate got wrong."""

    def next_index(self) -> int:
        """The next candidate to time: a retry or the baseline first, then the hill-climb's step
        from the best so far (the cheapest predicted, penalized by the knobs it changes)."""
        if self.retry:
            return self.retry.pop(0)
        anchor = (self.best or self.candidates[0]).schedule
        index = min(self.queue, key=lambda i: (i != 0, self.candidates[i].predicted_ms
                                               * (1 + MUTATION_PENALTY * mutations(anchor, self.candidates[i].schedule)), i))
        self.queue.remove(index)
        return index

    def start_from(self, schedule: KernelSchedule) -> None:
        """Time the candidate with `schedule` (if there is one, untimed) next: a kernel that
        differs from one already searched only where it reads an operand starts from its best."""
        index = next((i for i in self.queue if self.candidates[i].schedule == schedule), None)
        if index is not None:
            self.queue.remove(index)
            self.retry.insert(0, index)

    @property
    def searching(self) -> bool:
        return bool(self.queue or self.retry)

    def tried(self) -> list[dict]:
        """Every candidate timed or rejected, fastest first: what --explain lists."""
        done = [c for c in self.candidates if c.ms is not None or c.rejected]
        done.sort(key=lambda c: (c.ms is None, c.ms or 0.0))
        return [{"schedule": c.schedule.describe(), "ms": c.ms if c.verified else None, "predicted_ms": c.predicted_ms,
                 "rejected": c.rejected} for c in done]

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
                "worst_ms": worst.ms if worst else None, "alternatives": self.tried()}


def make_groups(kernels: list[Kernel], materialized: set[Node], seed: int, register_blocks: bool = True,
                search_cache: SearchCache | None = None, dtypes: Mapping[Node, str] | None = None) -> list[Group]:
    """Identical kernels (by key) as one group each, with their candidate schedules: each rendered
    to C (its half buffers by `dtypes`), so that variants which print the same C are one candidate.
    A group in `search_cache` gets its entry and no candidates (rendering them was 1.4 s of a 3 s
    warm compile)."""
    from lumos.compile.egraph.schedule import schedule_candidates

    by_key: dict[str, list[Kernel]] = {}
    for kernel in kernels:
        by_key.setdefault(kernel_key(kernel, materialized, dtypes), []).append(kernel)
    rates = machine_rates()
    groups = []
    for key, members in by_key.items():
        cached = search_cache.get(key) if search_cache is not None else None
        if cached is not None:
            groups.append(Group(key, members, [], cached=cached))
            continue
        schedules, rules = schedule_candidates(members[0], register_blocks=register_blocks)
        seen: set[str] = set()
        candidates = []
        for sched in [KernelSchedule(), *schedules]:
            source = canonical_kernel_source(members[0], materialized, sched, dtypes)
            digest = hashlib.sha256(source.encode()).hexdigest()
            if digest not in seen:  # a variant that renders to C already tried is the same candidate
                seen.add(digest)
                predicted = len(members) * predict_ms(members[0], sched, rates)
                candidates.append(Candidate(sched, digest, predicted_ms=predicted))
        groups.append(Group(key, members, candidates, rules, queue=list(range(len(candidates)))))
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
    kernels: list[Kernel] = field(default_factory=list)
    """The kernels searched: the scheduler's, or with attention fused (see `attention`)."""
    materialized: set[Node] = field(default_factory=set)
    attention: dict | None = None
    """What the attention rules found, and whether the fused kernels were kept (and why)."""
    confirmed: dict | None = None
    """Whole-call ms of the program without and with the search's choices, and whether they were kept."""
    cost_model: dict | None = None
    """The cost model's rank correlation with the measured times (cost_model.ranking_report)."""
    fusion: dict | None = None
    """The fusion choices the e-graph offered, each one tried (whole-call ms) and whether it was kept."""

    @property
    def cache_hit(self) -> bool:
        """Every group's schedule came from the search cache and nothing was measured."""
        return self.rounds == 0 and all(group.cached is not None for group in self.groups)

    def report(self) -> list[dict]:
        return [group.report() for group in self.groups]


@dataclass
class Measurement:
    ms: np.ndarray
    """Median milliseconds per kernel."""
    wrong: set[Node]
    """Kernels (by node) whose buffer differs from the interpreter."""
    inconclusive: set[str]
    """Kernels (by name) that read a wrong buffer: their own check proves nothing."""


class Bench:
    """Builds, verifies and times whole programs (any kernel list with any schedules) against one
    reference: the interpreter's value of every candidate kernel's node on a few rows."""

    def __init__(self, graph: Graph, nodes: set[Node], inputs: Mapping[str, np.ndarray], cache: KernelCache,
                 cc: str, cflags: tuple[str, ...]):
        self.graph, self.inputs, self.cache, self.cc, self.cflags = graph, inputs, cache, cc, cflags
        self.dtypes = graph.stored_dtypes()
        """The nodes stored half: part of every kernel key (kernel_key)."""
        self.rows = min(VERIFY_ROWS, graph.batch) if graph.batch is not None else None
        self.small = {name: (value[:self.rows] if self.rows is not None else value) for name, value in inputs.items()}
        self.wanted = set(nodes)
        self._reference: dict[Node, np.ndarray] | None = None
        self.unchecked = row_mixed(graph) if self.rows is not None else set()
        self.outputs = {node: name for name, node in graph.outputs.items()}
        self.slowest_ms = None
        """A candidate program this many times slower than the baseline is timed once, not REPEATS times."""
        self.timed: dict[str, list[tuple[float, float]]] = {}
        """Per group key, (predicted, measured) ms of every candidate verified: the cost model's score."""

    @property
    def reference(self) -> dict[Node, np.ndarray]:
        """Computed at the first measurement: a search whose every choice is cached measures
        nothing, and the interpreter over a fixed batch of 256 took 24 s of a 30 s warm compile."""
        if self._reference is None:
            self._reference = reference_values(self.graph, self.small, self.wanted, self.rows)
        return self._reference

    def add_reference(self, nodes: set[Node]) -> None:
        """Reference values for nodes that new candidate programs store (one more interpreter run,
        once the reference exists)."""
        self.wanted |= nodes
        if self._reference is None:  # the first measurement computes them with the rest
            return
        missing = {node for node in nodes if node not in self._reference}
        if missing:
            self._reference.update(reference_values(self.graph, self.small, missing, self.rows))

    def program(self, kernels: list[Kernel], materialized: set[Node], schedules: dict[str, KernelSchedule],
                reuse: bool = False) -> tuple[NativeProgram, object]:
        """The built program; without `reuse` every intermediate stays readable in the arena and
        every kernel ends with a barrier (so that each is timed alone)."""
        graph = self.graph
        buffers = plan_buffers(graph, kernels, reuse=reuse)
        source = render_library(graph, kernels, materialized, buffers, schedules, always_barrier=not reuse)
        program = NativeProgram(self.cache.build(source, gcc(self.cc, self.cflags)).library,
                                [(name, node.shape) for name, node in graph.inputs.items()],
                                [(name, node.shape) for name, node in graph.outputs.items()],
                                [graph.tensors[name] for name in tensor_names(graph)], buffers.arena_bytes,
                                symbolic_batch=graph.batch is not None, storage=graph.storage,
                                tensor_names=tensor_names(graph))
        return program, buffers

    def confirm(self, baseline: tuple, searched: tuple, repeats: int = CONFIRM_REPEATS) -> tuple[float, float]:
        """Median ms per whole call of two programs as they will run (buffers reused, barriers only
        where needed), timed alternately so that both see the same background load."""
        programs = [self.program(*baseline, reuse=True)[0], self.program(*searched, reuse=True)[0]]
        times: list[list[float]] = [[], []]
        for program in programs:
            program(self.inputs)
        for _ in range(repeats):
            for index, program in enumerate(programs):
                began = time.perf_counter()
                program(self.inputs)
                times[index].append((time.perf_counter() - began) * 1000)
        return statistics.median(times[0]), statistics.median(times[1])

    def measure(self, kernels: list[Kernel], materialized: set[Node], schedules: dict[str, KernelSchedule]) -> Measurement:
        program, buffers = self.program(kernels, materialized, schedules)
        got = program(self.small)
        wrong: set[Node] = set()
        inconclusive: set[str] = set()
        for kernel in kernels:
            if wrong.intersection(kernel.reads):  # downstream of a wrong kernel: proves nothing
                wrong.add(kernel.node)
                inconclusive.add(kernel.name)
                continue
            for node in kernel.outputs:  # a kernel with several outputs (siblings.py): each one
                if node in self.unchecked:
                    continue
                want = self.reference[node]
                tolerance = TOLERANCE
                if node in self.outputs:
                    name = self.outputs[node]
                    dtype = self.graph.storage.outputs.get(name, "float32")
                    have = from_storage(got[name], dtype).reshape(-1)[:want.size]
                    tolerance = max(TOLERANCE, ROUNDING.get(dtype, 0.0))  # a half output is rounded once
                else:
                    buffer = buffers.buffers[node]
                    have = program.arena[buffer.offset:buffer.offset + want.size * FLOAT_BYTES].view(np.float32)
                scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
                if not np.allclose(have, want.reshape(-1), rtol=tolerance, atol=tolerance * scale, equal_nan=True):
                    wrong.add(kernel.node)
        times = [program.kernel_seconds(self.inputs, len(kernels)) for _ in range(WARMUP)]
        slow = self.slowest_ms is not None and times[-1].sum() * 1000 > 5 * self.slowest_ms
        times = [program.kernel_seconds(self.inputs, len(kernels)) for _ in range(1 if slow else REPEATS)]
        ms = np.median(np.stack(times), axis=0) * 1000
        if self.slowest_ms is None:
            self.slowest_ms = float(ms.sum())
        return Measurement(ms, wrong, inconclusive)


def search_schedules(graph: Graph, kernels: list[Kernel], materialized: set[Node], cache: KernelCache,
                     cc: str, cflags: tuple[str, ...], budget_s: float, inputs: Mapping[str, np.ndarray] | None = None,
                     search_cache: SearchCache | None = None, seed: int = 0, attention: bool = True,
                     register_blocks: bool = True, fusion: bool = True) -> SearchResult:
    """The fastest verified schedule of every kernel found within `budget_s` seconds (round 0, the
    baseline, always runs). Groups found in `search_cache` are not searched again. With
    `attention`, the attention rules' fused kernels replace the kernels they cover when they are
    verified and the whole call is faster, both programs with their searched schedules; without
    `register_blocks`, no register-blocked matmul is a candidate; with `fusion`, the time left
    climbs over the fusion choices (a prologue or epilogue stored instead of fused, `_climb_fusion`)."""
    started = search_clock()
    deadline = started + budget_s
    schedules_until = deadline - FUSION_SHARE * budget_s if fusion else deadline
    inputs = inputs if inputs is not None else random_inputs(graph, seed)
    plain = (kernels, materialized)
    known: dict[str, Group] = {}  # every group searched, by key: programs share them, and all are stored at the end
    fused_report, fused, staged, groups, rounds, fusion_report = None, None, None, None, 0, None
    if attention:
        from lumos.compile.egraph.attention import find_attention, fuse_attention

        matches, fired = find_attention(graph)
        if matches:
            fused_kernels, fused_materialized, used = fuse_attention(graph, materialized, matches)
            fused = (fused_kernels, fused_materialized) if used else None
            staged_kernels, staged_materialized, staged_used = fuse_attention(graph, materialized, matches, stage_keys=True)
            if fused and any(match.keys_copy is not None for match in staged_used):
                staged = (staged_kernels, staged_materialized)
    bench = Bench(graph, {k.node for program in (plain, fused, staged) if program for k in program[0]}, inputs, cache,
                  cc, cflags)
    if fused is not None:
        decision_key = hashlib.sha256("\n".join(sorted(
            canonical_kernel_source(k, fused[1], dtypes=bench.dtypes) for k in fused[0] if k.attention is not None)).encode()
        ).hexdigest()[:24]
        fused_report = search_cache.get_decision(decision_key) if search_cache is not None else None
        if fused_report is None:
            fused_report, groups, rounds = _choose_attention(bench, plain, fused, staged, used, fired, search_cache,
                                                             seed, register_blocks, schedules_until, known)
            if search_cache is not None:
                search_cache.put_decision(decision_key, fused_report)
        else:
            fused_report = {**fused_report, "cached": True}
        if fused_report["chosen"]:
            kernels, materialized = staged if staged and fused_report.get("staged_keys", {}).get("chosen") else fused
    if groups is None:
        groups = make_groups(kernels, materialized, seed, register_blocks, search_cache, bench.dtypes)
        rounds += _search_groups(bench, kernels, materialized, groups, search_cache, schedules_until, known)
    if fusion:
        kernels, materialized, groups, fusion_report, fusion_rounds = _climb_fusion(
            bench, kernels, materialized, groups, search_cache, deadline, seed, register_blocks, known)
        rounds += fusion_rounds + _resume(bench, kernels, materialized, groups, deadline)
    if search_cache is not None:
        for group in known.values():
            if group.cached is None and group.best is not None:
                search_cache.put(group.key, SearchEntry.from_group(group))
    schedules = _chosen(groups)
    # The whole program, searched against not searched: kept only if a whole call is faster.
    confirm_key = hashlib.sha256("|".join(sorted(g.key for g in groups)).encode()).hexdigest()[:24]
    confirmed = search_cache.get_decision(confirm_key) if search_cache is not None else None
    if confirmed is None:
        baseline_ms, searched_ms = bench.confirm((*plain, {}), (kernels, materialized, schedules))
        confirmed = {"baseline_ms": baseline_ms, "searched_ms": searched_ms, "kept": searched_ms < baseline_ms}
        if search_cache is not None:
            search_cache.put_decision(confirm_key, confirmed)
    if not confirmed["kept"]:
        kernels, materialized = plain
        schedules = {kernel.name: KernelSchedule() for kernel in kernels}
    return SearchResult(schedules, groups, rounds, search_clock() - started, budget_s, kernels, materialized,
                        fused_report, confirmed, ranking_report(bench.timed), fusion_report)


def _search_groups(bench: Bench, kernels, materialized, groups: list[Group], search_cache: SearchCache | None,
                   deadline: float, known: dict[str, Group]) -> int:
    """Search the groups not in `search_cache` until `deadline`. A group already in `known`
    (another program's, by key: the same kernel) shares its candidates, measured or not, and goes
    on from where that search stopped; new groups join `known`. Nothing is stored here: a phase
    that runs out of time leaves its groups unfinished, and a later phase (the fused program, the
    fusion climb) may finish them, so the search stores every group once, at its end. Returns the
    rounds run."""
    for group in groups:
        if search_cache is not None and group.cached is None:  # make_groups read it already where it could
            group.cached = search_cache.get(group.key)
        if group.cached is None and group.key in known:
            other = known[group.key]
            group.candidates, group.queue, group.retry, group.cached = other.candidates, other.queue, other.retry, other.cached
        known.setdefault(group.key, group)
    pending = [group for group in groups if group.cached is None]
    if not pending:
        return 0
    return _run_rounds(bench, kernels, materialized, groups, pending, deadline)


def _resume(bench: Bench, kernels, materialized, groups: list[Group], deadline: float) -> int:
    """Go on with the schedule search of groups not finished, until `deadline` (the fusion climb's
    share of the budget, when it needed less). Returns the rounds run."""
    pending = [group for group in groups if group.cached is None and group.searching and group.best is not None]
    if not pending or search_clock() + 1.0 > deadline:
        return 0
    return _run_rounds(bench, kernels, materialized, groups, pending, deadline)


def _chosen(groups: list[Group]) -> dict[str, KernelSchedule]:
    schedules = {}
    for group in groups:
        chosen = group.cached.schedule if group.cached is not None else (group.best or group.candidates[0]).schedule
        for kernel in group.kernels:
            schedules[kernel.name] = chosen
    return schedules


def _choose_attention(bench: Bench, plain: tuple, fused: tuple, staged: tuple | None, used, fired,
                      search_cache: SearchCache | None, seed: int, register_blocks: bool, deadline: float,
                      known: dict[str, Group]) -> tuple[dict, list[Group], int]:
    """Search both programs' schedules (the fused one only for the kernels the unfused one lacks,
    with half the time left), then time a whole call of each: the fused kernels are kept when they
    are verified and the call is faster. With default schedules alone the choice was a coin toss:
    blocked q·kᵀ and P·V can make the unfused program the faster one. With `staged` (the fused
    kernels reading the keys where their producer wrote them, no transposing copy), it is searched
    in the last third of the fused program's time (each attention kernel starting from the
    schedule its twin found) and timed against the fused one first, and the faster of the two
    goes on. Returns the report, the chosen program's searched groups and the
    rounds run."""
    plain_groups = make_groups(*plain, seed, register_blocks, search_cache, bench.dtypes)
    halfway = search_clock() + (deadline - search_clock()) / 2
    rounds = _search_groups(bench, *plain, plain_groups, search_cache, halfway, known)
    fused_groups = make_groups(*fused, seed, register_blocks, search_cache, bench.dtypes)
    fused_until = deadline if staged is None else search_clock() + (deadline - search_clock()) * 2 / 3
    fused_rounds, verified = _search_fused(bench, fused, fused_groups, search_cache, fused_until, known)
    rounds += fused_rounds
    staged_report = None
    if staged is not None and verified:
        staged_groups = make_groups(*staged, seed, register_blocks, search_cache, bench.dtypes)
        copies_best = {g.kernels[0].node: g.best for g in fused_groups if g.kernels[0].attention is not None and g.best}
        for group in staged_groups:  # the same attention, but for where it reads its keys
            if group.kernels[0].node in copies_best:
                group.start_from(copies_best[group.kernels[0].node].schedule)
        staged_rounds, staged_verified = _search_fused(bench, staged, staged_groups, search_cache, deadline, known)
        rounds += staged_rounds
        copies_ms, staged_ms = (bench.confirm((*fused, _chosen(fused_groups)), (*staged, _chosen(staged_groups)))
                                if staged_verified else (None, None))
        staged_report = {"verified": staged_verified, "copies_ms": copies_ms, "staged_ms": staged_ms,
                         "chosen": staged_verified and staged_ms < copies_ms}
        if staged_report["chosen"]:
            fused, fused_groups = staged, staged_groups
    unfused_ms, fused_ms = (bench.confirm((*plain, _chosen(plain_groups)), (*fused, _chosen(fused_groups)))
                            if verified else (None, None))
    attention_groups = [g for g in fused_groups if g.kernels[0].attention is not None]
    kernel_ms = [g.cached.best_ms if g.cached is not None else g.best.ms for g in attention_groups] if verified else []
    report = {"rules": fired, "matches": len(used), "kernels": [k.name for k in fused[0] if k.attention is not None],
              "verified": verified, "fused_ms": fused_ms, "unfused_ms": unfused_ms,
              "chosen": verified and fused_ms < unfused_ms,
              "score_bytes_not_written": sum(match.scores.size * FLOAT_BYTES for match in used),
              "fused_kernel_ms": float(sum(kernel_ms)) if verified else None}
    if staged_report is not None:
        report["staged_keys"] = staged_report
    return report, fused_groups if report["chosen"] else plain_groups, rounds


def _search_fused(bench: Bench, program: tuple, groups: list[Group], search_cache: SearchCache | None,
                  deadline: float, known: dict[str, Group]) -> tuple[int, bool]:
    """Search a fused program's groups (the kernels it shares with others go on from where they
    stopped); returns the rounds run and whether its attention kernels were verified."""
    try:
        rounds = _search_groups(bench, *program, groups, search_cache, deadline, known)
    except (BuildError, AssertionError):  # the fused kernels' default schedule does not build, or is wrong
        return 0, False
    attention_groups = [g for g in groups if g.kernels[0].attention is not None]
    return rounds, all(g.cached is not None or g.best is not None for g in attention_groups)


def _run_rounds(bench: Bench, kernels, materialized, groups, pending, deadline) -> int:
    rounds, round_seconds = 0, []
    while any(group.searching for group in pending):
        if rounds and search_clock() + statistics.mean(round_seconds) > deadline:
            break
        began = search_clock()
        trying: dict[str, int] = {}  # group key → candidate index tried this round
        schedules = {}
        for group in groups:
            if group.cached is not None:
                chosen = group.cached.schedule
            elif group.searching:
                index = group.next_index()
                trying[group.key] = index
                chosen = group.candidates[index].schedule
            else:
                chosen = (group.best or group.candidates[0]).schedule
            for kernel in group.kernels:
                schedules[kernel.name] = chosen
        try:
            result = bench.measure(kernels, materialized, schedules)
        except BuildError:
            if not trying or 0 in trying.values():
                raise
            for key, index in trying.items():  # one of them does not compile: none is kept
                next(g for g in groups if g.key == key).candidates[index].rejected = "does not build"
            rounds += 1
            round_seconds.append(search_clock() - began)
            continue
        position = {kernel.name: i for i, kernel in enumerate(kernels)}
        for key, index in trying.items():
            group = next(g for g in groups if g.key == key)
            candidate = group.candidates[index]
            names = [k.name for k in group.kernels]
            if any(kernels[position[n]].node in result.wrong and n not in result.inconclusive for n in names):
                candidate.rejected = "differs from the interpreter"
            elif any(n in result.inconclusive for n in names):
                group.retry.append(index)  # try again once its inputs are right
            else:
                candidate.verified = True
                candidate.ms = float(sum(result.ms[position[n]] for n in names))
                bench.timed.setdefault(key, []).append((candidate.predicted_ms, candidate.ms))
            if index == 0 and candidate.rejected:
                kernel = group.kernels[0]
                raise AssertionError(f"kernel {kernel.name} ({kernel.node.origin}) differs from the interpreter with "
                                     "the renderer's default schedule: a renderer bug")
        rounds += 1
        round_seconds.append(search_clock() - began)
    return rounds



# ---------------------------------------------------------------------------------------------
# Fusion choices: the e-graph holds every buffer stored or inlined (egraph/fusion.py); a program is
# one extraction; the climb flips one family of sites at a time and keeps what a whole call proves.

FUSION_STEP_S = 10.0
"""At most this long to search the schedules of the kernels one fusion step changes."""
FUSION_SHARE = 0.25
"""The part of the budget kept for the fusion climb (what it leaves goes back to the schedules):
the cost model puts the likeliest schedules first, so the last rounds of a schedule search gain
least."""
FUSION_MARGIN = 0.98
"""A fusion step is kept when a whole call is at least 2% faster: less is within the noise."""


@dataclass
class FusionSite:
    """Nodes the scheduler fused into a kernel that could be stored instead, one per identical
    kernel (identical layers flip together)."""

    signature: str
    kind: str
    """prologue (a computed operand of a matrix product) or epilogue (a matrix product read by
    elementwise ops in the same kernel)."""
    nodes: list[Node]

    def describe(self) -> str:
        node = self.nodes[0]
        where = node.origin.split(' ("')[0][:60]  # the torch op and module, not the source line
        return f"store the {self.kind} {node.op.name.lower()}{list(node.shape)} ×{len(self.nodes)} ({where})"


def fusion_sites(graph: Graph, kernels: list[Kernel], materialized: set[Node]) -> list[FusionSite]:
    uses, dtypes = graph.consumers(), graph.stored_dtypes()

    def is_product(node: Node) -> bool:
        return any(is_product_sum(consumer) for consumer, _ in uses[node])

    sites: dict[str, FusionSite] = {}
    for kernel in kernels:
        if kernel.attention is not None:
            continue  # the fused attention kernel is one choice as a whole
        key = kernel_key(kernel, materialized, dtypes)
        fused = kernel.unique_fused
        for position, node in enumerate(fused):
            if node is kernel.node or node in materialized or node.op in LEAF or is_product(node):
                continue  # a product is M·N·K elements: never stored
            if is_matmul(node):
                kind = "epilogue"
            elif node.op not in REDUCE and any(is_product(consumer) for consumer, _ in uses[node]):
                kind = "prologue"
            else:
                continue
            site = sites.setdefault(f"{key}:{position}", FusionSite(f"{key}:{position}", kind, []))
            site.nodes.append(node)
    return list(sites.values())


def _with_attention(kernels: list[Kernel], like: list[Kernel]) -> list[Kernel]:
    by_node = {kernel.node: kernel.attention for kernel in like if kernel.attention is not None}
    for kernel in kernels:
        kernel.attention = by_node.get(kernel.node)
    return kernels


def _climb_fusion(bench: Bench, kernels: list[Kernel], materialized: set[Node], groups: list[Group],
                  search_cache: SearchCache | None, deadline: float, seed: int, register_blocks: bool,
                  known: dict[str, Group]):
    """Hill-climb over the fusion sites: from the searched program, store one family of sites
    (the cost model's likeliest first), search the schedules of the kernels that changes, and keep
    it if a whole call is faster; until the budget ends. The decision is cached like the rest.
    Returns the program, its groups, a report and the rounds run."""
    from lumos.compile.egraph.fusion import fusion_space

    sites = fusion_sites(bench.graph, kernels, materialized)
    if not sites:
        return kernels, materialized, groups, None, 0
    key = "fusion:" + hashlib.sha256("|".join(sorted(g.key for g in groups) + sorted(s.signature for s in sites))
                                     .encode()).hexdigest()[:24]
    cached = search_cache.get_decision(key) if search_cache is not None else None
    rounds = 0

    @functools.cache
    def space():
        """The fusion e-graph, saturated when first needed: a cached decision to store nothing
        needs none (about a second of a warm compile)."""
        return fusion_space(bench.graph, materialized | {node for site in sites for node in site.nodes})

    def program(stored_sites: list[FusionSite], base: set[Node]):
        stored = space().stores(base | {node for site in stored_sites for node in site.nodes})
        return _with_attention(build_kernels(bench.graph, stored), kernels), stored

    rates = machine_rates()

    def predicted(site: FusionSite) -> float:
        new_kernels, _ = program([site], materialized)
        return sum(predict_ms(kernel, KernelSchedule(), rates) for kernel in new_kernels)

    if cached is not None:
        chosen = [site for site in sites if site.signature in cached["stored"]]
        if chosen:
            kernels, materialized = program(chosen, materialized)
            groups = make_groups(kernels, materialized, seed, register_blocks, search_cache, bench.dtypes)
            bench.add_reference({kernel.node for kernel in kernels})
            rounds += _search_groups(bench, kernels, materialized, groups, search_cache, deadline, known)
        return kernels, materialized, groups, {**cached, "cached": True}, rounds
    bench.add_reference({node for site in sites for node in site.nodes})  # one interpreter run for every step
    saturated = space()
    report = {"sites": len(sites), "rules": saturated.rules, "enodes": saturated.serialized.term_nodes,
              "eclasses": saturated.serialized.term_classes, "saturate_s": saturated.seconds, "steps": [], "stored": []}
    for site in sorted(sites, key=predicted):
        if search_clock() + 1.0 > deadline:
            break
        new_kernels, stored = program([site], materialized)
        new_groups = make_groups(new_kernels, stored, seed, register_blocks, search_cache, bench.dtypes)
        bench.add_reference({kernel.node for kernel in new_kernels})
        step = {"site": site.describe(), "kind": site.kind, "nodes": len(site.nodes), "kept": False}
        try:
            rounds += _search_groups(bench, new_kernels, stored, new_groups, search_cache,
                                     min(deadline, search_clock() + FUSION_STEP_S), known)
        except (BuildError, AssertionError) as error:  # the renderer cannot take this program
            report["steps"].append({**step, "rejected": str(error)[:80]})
            continue
        if not all(g.cached is not None or g.best is not None for g in new_groups):
            report["steps"].append({**step, "rejected": "not verified"})
            continue
        before_ms, after_ms = bench.confirm((kernels, materialized, _chosen(groups)),
                                            (new_kernels, stored, _chosen(new_groups)))
        step.update(before_ms=before_ms, ms=after_ms, kept=after_ms < FUSION_MARGIN * before_ms)
        report["steps"].append(step)
        if step["kept"]:
            kernels, materialized, groups = new_kernels, stored, new_groups
            report["stored"].append(site.signature)
    if search_cache is not None:
        search_cache.put_decision(key, report)
    return kernels, materialized, groups, report, rounds
