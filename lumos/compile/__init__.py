"""The tensor compiler: the Lumos model's forward as primitive ops, fused into native kernels.

The modules follow the pipeline: `ir` (ops, views, graph) → `hl_ops` (high-level ops written in
primitives) → `frontend` (torch.export → IR) → `interpret` (numpy reference) → `layout` →
`schedule` (fusion into kernels) → `plan` (buffers by liveness) → `render_c` (C source) →
`cache` (built libraries on disk) → `runtime` (one ctypes call) → `program` (the pass list) →
`engine` (compile, verify, store and load plans: the API of `lumos compile` and inference).
"""
