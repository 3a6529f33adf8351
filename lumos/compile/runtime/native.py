"""The CPU runtime: load a built library and run the whole graph with one ctypes call.

The call releases the GIL; the library's driver runs every kernel inside one OpenMP region, on
as many threads as `torch.get_num_threads()` says.

Buffers stored in a half dtype (ir/graph.py: Storage) are passed and returned as numpy holds them
(`STORAGE_NUMPY`: bfloat16, which numpy lacks, as its 16 bits in uint16); a float32 array given
for one is rounded to it (nearest even), as torch's `.to` does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from lumos.compile.ir.graph import Storage
from lumos.compile.schedule.buffers import ALIGN

STORAGE_NUMPY = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}
"""The numpy dtype that holds each storage dtype (bfloat16: its bits)."""


def to_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` (float32, or already in storage form) as a contiguous array of `dtype`'s storage."""
    held = STORAGE_NUMPY[dtype]
    if np.asarray(array).dtype == held:
        return np.ascontiguousarray(array)
    if dtype == "bfloat16":  # numpy has no bfloat16: torch rounds it (to nearest even)
        wide = torch.from_numpy(np.ascontiguousarray(array, np.float32))
        return wide.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return np.ascontiguousarray(array, held)


def from_storage(array: np.ndarray, dtype: str) -> np.ndarray:
    """A stored array widened to float32 (exact)."""
    if dtype == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(array, np.float32)


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
        storage: Storage | None = None,
        tensor_names: list[str] | None = None,
    ):
        """`symbolic_batch`: inputs and outputs may have fewer rows than their shapes say;
        `storage`: the inputs, outputs and tensors (by `tensor_names`, in `tensors`' order) held in
        a half dtype."""
        self.library = ctypes.CDLL(str(library))
        self.forward = self.library.lumos_forward
        self.forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int]
        self.forward.restype = None
        self.timed = self.library.lumos_forward_timed
        self.timed.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self.timed.restype = None
        self.inputs, self.outputs, self.symbolic_batch = inputs, outputs, symbolic_batch
        storage = storage or Storage()
        self.input_dtypes = [storage.inputs.get(name, "float32") for name, _ in inputs]
        self.output_dtypes = [storage.outputs.get(name, "float32") for name, _ in outputs]
        names = tensor_names or [""] * len(tensors)
        self.tensors = [to_storage(t, storage.tensors.get(name, "float32"))  # kept alive here
                        for t, name in zip(tensors, names, strict=True)]
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
        arrays = [to_storage(named[name], dtype) for (name, _), dtype in zip(self.inputs, self.input_dtypes, strict=True)]
        rows = arrays[0].shape[0] if arrays else 0
        for array, (name, shape) in zip(arrays, self.inputs, strict=True):
            wanted = (rows, *shape[1:]) if self.symbolic_batch else shape
            if array.shape != wanted or (self.symbolic_batch and not 0 < rows <= shape[0]):
                raise ValueError(f"input {name!r}: expected shape {wanted} (rows 1..{shape[0]}), got {array.shape}")
        results = [np.empty((rows, *shape[1:]) if self.symbolic_batch else shape, STORAGE_NUMPY[dtype])
                   for (_, shape), dtype in zip(self.outputs, self.output_dtypes, strict=True)]
        threads = max(1, self.threads or torch.get_num_threads())
        input_pointers = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        output_pointers = (ctypes.c_void_p * max(len(results), 1))(*[r.ctypes.data for r in results])
        if times is None:
            self.forward(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data, rows, threads)
        else:
            self.timed(input_pointers, output_pointers, self.tensor_pointers, self.arena.ctypes.data, rows, threads,
                       times.ctypes.data)
        return {name: result for (name, _), result in zip(self.outputs, results, strict=True)}
