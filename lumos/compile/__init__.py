"""The search-based tensor compiler (primitive-op IR, e-graph rewrites, C/CUDA kernels): not built yet."""
