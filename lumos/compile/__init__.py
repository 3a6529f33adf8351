"""The tensor compiler: a model's forward as primitive ops, fused into native kernels.

The folders follow the pipeline:

    frontend/  PyTorch → IR (the Lumos model; any nn.Module; torch.compile's backend)
    ir/        primitive ops, views, graphs; high-level ops in primitives; the numpy reference
    egraph/    egglog rules and extraction: algebra, views, attention, fusion, schedules
    schedule/  layouts, merged linear layers, kernels (what is stored), buffers (the arena)
    search/    the measured hill-climb over schedules and fusions, its cost model and cache
    kernel/    the kernel IR, lowering into it, and its IR-to-IR passes
    render/    printers: C (CPU) and CUDA, sharing one C-style printer
    runtime/   the kernel cache (gcc, NVRTC) and the native calls (ctypes; pycuda or cuda.bindings)

and the driver beside them: `program` / `cuda_program` (the pass lists), `engine` (compile, verify,
store and load plans: the API of `lumos compile` and inference; `verify`, `plan_store`,
`compiled_model` and `cuda_engine` hold its parts).

Any other module: `frontend.export.compile_module(module, example_inputs)`, or
`torch.compile(module, backend="lumos")` (`frontend.torch_backend`, found by torch through the
`torch_dynamo_backends` entry point, so importing this package stays cheap).
"""

__all__ = ["CompiledModule", "UnsupportedOp", "compile_module", "lumos_backend", "make_backend"]

_EXPORTS = {
    "CompiledModule": "lumos.compile.frontend.export",
    "compile_module": "lumos.compile.frontend.export",
    "UnsupportedOp": "lumos.compile.frontend.lumos_model",
    "lumos_backend": "lumos.compile.frontend.torch_backend",
    "make_backend": "lumos.compile.frontend.torch_backend",
}


def __getattr__(name: str):
    # Imported on first use: torch_backend imports torch._dynamo (about 2 s), which `lumos infer`
    # and `lumos compile` do not need.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lumos.compile' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
