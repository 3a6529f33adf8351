"""Building CUDA C with NVRTC (`cuda.bindings.nvrtc`), which needs no GPU and no CUDA toolkit.

`compile_cuda(source, arch)` returns the PTX (`arch` "sm_90" or "compute_90") or the cubin
(`cubin=True`, only for a real "sm_XX"); a compile error raises CudaBuildError with NVRTC's log.
The `nvidia-cuda-nvrtc` wheel (a torch dependency) provides the library and `cuda-bindings` the
Python binding; both are in the `cuda` extra.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from lumos.compile.runtime.kernel_cache import Toolchain
from lumos.core.errors import LumosError, UsageError

FLAGS = ("--std=c++17", "--fmad=true")
"""NVRTC options besides the architecture: IEEE float math (no --use_fast_math), as the C target has,
so that the GPU plan can be verified against torch at 1e-4."""


PTX_FILE = "kernels.ptx"
SOURCE_FILE = "kernels.cu"


class CudaBuildError(LumosError):
    """NVRTC rejected generated CUDA C."""


@dataclass(frozen=True)
class PTX:
    arch: str
    code: bytes
    """PTX text (or a cubin when built with cubin=True), as NVRTC returns it."""
    log: str


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise UsageError("the CUDA target needs NVRTC's Python binding: pip install 'lumos[cuda]' "
                         "(cuda-bindings and nvidia-cuda-nvrtc)") from None
    return nvrtc


def _check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, message = nvrtc.nvrtcGetErrorString(result)
        raise CudaBuildError(f"NVRTC {what}: {message.decode() if isinstance(message, bytes) else message}")


@functools.cache
def nvrtc_version() -> str:
    """NVRTC's version, as "13.2"; raises UsageError when NVRTC is missing."""
    nvrtc = _nvrtc()
    try:
        result, major, minor = nvrtc.nvrtcVersion()
    except RuntimeError as error:  # the binding loads libnvrtc lazily
        raise UsageError(f"NVRTC does not load ({error}); pip install nvidia-cuda-nvrtc") from None
    _check(result, "version")
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    result, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(result, "supported architectures")
    return tuple(archs)


def compile_cuda(source: str, arch: str, flags: tuple[str, ...] = FLAGS, name: str = "lumos.cu",
                 cubin: bool = False) -> PTX:
    """`source` compiled for `arch` ("sm_80", "sm_90", …)."""
    nvrtc = _nvrtc()
    if not arch.startswith(("sm_", "compute_")) or not arch.split("_", 1)[1].rstrip("a").isdigit():
        raise UsageError(f"CUDA architecture {arch!r}: expected sm_XX (e.g. sm_90)")
    result, program = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(result, "create program")
    try:
        target = arch if cubin else arch.replace("sm_", "compute_")
        options = [f"--gpu-architecture={target}".encode(), *(flag.encode() for flag in flags)]
        (compiled,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        result, size = nvrtc.nvrtcGetProgramLogSize(program)
        _check(result, "log size")
        log = _writable(size)
        (result,) = nvrtc.nvrtcGetProgramLog(program, log)
        log_text = log.rstrip(b"\0 ").decode(errors="replace")
        if compiled != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CudaBuildError(f"NVRTC could not compile {name} for {arch}:\n{log_text[-4000:]}")
        if cubin:
            result, size = nvrtc.nvrtcGetCUBINSize(program)
            _check(result, "cubin size")
            code = _writable(size)
            (result,) = nvrtc.nvrtcGetCUBIN(program, code)
        else:
            result, size = nvrtc.nvrtcGetPTXSize(program)
            _check(result, "PTX size")
            code = _writable(size)
            (result,) = nvrtc.nvrtcGetPTX(program, code)
        _check(result, "output")
        return PTX(arch, code[:size], log_text)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def nvrtc_toolchain(arch: str, flags: tuple[str, ...] = FLAGS) -> Toolchain:
    """The CUDA target's toolchain: PTX for `arch`; the key holds NVRTC's version, `arch` and `flags`."""
    version = nvrtc_version()
    return Toolchain(f"NVRTC {version} for {arch}", {"nvrtc": version, "arch": arch, "flags": list(flags)},
                     SOURCE_FILE, PTX_FILE, functools.partial(_compile_ptx, arch, tuple(flags)))


def _compile_ptx(arch: str, flags: tuple[str, ...], source: str, staging: Path, jobs: int) -> None:
    (staging / PTX_FILE).write_bytes(compile_cuda(source, arch, flags).code)


def _writable(size: int) -> bytes:
    """A fresh buffer of at least `size` bytes for NVRTC to write into.

    NVRTC writes into the bytes object it is given. `b" " * 1` is CPython's shared one-byte b" "
    (an empty log has size 1, its NUL): writing into it turned every b" " in the process into
    b"\\0", and with it every space that urllib decoded. Two or more bytes are always a new object."""
    return b" " * max(size, 2)
