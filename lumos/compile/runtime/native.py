"""The CPU runtime: load a built library and run the whole graph with one ctypes call.

The call releases the GIL; the library's driver runs every kernel inside one OpenMP region, on
as many threads as `torch.get_num_threads()` says.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from lumos.compile.schedule.buffers import ALIGN


class NativeProgram:
    """A built library bound to its constant tensors and an arena, callable on named inputs."""

    def __init__(
        self,
        library: Path,
        inputs: list[tuple[str, tuple[int, ...]]],
        outputs: list[tuple[str, tuple[int, ...]]],
        tensors: list[np.ndarray],
        arena_bytes: int,
        symbolic_batch: bool = False,
    ):
        """`symbolic_batch`: inputs and outputs may have fewer rows than their shapes say."""
        self.library = ctypes.CDLL(str(library))
        self.forward = self.library.lumos_forward
        self.forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int]
        self.forward.restype = None
        self.timed = self.library.lumos_forward_timed
        self.timed.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self.timed.restype = None
        self.inputs, self.outputs, self.symbolic_batch = inputs, outputs, symbolic_batch
        self.tensors = [np.ascontiguousarray(t, dtype=np.float32) for t in tensors]  # kept alive here
        self.tensor_pointers = (ctypes.c_void_p * max(len(tensors), 1))(*[t.ctypes.data for t in self.tensors])
        raw = np.zeros(arena_bytes + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self.arena = raw[start:start + arena_bytes]
        self._arena_raw = raw
        self.threads: int | None = None
        """OpenMP threads per call; None: as many as torch.get_num_threads() (a Spark task sets
        that to its share of the cores)."""

    def __call__(self, named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(named)

    def kernel_seconds(self, named: Mapping[str, np.ndarray], kernels: int) -> np.ndarray:
        """Seconds each kernel took in one call (the driver's timed variant)."""
        times = np.zeros(kernels + 1, np.float64)
        self.run(named, times)
        return np.diff(times)

    def run(self, named: Mapping[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        arrays = [np.ascontiguousarray(named[name], dtype=np.float32) for name, _ in self.inputs]
        rows = arrays[0].shape[0] if arrays else 0
        for array, (name, shape) in zip(arrays, self.inputs, strict=True):
            wanted = (rows, *shape[1:]) if self.symbolic_batch else shape
            if array.shape != wanted or (self.symbolic_batch and not 0 < rows <= shape[0]):
                raise ValueError(f"input {name!r}: expected shape {wanted} (rows 1..{shape[0]}), got {array.shape}")
        results = [np.empty((rows, *shape[1:]) if self.symbolic_batch else shape, np.float32) for _, shape in self.outputs]
        threads = max(1, self.threads or torch.get_num_threads())
        input_pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        output_pointers = (ctypes.c_void_p * max(len(results), 1))(*[r.ctypes.data for r in results])
        if times is None:
            self.forward(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data, rows, threads)
        else:
            self.timed(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data, rows, threads,
                       times.ctypes.data)
        return {name: result for (name, _), result in zip(self.outputs, results, strict=True)}
