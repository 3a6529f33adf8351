"""The search over extracted programs: a genome of fusion choices, climbed by measurement.

The e-graph of egraph/programs.py proposes fusions the scheduler does not make (and buffers it
does not keep, and sibling kernels joined into one). Each family of proposals is one gene; a
genome is the set of genes switched on, and the empty genome is the scheduler's own program.
The climb is Luminal's: from the best program so far, mutate a few genes, build, verify every
kernel against the interpreter, time a whole call against the best (alternately, so both see the
same load), keep it when faster; programs already timed (by fingerprint: the buffers they store
and the kernels they join) are skipped. The cost model (search/cost_model.py) ranks the
mutations first: the single-gene steps from the scheduler's program by predicted time, then
random steps of one to three genes, the predicted fastest of a few first.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field

from lumos.compile.egraph.programs import (
    ProgramSpace,
    Proposal,
    family,
    fusion_proposals,
    program_space,
    sibling_proposals,
)
from lumos.compile.ir.graph import Graph, Node
from lumos.compile.kernel.lower import reads_siblings_in_place
from lumos.compile.runtime.kernel_cache import BuildError
from lumos.compile.schedule.kernels import Kernel, KernelSchedule, build_kernels
from lumos.compile.schedule.siblings import join_siblings
from lumos.compile.search.climb import Bench
from lumos.compile.search.cost_model import machine_rates, predict_ms

MARGIN = 0.98
"""A step is kept when a whole call is at least 2% faster: less is within the noise."""
RANDOM_TRIES = 8
"""Random mutations drawn per step once the single-gene steps are done; the cost model's
predicted fastest untried one is timed."""


@dataclass
class Program:
    """One extracted program: its genes, kernels and buffers."""

    genes: frozenset[str]
    kernels: list[Kernel]
    materialized: set[Node]
    fingerprint: str
    predicted_ms: float = 0.0
    ms: float | None = None
    """Median ms of a whole call, timed alternately with `against_ms`, the best program so far."""
    against_ms: float | None = None
    rejected: str = ""


@dataclass
class ProgramSearch:
    """The e-graph's proposals, the programs tried, and the one chosen."""

    space: ProgramSpace
    proposals: list[Proposal]
    tried: list[Program] = field(default_factory=list)
    best: Program | None = None
    seconds: float = 0.0
    rules: dict[str, int] = field(default_factory=dict)

    def pairs(self, genes: frozenset[str]) -> set[tuple[Node, Node]]:
        """The sibling kernels a genome joins, as (earlier node, later node)."""
        return {pair for p in self.proposals if p.key in genes and p.kind == "siblings" for pair in p.pairs}

    def build(self, genes: frozenset[str], join: bool = True) -> Program:
        """The program of a genome: the scheduler's buffers, less those fused by its genes, plus
        those stored by them, as the e-graph extracts it; then (with `join`) its sibling kernels
        joined."""
        keep = set(self.space.heuristic)
        for proposal in self.proposals:
            if proposal.key not in genes:
                continue
            if proposal.kind in ("fuse", "recompute"):
                keep -= set(proposal.nodes)
            elif proposal.kind == "store":
                keep |= set(proposal.nodes)
        stored = self.space.stores(keep)
        kernels = build_kernels(self.space.graph, stored)
        pairs = self.pairs(genes) if join else set()
        if pairs:
            kernels, _ = join_siblings(kernels, lambda kernel: reads_siblings_in_place(kernel, stored),
                                       allowed=lambda earlier, later: (earlier.node, later.node) in pairs)
        shape = sorted(node.id for node in stored), [[node.id for node in kernel.outputs] for kernel in kernels]
        return Program(genes, kernels, stored, hashlib.sha256(repr(shape).encode()).hexdigest()[:16])

    def fingerprint(self) -> str:
        """The proposals and the scheduler's program they start from: a kept genome is cached by it."""
        text = repr((sorted(p.key for p in self.proposals), sorted(family(node) for node in self.space.heuristic)))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def report(self) -> dict:
        """What --explain shows: every proposal (what the scheduler would not have done), the
        programs timed, and the genes of the one kept."""
        kept = self.best.genes if self.best is not None else frozenset()
        by_key = {p.key: p for p in self.proposals}
        report = proposals_report(self.proposals, kept, self.rules)
        report.update(enodes=self.space.serialized.term_nodes, seconds=self.seconds,
                      tried=[{"genes": sorted(by_key[g].describe() for g in program.genes), "ms": program.ms,
                              "against_ms": program.against_ms, "predicted_ms": program.predicted_ms,
                              "rejected": program.rejected, "kept": program is self.best}
                             for program in self.tried])
        return report


