"""egglog encodings of the IR and the rewrite rules, one named ruleset per file.

- `schedule`: loop-nest variants of one kernel (swap, tile, parallelize, unroll, vectorize),
  every one extracted as a candidate for search.py to measure.
"""
