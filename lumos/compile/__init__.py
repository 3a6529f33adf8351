"""The tensor compiler: the Lumos model's forward as primitive ops, fused into native kernels.

The modules follow the pipeline: `ir` (ops, views, graph) → `hl_ops` (high-level ops written in
primitives) → `frontend` (torch.export → IR) → `interpret` (numpy reference) → `layout` →
`schedule` (fusion into kernels) → `plan` (buffers by liveness) → `render_c` (C source) →
`cache` (built libraries on disk) → `runtime` (one ctypes call) → `program` (the pass list) →
`engine` (compile, verify, store and load plans: the API of `lumos compile` and inference).

Any other module: `export_frontend.compile_module(module, example_inputs)`, or
`torch.compile(module, backend="lumos")` (`torch_backend`, registered when this package is imported).
"""

from lumos.compile.export_frontend import CompiledModule, compile_module
from lumos.compile.frontend import UnsupportedOp
from lumos.compile.torch_backend import lumos_backend, make_backend, register_backend

register_backend()

__all__ = ["CompiledModule", "UnsupportedOp", "compile_module", "lumos_backend", "make_backend"]
