"""The CUDA runtime: load the PTX, bind buffers, run the whole program with one host call.

Buffers are torch CUDA tensors (their pointers are passed), so inputs and outputs never leave
the GPU. Kernels launch in order on one stream; the first call at a row count runs them eagerly
(and so JIT-loads everything), then the sequence is captured as a CUDA graph for that row count,
and every later call is one graph replay. Times come from CUDA events.

Launching goes through pycuda (the `cuda` extra) when it imports, else through
`cuda.bindings.driver` (which comes with cuda-bindings, NVRTC's binding): pycuda is source-only
on the registry and needs the CUDA headers to build, and a runtime that cannot start is worse
than one with a second binding. Both use the device's primary context, which torch uses too.

Not yet run on a GPU: the tests that exercise it are marked `gpu`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from lumos.compile.ir.graph import Storage
from lumos.compile.render.cuda import Launch
from lumos.compile.schedule.buffers import ALIGN
from lumos.core.errors import LumosError


class CudaRuntimeError(LumosError):
    """A CUDA driver call failed, or no GPU is there to run on."""


def gpu_arch(device: int | None = None) -> str | None:
    """The GPU's architecture as sm_XY, or None when torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


class PycudaLauncher:
    name = "pycuda"

    def __init__(self, ptx: bytes, device: int):
        import pycuda.driver as driver

        driver.init()
        self.driver = driver
        self.context = driver.Device(device).retain_primary_context()
        self.context.push()
        self.module = driver.module_from_buffer(ptx)
        self.stream = driver.Stream()
        self.torch_stream = torch.cuda.ExternalStream(self.stream.handle, device=device)

    def function(self, name: str):
        return self.module.get_function(name)

    def launch(self, function, grid: int, block: tuple[int, int, int], n: int, pointers: list[int]) -> None:
        function(np.int32(n), *(np.uintp(p) for p in pointers), grid=(grid, 1, 1), block=block, stream=self.stream)


