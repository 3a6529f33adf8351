"""The CPU runtime: load a built library and run the whole graph with one ctypes call.

The call releases the GIL; the library's driver runs every kernel inside one OpenMP region.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from lumos.compile.plan import ALIGN


class NativeProgram:
    """A built library bound to its constant tensors and an arena, callable on named inputs."""

    def __init__(
        self,
        library: Path,
        inputs: list[tuple[str, tuple[int, ...]]],
        outputs: list[tuple[str, tuple[int, ...]]],
        tensors: list[np.ndarray],
        arena_bytes: int,
    ):
        self.library = ctypes.CDLL(str(library))
        self.forward = self.library.lumos_forward
        self.forward.argtypes = [ctypes.c_void_p] * 4
        self.forward.restype = None
        self.timed = self.library.lumos_forward_timed
        self.timed.argtypes = [ctypes.c_void_p] * 5
        self.timed.restype = None
        self.inputs, self.outputs = inputs, outputs
        self.tensors = [np.ascontiguousarray(t, dtype=np.float32) for t in tensors]  # kept alive here
        self.tensor_pointers = (ctypes.c_void_p * max(len(tensors), 1))(*[t.ctypes.data for t in self.tensors])
        raw = np.zeros(arena_bytes + ALIGN, np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self.arena = raw[start:start + arena_bytes]
        self._arena_raw = raw

    def __call__(self, named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(named)

    def kernel_seconds(self, named: Mapping[str, np.ndarray], kernels: int) -> np.ndarray:
        """Seconds each kernel took in one call (the driver's timed variant)."""
        times = np.zeros(kernels + 1, np.float64)
        self.run(named, times)
        return np.diff(times)

    def run(self, named: Mapping[str, np.ndarray], times: np.ndarray | None = None) -> dict[str, np.ndarray]:
        arrays = []
        for name, shape in self.inputs:
            array = np.ascontiguousarray(named[name], dtype=np.float32)
            if array.shape != shape:
                raise ValueError(f"input {name!r}: expected shape {shape}, got {array.shape}")
            arrays.append(array)
        results = [np.empty(shape, np.float32) for _, shape in self.outputs]
        input_pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        output_pointers = (ctypes.c_void_p * max(len(results), 1))(*[r.ctypes.data for r in results])
        if times is None:
            self.forward(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data)
        else:
            self.timed(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data, times.ctypes.data)
        return {name: result for (name, _), result in zip(self.outputs, results, strict=True)}
