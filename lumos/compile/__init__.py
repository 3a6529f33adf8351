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

and the driver beside them, one module each for every target (each imports only the ones listed before it):

    compilation   Options and the Compilation the passes fill in
    passes        each pass: e-graph, horizontal, layout, schedule, search, attention, buffers, render, build
    target        the Target record (passes, toolchain, runtime loader, tolerance, plan fields): CPU and CUDA
    program       compile_graph(graph, cache, options, target=...): a target's passes in order; load_program
    result        CompileResult: a built, loaded model with its compilation and plan
    verify        the compiled model against eager PyTorch on the target's device; timing
    plan_store    plans written, logged on the training run and loaded back
    engine        compile_model, compile_run (`lumos compile`), load_compiled (inference)

(`compiled_model` calls a loaded program like `LumosModel.forward`: CPU or GPU.)

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