def proposals_report(proposals: list[Proposal], kept: frozenset[str], rules: dict[str, int]) -> dict:
    """What --explain shows of proposals that no program timed: each, and whether it is kept (the
    CUDA target's products genes, all kept with Options.join_products: it times nothing yet)."""
    by_key = {p.key: p for p in proposals}
    return {"rules": rules, "enodes": None, "seconds": 0.0,
            "proposed": [{"key": p.key, "kind": p.kind, "describe": p.describe(), "kept": p.key in kept}
                         for p in proposals],
            "tried": [], "kept": sorted(by_key[g].describe() for g in kept)}


def propose(graph: Graph, recompute_cheap: bool = True) -> ProgramSearch:
    """The e-graph's proposals for `graph`, before any measurement."""
    started = time.perf_counter()
    space = program_space(graph, recompute_cheap)
    proposals = fusion_proposals(space)
    siblings, fired = sibling_proposals(build_kernels(graph, space.heuristic))
    search = ProgramSearch(space, proposals + siblings, rules={**space.rules, **fired})
    search.seconds = time.perf_counter() - started
    return search


def climb_programs(search: ProgramSearch, bench: Bench, budget_s: float, seed: int = 0,
                   max_steps: int | None = None) -> Program:
    """The fastest verified program found within `budget_s` (the scheduler's, measured first,
    unless a step beats it)."""
    started = time.perf_counter()
    deadline = started + budget_s
    rates = machine_rates()
    timed: set[str] = set()

    def predicted(program: Program) -> float:
        return sum(predict_ms(kernel, KernelSchedule(), rates) for kernel in program.kernels)

    def verified(program: Program) -> bool:
        bench.add_reference({node for kernel in program.kernels for node in kernel.outputs})
        try:
            result = bench.measure(program.kernels, program.materialized, {})
        except BuildError as error:
            program.rejected = f"does not build: {str(error)[:60]}"
            return False
        if result.wrong:
            program.rejected = "differs from the interpreter"
            return False
        return True

    baseline = search.build(frozenset())
    baseline.predicted_ms = predicted(baseline)
    if not verified(baseline):
        raise AssertionError(f"the scheduler's program {baseline.rejected}: a renderer bug")
    baseline.against_ms, baseline.ms = bench.confirm((baseline.kernels, baseline.materialized, {}),
                                                     (baseline.kernels, baseline.materialized, {}))
    timed.add(baseline.fingerprint)
    search.tried.append(baseline)
    best = baseline
    genes = [proposal.key for proposal in search.proposals]
    singles = sorted((search.build(frozenset({gene})) for gene in genes), key=predicted)
    rng = random.Random(seed)
    steps = 0
    while time.perf_counter() < deadline and (max_steps is None or steps < max_steps):
        candidate = _next(singles, best, genes, rng, timed, search, predicted)
        if candidate is None:
            break
        timed.add(candidate.fingerprint)
        candidate.predicted_ms = predicted(candidate)
        steps += 1
        search.tried.append(candidate)
        if not verified(candidate):
            continue
        candidate.against_ms, candidate.ms = bench.confirm((best.kernels, best.materialized, {}),
                                              (candidate.kernels, candidate.materialized, {}))
        if candidate.ms < MARGIN * candidate.against_ms:
            best = candidate
    search.best = best
    search.seconds += time.perf_counter() - started
    return best


def _next(singles: list[Program], best: Program, genes: list[str], rng: random.Random, timed: set[str],
          search: ProgramSearch, predicted) -> Program | None:
    """The next program to time: the single-gene steps first (predicted fastest first), applied to
    the best genome so far; then random steps of one to three genes from it."""
    while singles:
        single = singles.pop(0)
        program = search.build(best.genes ^ single.genes)
        if program.fingerprint not in timed:
            return program
    if not genes:
        return None
    drawn = []
    for _ in range(RANDOM_TRIES):
        flips = rng.sample(genes, min(len(genes), rng.randint(1, 3)))
        program = search.build(best.genes ^ frozenset(flips))
        if program.fingerprint not in timed:
            drawn.append(program)
    return min(drawn, key=predicted) if drawn else None