class DriverLauncher:
    name = "cuda.bindings.driver"

    def __init__(self, ptx: bytes, device: int):
        from cuda.bindings import driver

        self.driver = driver
        self._check(driver.cuInit(0), "cuInit")
        handle = self._check(driver.cuDeviceGet(device), "cuDeviceGet")
        context = self._check(driver.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
        self._check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        self.module = self._check(driver.cuModuleLoadData(ptx), "cuModuleLoadData")
        self.torch_stream = torch.cuda.Stream(device=device)
        self.stream = driver.CUstream(self.torch_stream.cuda_stream)

    def _check(self, result, what: str):
        error, *values = result if isinstance(result, tuple) else (result,)
        if error != self.driver.CUresult.CUDA_SUCCESS:
            _, message = self.driver.cuGetErrorString(error)
            raise CudaRuntimeError(f"{what} failed: {message.decode() if isinstance(message, bytes) else message}")
        return values[0] if len(values) == 1 else values

    def function(self, name: str):
        return self._check(self.driver.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")

    def launch(self, function, grid: int, block: tuple[int, int, int], n: int, pointers: list[int]) -> None:
        params = ((n, *pointers), (ctypes.c_int, *[ctypes.c_void_p] * len(pointers)))
        self._check(self.driver.cuLaunchKernel(function, grid, 1, 1, *block, 0, self.stream, params, 0), "cuLaunchKernel")


def launcher(ptx: bytes, device: int):
    """pycuda where it imports, else cuda.bindings.driver (see the module docstring)."""
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        return DriverLauncher(ptx, device)
    return PycudaLauncher(ptx, device)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class GpuProgram:
    """The built PTX bound to its constant tensors and an arena on the GPU, callable on named
    CUDA tensors (float32, or the half dtype `storage` gives an input or output; inputs of `rows`
    ≤ the traced batch rows when the batch is symbolic)."""

    def __init__(self, ptx: bytes, launches: list[Launch], inputs: list[tuple[str, tuple[int, ...]]],
                 outputs: list[tuple[str, tuple[int, ...]]], tensors: list[np.ndarray], arena_bytes: int,
                 symbolic_batch: bool, device: int = 0, storage: Storage | None = None,
                 tensor_names: list[str] | None = None):
        """`storage`: the inputs, outputs and tensors (by `tensor_names`, in `tensors`' order) held
        in a half dtype (float32 values given for a half tensor are rounded to it)."""
        if not torch.cuda.is_available():
            raise CudaRuntimeError("no CUDA GPU: the CUDA runtime needs one (lumos doctor shows what it finds)")
        self.device = torch.device("cuda", device)
        torch.cuda.init()
        self.launcher = launcher(ptx, device)
        self.launches, self.inputs, self.outputs, self.symbolic_batch = launches, inputs, outputs, symbolic_batch
        self.functions = [self.launcher.function(launch.name) for launch in launches]
        storage = storage or Storage()
        self.input_dtypes = [TORCH_DTYPES[storage.inputs.get(name, "float32")] for name, _ in inputs]
        self.output_dtypes = [TORCH_DTYPES[storage.outputs.get(name, "float32")] for name, _ in outputs]
        names = tensor_names or [""] * len(tensors)
        self.tensors = [torch.from_numpy(np.ascontiguousarray(t, np.float32))
                        .to(self.device, TORCH_DTYPES[storage.tensors.get(name, "float32")])
                        for t, name in zip(tensors, names, strict=True)]
        raw = torch.empty(arena_bytes + ALIGN, dtype=torch.uint8, device=self.device)
        self._arena_raw = raw
        self.arena = raw.data_ptr() + (-raw.data_ptr()) % ALIGN
        self.captured: dict[int, _Captured] = {}

    def _pointer(self, where: tuple[str, int], inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
        kind, index = where
        if kind == "input":
            return inputs[index].data_ptr()
        if kind == "output":
            return outputs[index].data_ptr()
        if kind == "tensor":
            return self.tensors[index].data_ptr()
        return self.arena + index

    def _launch_all(self, rows: int, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        for launch, function in zip(self.launches, self.functions, strict=True):
            pointers = [self._pointer(where, inputs, outputs) for where in launch.buffers]
            self.launcher.launch(function, launch.grid(rows), launch.block, rows, pointers)

    def _shapes(self, rows: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        def fit(shape):
            return (rows, *shape[1:]) if self.symbolic_batch else shape
        return [fit(shape) for _, shape in self.inputs], [fit(shape) for _, shape in self.outputs]

    def _capture(self, rows: int) -> _Captured:
        """Static buffers for this row count, one eager run, then the CUDA graph of the launches."""
        input_shapes, output_shapes = self._shapes(rows)
        inputs = [torch.zeros(shape, dtype=dtype, device=self.device)
                  for shape, dtype in zip(input_shapes, self.input_dtypes, strict=True)]
        outputs = [torch.empty(shape, dtype=dtype, device=self.device)
                   for shape, dtype in zip(output_shapes, self.output_dtypes, strict=True)]
        stream = self.launcher.torch_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._launch_all(rows, inputs, outputs)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self._launch_all(rows, inputs, outputs)
        return _Captured(graph, inputs, outputs)

    def __call__(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        arrays = [named[name] for name, _ in self.inputs]
        rows = arrays[0].shape[0] if arrays else 1
        expected, _ = self._shapes(rows)
        for array, (name, shape), wanted in zip(arrays, self.inputs, expected, strict=True):
            if tuple(array.shape) != tuple(wanted) or (self.symbolic_batch and not 0 < rows <= shape[0]):
                raise ValueError(f"input {name!r}: expected shape {wanted} (rows 1..{shape[0]}), got {tuple(array.shape)}")
        if rows not in self.captured:
            self.captured[rows] = self._capture(rows)
        captured = self.captured[rows]
        stream = self.launcher.torch_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for static, array in zip(captured.inputs, arrays, strict=True):
                static.copy_(array.to(self.device, static.dtype), non_blocking=True)
            captured.graph.replay()  # the whole program: one host call
            results = [output.clone() for output in captured.outputs]
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return {name: result for (name, _), result in zip(self.outputs, results, strict=True)}

    def time_ms(self, named: Mapping[str, torch.Tensor], repeats: int = 10) -> float:
        """Median milliseconds of one graph replay (inputs already on the GPU), by CUDA events."""
        self(named)  # capture
        rows = next(iter(named.values())).shape[0]
        captured = self.captured[rows]
        stream = self.launcher.torch_stream
        times = []
        with torch.cuda.stream(stream):
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                captured.graph.replay()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end))
        return float(np.median(times))
