"""The CUDA target's kernels run on the CPU, for tests on machines without a GPU.

The generated CUDA C is compiled by g++ under a small prelude: `__shared__` arrays become static
(one block runs at a time, so its threads share them), each of a block's threads is a pthread with
its own `threadIdx`, `__syncthreads()` is a pthread barrier over the block, and a warp shuffle
writes the lane's value to its warp's row of an exchange array and reads its partner's between
two barriers over the warp (its 32 lanes, all of which shuffle together, as a GPU requires). Each
thread runs the same float32 code it runs on a GPU, so results match the interpreter at the same
tolerance; nothing here is timed, and a GPU's own behaviour (memory model, fast math) is not
emulated: test_cuda_gpu.py runs the same kernels on one. Buffers stored in a half dtype
(ir/graph.py: Storage) are passed as runtime/native.py holds them (bfloat16 as its bits); the
header's float16 conversions take F16C's instructions here (g++ -mf16c) for PTX's cvt.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np

from lumos.compile.compilation import Compilation
from lumos.compile.render.c import tensor_names
from lumos.compile.runtime.native import STORAGE_NUMPY, to_storage

PRELUDE = r"""
#include <cmath>
#include <math.h>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <immintrin.h>
#undef INFINITY
#undef NAN
struct lumos_dim3 { unsigned x, y, z; };
static thread_local lumos_dim3 threadIdx;
static thread_local int lumos_thread;  /* the thread's place in its block */
static lumos_dim3 blockIdx;
static pthread_barrier_t lumos_barrier, lumos_warp_barrier[32];
static float lumos_lanes[32][32];
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __restrict__ __restrict
#define __shared__ static
#define __syncthreads() pthread_barrier_wait(&lumos_barrier)
static inline float __int_as_float(int bits) { float f; memcpy(&f, &bits, sizeof f); return f; }
static inline float __uint_as_float(unsigned bits) { float f; memcpy(&f, &bits, sizeof f); return f; }
static inline unsigned __float_as_uint(float f) { unsigned bits; memcpy(&bits, &f, sizeof bits); return bits; }
/* A buffer's address, given to a kernel parameter of any pointer type (float, or a half storage type). */
struct lumos_any { void* p; template <class T> operator T*() const { return (T*)p; } };
static inline float __shfl_xor_sync(unsigned, float value, int offset) {
  const int warp = lumos_thread / 32, lane = lumos_thread % 32;
  lumos_lanes[warp][lane] = value;
  pthread_barrier_wait(&lumos_warp_barrier[warp]);
  const float other = lumos_lanes[warp][lane ^ offset];
  pthread_barrier_wait(&lumos_warp_barrier[warp]);
  return other;
}
"""

DRIVER = r"""
struct lumos_args_{name} {{ int n; void** pointers; unsigned x, y; int t; }};
static void* lumos_thread_{name}(void* raw) {{
  lumos_args_{name}* args = (lumos_args_{name}*) raw;
  threadIdx.x = args->x; threadIdx.y = args->y; threadIdx.z = 0;
  lumos_thread = args->t;
  void** p = args->pointers;
  {name}(args->n, {arguments});
  return 0;
}}
extern "C" void run_{name}(int n, int blocks, int bx, int by, void** pointers) {{
  const int threads = bx * by;
  pthread_t* ids = (pthread_t*) malloc(sizeof(pthread_t) * threads);
  lumos_args_{name}* args = (lumos_args_{name}*) malloc(sizeof(lumos_args_{name}) * threads);
  pthread_barrier_init(&lumos_barrier, 0, threads);
  for (int w = 0; w < threads / 32; w++) pthread_barrier_init(&lumos_warp_barrier[w], 0, 32);
  for (int b = 0; b < blocks; b++) {{
    blockIdx.x = b; blockIdx.y = 0; blockIdx.z = 0;
    for (int t = 0; t < threads; t++) {{
      args[t].n = n; args[t].pointers = pointers; args[t].x = t % bx; args[t].y = t / bx; args[t].t = t;
      pthread_create(&ids[t], 0, lumos_thread_{name}, &args[t]);
    }}
    for (int t = 0; t < threads; t++) pthread_join(ids[t], 0);
  }}
  pthread_barrier_destroy(&lumos_barrier);
  for (int w = 0; w < threads / 32; w++) pthread_barrier_destroy(&lumos_warp_barrier[w]);
  free(ids); free(args);
}}
"""


def run_on_cpu(compilation: Compilation, inputs: dict[str, np.ndarray], folder: Path) -> dict[str, np.ndarray]:
    """The CUDA program of `compilation` run on the CPU: its outputs by name. With a symbolic
    batch, the row count is the inputs' first dim (as runtime/cuda.py's GpuProgram takes it)."""
    graph, program = compilation.graph, compilation.cuda
    drivers = []
    for launch in program.launches:
        arguments = ", ".join(f"lumos_any{{p[{position}]}}" for position in range(len(launch.buffers)))
        drivers.append(DRIVER.format(name=launch.name, arguments=arguments))
    source = folder / "program.cpp"
    source.write_text(PRELUDE + program.source + "\n".join(drivers))
    library = folder / "program.so"
    subprocess.run(["g++", "-O1", "-w", "-mf16c", "-shared", "-fPIC", "-pthread", str(source), "-o", str(library)],
                   check=True)
    native = ctypes.CDLL(str(library))

    storage = graph.storage
    given = [to_storage(inputs[name], storage.inputs.get(name, "float32")) for name in graph.inputs]
    rows = given[0].shape[0] if graph.batch is not None else 1
    outputs = [np.zeros((rows, *node.shape[1:]) if graph.batch is not None else node.shape,
                        STORAGE_NUMPY[storage.outputs.get(name, "float32")]) for name, node in graph.outputs.items()]
    tensors = [to_storage(graph.tensors[name], storage.tensors.get(name, "float32")) for name in tensor_names(graph)]
    arena = np.zeros(compilation.buffers.arena_bytes // 4 + 1, np.float32)
    arrays = {"input": given, "output": outputs, "tensor": tensors}

    def pointer(kind: str, index: int) -> int:
        if kind == "arena":
            return arena.ctypes.data + index
        return arrays[kind][index].ctypes.data

    for launch in program.launches:
        assert launch.block[0] * launch.block[1] % 32 == 0 and launch.block[2] == 1, launch
        pointers = (ctypes.c_void_p * len(launch.buffers))(*(pointer(*where) for where in launch.buffers))
        run = getattr(native, f"run_{launch.name}")
        run(ctypes.c_int(rows), ctypes.c_int(launch.grid(rows)), ctypes.c_int(launch.block[0]),
            ctypes.c_int(launch.block[1]), pointers)
    return dict(zip(graph.outputs, outputs, strict=True))
