"""The tensor compiler: the Lumos model's forward as primitive ops, fused into native kernels.

The modules follow the pipeline: `ir` (ops, views, graph) → `hl_ops` (high-level ops written in
primitives) → `frontend` (torch.export → IR) → `interpret` (numpy reference) → `layout` →
`schedule` (fusion into kernels) → `plan` (buffers by liveness) → `kernel_ir` + `lower` (each
kernel as loops and statements) → `kernel_passes` (layouts decided on the IR) → `render_c` /
`render_cuda` (printed, sharing `render_cstyle`) → `cache` (built libraries and PTX on disk;
`nvrtc` builds CUDA) → `runtime` / `cuda_runtime` (one call per program) → `program` /
`cuda_program` (the pass lists) → `engine` (compile, verify, store and load plans: the API of
`lumos compile` and inference; `verify`, `plan_store`, `compiled_model` and `cuda_engine` hold its parts).
"""
