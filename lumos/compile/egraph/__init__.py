"""egglog encodings of the program and the rewrite rules, one named ruleset per file.

- `terms`: the IR as egglog terms (every operand a view of its source, views as opaque ids with
  facts asserted from Python);
- `extract`: the cheapest program of an e-graph under a cost, back as a graph, with the buffers
  its `store`s keep;
- `rewrite`: the compiler's e-graph pass (program.py): algebra and views over the whole graph;
- `algebra`: x·1, x+0, exp2(log2 x), recip(recip x), constant folding, distributivity;
- `views`: composition of movement ops (a view of a view is one view; identity views vanish);
- `fusion`: a buffer's producer inlined into its consumer (prologues and epilogues); every
  buffer stored or inlined in one e-graph, a program one extraction (search.py climbs over them);
- `programs`: fusion from no fusion at all (every node a `store`; fuse producer into consumer,
  recompute instead of store, under the scheduler's legality as facts), and sibling kernels and
  matrix products of one value (CUDA: one tiled matmul with an output each) by rules over
  kernel-level facts; the scheduler's program one extraction of several, the others proposals for
  search/genome.py's climb (Options.egraph_fusion);
- `schedule`: the loop-nest variants of one kernel, every one extracted for search.py to measure;
- `attention`: softmax by the max-rescaling identity and online softmax: a fused attention kernel
  that never stores its score matrix (offered to search.py, kept if verified and faster).

Each ruleset is tested to preserve semantics: the interpreter on random inputs, before and after.
"""
