"""The tensor compiler: the Lumos model's forward as primitive ops, fused into native kernels.

The modules follow the pipeline: `ir` (ops, views, graph) → `hl_ops` (high-level ops written in
primitives) → `frontend` (torch.export → IR) → `interpret` (numpy reference) → `layout` →
`schedule` (fusion into kernels) → `plan` (buffers by liveness) → `kernel_ir` + `lower` (each
kernel as loops and statements) → `kernel_passes` (layouts decided on the IR) → `render_c` /
`render_cuda` (printed, sharing `render_cstyle`) → `cache` (built libraries and PTX on disk;
`nvrtc` builds CUDA) → `runtime` / `cuda_runtime` (one call per program) → `program` /
`cuda_program` (the pass lists) → `engine` (compile, verify, store and load plans: the API of
`lumos compile` and inference; `verify`, `plan_store`, `compiled_model` and `cuda_engine` hold its parts).

Any other module: `export_frontend.compile_module(module, example_inputs)`, or
`torch.compile(module, backend="lumos")` (`torch_backend`, found by torch through the
`torch_dynamo_backends` entry point, so importing this package stays cheap).
"""

__all__ = ["CompiledModule", "UnsupportedOp", "compile_module", "lumos_backend", "make_backend"]

_EXPORTS = {
    "CompiledModule": "lumos.compile.export_frontend",
    "compile_module": "lumos.compile.export_frontend",
    "UnsupportedOp": "lumos.compile.frontend",
    "lumos_backend": "lumos.compile.torch_backend",
    "make_backend": "lumos.compile.torch_backend",
}


def __getattr__(name: str):
    # Imported on first use: torch_backend imports torch._dynamo (about 2 s), which `lumos infer`
    # and `lumos compile` do not need.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lumos.compile' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
