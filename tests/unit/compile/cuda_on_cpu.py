"""The CUDA target's kernels run on the CPU, for tests on machines without a GPU.

The generated CUDA C is compiled by g++ under a small prelude: `__shared__` arrays become static
(one block runs at a time, so its threads share them), each of a block's threads is a pthread with
its own `threadIdx`, and `__syncthreads()` is a pthread barrier. That is CUDA's semantics for the
kernels without warp shuffles (elementwise and tiled frames): each thread's arithmetic is the
same float32 code, and a barrier orders the shared tiles' writes and reads as on a GPU. Kernels that
shuffle across a warp (warp, block and attention frames) abort here; test those on a GPU
(test_cuda_gpu.py).
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np

from lumos.compile.compilation import Compilation
from lumos.compile.render.c import tensor_names

PRELUDE = r"""
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#undef INFINITY
#undef NAN
struct lumos_dim3 { unsigned x, y, z; };
static thread_local lumos_dim3 threadIdx;
static lumos_dim3 blockIdx;
static pthread_barrier_t lumos_barrier;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __restrict__ __restrict
#define __shared__ static
#define __syncthreads() pthread_barrier_wait(&lumos_barrier)
static inline float __int_as_float(int bits) { float f; memcpy(&f, &bits, sizeof f); return f; }
static inline float __shfl_xor_sync(unsigned, float, int) { abort(); }  /* warp frames: GPU only */
"""

DRIVER = r"""
struct lumos_args_{name} {{ int n; float** pointers; unsigned x, y; }};
static void* lumos_thread_{name}(void* raw) {{
  lumos_args_{name}* args = (lumos_args_{name}*) raw;
  threadIdx.x = args->x; threadIdx.y = args->y; threadIdx.z = 0;
  float** p = args->pointers;
  {name}(args->n, {arguments});
  return 0;
}}
extern "C" void run_{name}(int n, int blocks, int bx, int by, float** pointers) {{
  const int threads = bx * by;
  pthread_t* ids = (pthread_t*) malloc(sizeof(pthread_t) * threads);
  lumos_args_{name}* args = (lumos_args_{name}*) malloc(sizeof(lumos_args_{name}) * threads);
  pthread_barrier_init(&lumos_barrier, 0, threads);
  for (int b = 0; b < blocks; b++) {{
    blockIdx.x = b; blockIdx.y = 0; blockIdx.z = 0;
    for (int t = 0; t < threads; t++) {{
      args[t].n = n; args[t].pointers = pointers; args[t].x = t % bx; args[t].y = t / bx;
      pthread_create(&ids[t], 0, lumos_thread_{name}, &args[t]);
    }}
    for (int t = 0; t < threads; t++) pthread_join(ids[t], 0);
  }}
  pthread_barrier_destroy(&lumos_barrier);
  free(ids); free(args);
}}
"""


def run_on_cpu(compilation: Compilation, inputs: dict[str, np.ndarray], folder: Path) -> dict[str, np.ndarray]:
    """The CUDA program of `compilation` run on the CPU: its outputs by name. With a symbolic
    batch, the row count is the inputs' first dim (as runtime/cuda.py's GpuProgram takes it)."""
    graph, program = compilation.graph, compilation.cuda
    drivers = []
    for launch in program.launches:
        arguments = ", ".join(f"p[{position}]" for position in range(len(launch.buffers)))
        drivers.append(DRIVER.format(name=launch.name, arguments=arguments))
    source = folder / "program.cpp"
    source.write_text(PRELUDE + program.source + "\n".join(drivers))
    library = folder / "program.so"
    subprocess.run(["g++", "-O1", "-w", "-shared", "-fPIC", "-pthread", str(source), "-o", str(library)], check=True)
    native = ctypes.CDLL(str(library))

    given = [np.ascontiguousarray(inputs[name], np.float32) for name in graph.inputs]
    rows = given[0].shape[0] if graph.batch is not None else 1
    outputs = [np.zeros((rows, *node.shape[1:]) if graph.batch is not None else node.shape, np.float32)
               for node in graph.outputs.values()]
    tensors = [np.ascontiguousarray(graph.tensors[name], np.float32) for name in tensor_names(graph)]
    arena = np.zeros(compilation.buffers.arena_bytes // 4 + 1, np.float32)
    arrays = {"input": given, "output": outputs, "tensor": tensors}

    def pointer(kind: str, index: int) -> int:
        if kind == "arena":
            return arena.ctypes.data + index
        return arrays[kind][index].ctypes.data

    for launch in program.launches:
        pointers = (ctypes.c_void_p * len(launch.buffers))(*(pointer(*where) for where in launch.buffers))
        run = getattr(native, f"run_{launch.name}")
        run(ctypes.c_int(rows), ctypes.c_int(launch.grid(rows)), ctypes.c_int(launch.block[0]),
            ctypes.c_int(launch.block[1]), pointers)
    return dict(zip(graph.outputs, outputs, strict=True))
