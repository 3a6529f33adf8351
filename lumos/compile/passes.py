"""The passes, each a step from a primitive graph towards a built program.

Each takes the `Compilation` it fills in and the kernel cache; a target (target.py) lists the
ones it runs, in order. Most serve every target; rendering and building are one pass per target.
"""

from __future__ import annotations

from collections.abc import Callable

from lumos.compile.compilation import Compilation, Options
from lumos.compile.egraph.attention import find_attention, fuse_attention
from lumos.compile.egraph.programs import product_proposals
from lumos.compile.egraph.rewrite import rewrite_graph
from lumos.compile.ir.graph import own_half_outputs
from lumos.compile.kernel.lower import reads_siblings_in_place
from lumos.compile.render.c import render_library
from lumos.compile.render.cuda import joins_as_tiles, render_program
from lumos.compile.runtime.kernel_cache import KernelCache, Toolchain, gcc
from lumos.compile.runtime.nvrtc import nvrtc_toolchain
from lumos.compile.schedule.buffers import plan_buffers
from lumos.compile.schedule.horizontal import fuse_linear_layers
from lumos.compile.schedule.kernels import schedule
from lumos.compile.schedule.layout import transpose_activations, transpose_weights
from lumos.compile.schedule.products import join_products
from lumos.compile.schedule.siblings import join_siblings
from lumos.compile.search.cache import SearchCache
from lumos.compile.search.climb import Bench, random_inputs, search_schedules
from lumos.compile.search.genome import climb_programs, proposals_report, propose

Pass = Callable[[Compilation, KernelCache], None]


def rewrite(c: Compilation, cache: KernelCache) -> None:
    if c.options.rewrite:
        c.rewrite = rewrite_graph(c.graph)


def horizontal(c: Compilation, cache: KernelCache) -> None:
    c.matmuls_merged = fuse_linear_layers(c.graph) if c.options.fuse_linear_layers else 0


def layout(c: Compilation, cache: KernelCache) -> None:
    if c.options.transpose_weights:
        transpose_weights(c.graph)
    if c.options.transpose_activations:
        transpose_activations(c.graph)


def half_outputs(c: Compilation, cache: KernelCache) -> None:
    own_half_outputs(c.graph)


def fuse(c: Compilation, cache: KernelCache) -> None:
    c.kernels, c.materialized = schedule(c.graph, c.options.recompute_cheap)


def programs(c: Compilation, cache: KernelCache) -> None:
    """Options.egraph_fusion: the e-graph's proposals, and (with a budget) the program the climb
    over them keeps; its sibling joins wait for the siblings pass."""
    if not c.options.egraph_fusion or not c.kernels:
        return
    found = propose(c.graph, c.options.recompute_cheap)
    c.programs = found.report()
    if c.options.search_budget_s <= 0:
        return
    store = SearchCache(cache, c.options.cc, c.options.cflags) if c.options.search_cache else None
    key = "programs:" + found.fingerprint()
    cached = store.get_decision(key) if store is not None else None
    if cached is not None:  # the genome kept here before, for the same proposals on this machine
        genes, c.programs = frozenset(cached["genes"]), {**cached["report"], "cached": True}
    else:
        inputs = c.example_inputs if c.example_inputs is not None else random_inputs(c.graph, c.options.search_seed)
        bench = Bench(c.graph, {kernel.node for kernel in c.kernels}, inputs, cache, c.options.cc, c.options.cflags)
        genes = climb_programs(found, bench, PROGRAM_SHARE * c.options.search_budget_s, c.options.search_seed).genes
        c.programs = found.report()
        if store is not None:
            store.put_decision(key, {"genes": sorted(genes), "report": c.programs})
    unjoined = found.build(genes, join=False)
    c.kernels, c.materialized = unjoined.kernels, unjoined.materialized
    c.joins = found.pairs(genes)


PROGRAM_SHARE = 0.25
"""The part of the search budget the climb over the e-graph's programs takes (Options.egraph_fusion)."""


def search(c: Compilation, cache: KernelCache) -> None:
    if c.options.search_budget_s <= 0 or not c.kernels:
        return
    store = SearchCache(cache, c.options.cc, c.options.cflags) if c.options.search_cache else None
    budget = c.options.search_budget_s * (1 - PROGRAM_SHARE if c.programs is not None else 1)
    c.search = search_schedules(c.graph, c.kernels, c.materialized, cache, c.options.cc, c.options.cflags,
                                budget, c.example_inputs, store, c.options.search_seed,
                                register_blocks=c.options.register_blocks)
    c.schedules = c.search.schedules
    c.kernels, c.materialized = c.search.kernels, c.search.materialized


def siblings(c: Compilation, cache: KernelCache) -> None:
    if c.joins:  # the genome's pairs (Options.egraph_fusion)
        c.kernels, changed = join_siblings(c.kernels, lambda kernel: reads_siblings_in_place(kernel, c.materialized),
                                           allowed=lambda earlier, later: (earlier.node, later.node) in c.joins)
    elif c.options.multi_output:
        c.kernels, changed = join_siblings(c.kernels, lambda kernel: reads_siblings_in_place(kernel, c.materialized))
    else:
        return
    kept = {kernel.name for kernel in c.kernels} - set(changed)  # a joined kernel: the default schedule
    c.schedules = {name: schedule for name, schedule in c.schedules.items() if name in kept}


def attention(c: Compilation, cache: KernelCache) -> None:
    c.attention = 0
    if not c.options.fuse_attention:
        return
    matches, _ = find_attention(c.graph)
    if matches:
        c.kernels, c.materialized, used = fuse_attention(c.graph, c.materialized, matches)
        c.attention = len(used)


def products(c: Compilation, cache: KernelCache) -> None:
    """The products rule's proposals (egraph/programs.py), each a gene; with Options.join_products
    every gene is kept (nothing is timed on this target yet) and its pairs joined."""
    proposals, fired = product_proposals(c.kernels)
    kept = proposals if c.options.join_products else []
    c.programs = proposals_report(proposals, frozenset(p.key for p in kept), fired)
    pairs = {pair for proposal in kept for pair in proposal.pairs}
    c.kernels, c.products_joined = join_products(c.kernels, pairs, lambda kernel: joins_as_tiles(kernel, c.materialized))


def buffers(c: Compilation, cache: KernelCache) -> None:
    c.buffers = plan_buffers(c.graph, c.kernels, c.options.reuse_buffers)


def render_c(c: Compilation, cache: KernelCache) -> None:
    c.source = render_library(c.graph, c.kernels, c.materialized, c.buffers, c.schedules)


def render_cuda(c: Compilation, cache: KernelCache) -> None:
    c.cuda = render_program(c.graph, c.kernels, c.materialized, c.buffers)
    c.source = c.cuda.source


def c_toolchain(options: Options) -> Toolchain:
    return gcc(options.cc, options.cflags)


def cuda_toolchain(options: Options) -> Toolchain:
    return nvrtc_toolchain(options.arch)


def build_c(c: Compilation, cache: KernelCache) -> None:
    c.build = cache.build(c.source, c_toolchain(c.options))


def build_cuda(c: Compilation, cache: KernelCache) -> None:
    c.build = cache.build(c.source, cuda_toolchain(c.options))
