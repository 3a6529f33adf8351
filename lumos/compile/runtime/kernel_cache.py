"""The kernel cache: built libraries, content-addressed on disk.

What builds a source is a `Toolchain`: gcc for the C target (`gcc` here), NVRTC for CUDA
(`nvrtc.nvrtc_toolchain`). The key is the hash of (source, target, the toolchain's key parts):
for C the compiler and its version, the flags and the host CPU; for CUDA NVRTC's version, the GPU
architecture and the flags. So any change to what would be built is a different entry. The CPU is
in the C key because the default flags hold `-march=native`: a workspace shared by hosts with
different CPUs must not hand one host a library built for another's instruction set (SIGILL).
An entry is a folder `<root>/<target>/<key[:2]>/<key>/` with the source, the product
(`library.so`; `kernels.ptx`) and `entry.json` (the key and the product's sha256). It is built in a
temporary folder and renamed into place, so readers never see half an entry; an entry whose
library is missing or does not match its recorded hash (a partial or corrupted write) is removed
and rebuilt.

A C library is compiled as one translation unit per core, at the same time, then linked: its
source marks where it may be cut (`UNIT_BREAK`). On 2 cores that shortens the build (quickstart:
1.2 s → 0.8 s), and the schedule search builds a program every round.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lumos.core.disk import writing_to
from lumos.core.errors import LumosError, UsageError
from lumos.core.workspace import Workspace

LIBRARY = "library.so"
SOURCE = "library.c"
ENTRY = "entry.json"


UNIT_BREAK = "/* lumos: translation unit */"
"""Where a C source may be cut into translation units: the text before the first break is the
header every unit starts with; the parts between breaks (kernels, then the driver) are dealt out
to the units in order. The whole source is valid C too (what library.c holds)."""


class BuildError(LumosError):
    """The C compiler failed on generated code."""


@dataclass(frozen=True)
class Build:
    library: Path
    key: str
    hit: bool
    seconds: float
    """Time to find or build it."""


@dataclass(frozen=True)
class Toolchain:
    """How a target's source becomes the file its runtime loads, as far as the cache is concerned."""

    name: str
    """For messages: "gcc", "NVRTC 13.2 for sm_80"."""
    key_parts: Mapping[str, object]
    """What the cache key holds besides the source and the target: the compiler and its version,
    the flags, the GPU architecture."""
    source_file: str
    product: str
    """The file the runtime loads (library.so, kernels.ptx)."""
    compile: Callable[[str, Path, int], None]
    """(source, folder, parallel jobs): writes `product` into the folder, which holds `source_file`."""
    host_specific: bool = False
    """The product runs only on CPUs like the one it was built for (`-march=native`): the cache's
    CPU joins the key."""


def gcc(cc: str, flags: tuple[str, ...]) -> Toolchain:
    """The C target's toolchain: `cc` with `flags`, one translation unit per job, then linked."""
    return Toolchain(cc, {"cc": cc, "cc_version": compiler_version(cc), "flags": list(flags)}, SOURCE, LIBRARY,
                     functools.partial(_compile_c, cc, tuple(flags)), host_specific=True)


def _compile_c(cc: str, flags: tuple[str, ...], source: str, staging: Path, jobs: int) -> None:
    units = translation_units(source, jobs)
    if len(units) == 1:
        _run([cc, *flags, "-shared", "-fPIC", "-o", str(staging / LIBRARY), str(staging / SOURCE), "-lm"])
        return
    paths = [staging / f"unit{index}.c" for index in range(len(units))]
    for path, unit in zip(paths, units, strict=True):
        path.write_text(unit)
    _run_all([[cc, *flags, "-fPIC", "-c", "-o", str(path.with_suffix(".o")), str(path)] for path in paths])
    _run([cc, *flags, "-shared", "-fPIC", "-o", str(staging / LIBRARY), *(str(path.with_suffix(".o")) for path in paths),
          "-lm"])
    for path in paths:
        path.unlink()
        path.with_suffix(".o").unlink()


@functools.cache
def compiler_version(cc: str) -> str:
    try:
        result = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise UsageError(f"C compiler {cc!r} does not run ({error}); set [compile] cc in lumos.toml") from None
    return result.stdout.splitlines()[0] if result.stdout else cc


@functools.cache
def host_cpu() -> str:
    """This host's CPU as `-march=native` sees it: model name and feature flags (Linux's
    /proc/cpuinfo), else the platform's machine and processor names."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "CPU implementer", "CPU part") and name not in fields:
            fields[name] = " ".join(value.split())  # flags sorted as the kernel lists them: stable
    if not fields:
        return f"{platform.machine()} {platform.processor()}".strip()
    return "; ".join(f"{name}: {value}" for name, value in sorted(fields.items()))


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def translation_units(source: str, count: int) -> list[str]:
    """`source` cut at its UNIT_BREAKs into at most `count` units of about equal length, each
    with the header; one unit (the source itself) when it has no breaks or `count` is 1."""
    header, *parts = source.split(UNIT_BREAK)
    if len(parts) < 2 or count <= 1:
        return [source]
    target = sum(map(len, parts)) / min(count, len(parts))
    units: list[list[str]] = [[]]
    filled = 0.0
    for part in parts:
        if units[-1] and filled + len(part) / 2 > target * len(units) and len(units) < count:
            units.append([])
        units[-1].append(part)
        filled += len(part)
    return [header + "".join(unit) for unit in units]


def _run(command: list[str]) -> None:
    _run_all([command])


def _run_all(commands: list[list[str]]) -> None:
    """Every command at once, each in its own process, and wait for all; the first failure is
    raised. Processes, not Python threads: the cyclic garbage collector could then drop an
    egglog e-graph on a thread that did not make it, which egglog refuses."""
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for command in commands]
    errors = [(command, process.communicate()[1]) for command, process in zip(commands, running, strict=True)]  # waits for each
    for (command, stderr), process in zip(errors, running, strict=True):
        if process.returncode != 0:
            raise BuildError(f"{' '.join(command)} failed:\n{stderr[-4000:]}")


class KernelCache:
    def __init__(self, root: str | Path, target: str = "cpu", cpu: str | None = None, jobs: int | None = None):
        self.root = Path(root) / target
        self.target = target
        self.cpu = cpu if cpu is not None else host_cpu()
        """The CPU libraries are built for and run on (this host's unless given)."""
        self.jobs = jobs or len(os.sched_getaffinity(0))
        """Translation units compiled at the same time (default: one per core this process may use)."""

    @staticmethod
    def for_workspace(workspace: Workspace, target: str = "cpu") -> KernelCache:
        location = workspace.kernels_dir
        if location.startswith("file:"):
            location = location.removeprefix("file://").removeprefix("file:")
        elif not workspace.is_local:
            raise UsageError(f"the kernel cache needs a local folder; workspace root {workspace.root} is remote")
        return KernelCache(location, target)

    def key(self, source: str, toolchain: Toolchain) -> str:
        material = {"source": source, **toolchain.key_parts, "target": self.target}
        if toolchain.host_specific:
            material["cpu"] = self.cpu
        return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str, product: str = LIBRARY) -> Path | None:
        """The entry's library (or PTX) when it is whole; a broken entry is removed (and so rebuilt)."""
        folder = self.entry(key)
        if not folder.exists():
            return None
        try:
            recorded = json.loads((folder / ENTRY).read_text())
            if recorded["key"] == key and recorded["sha256"] == _sha256_file(folder / product):
                return folder / product
        except (OSError, ValueError, KeyError, TypeError):
            pass
        shutil.rmtree(folder, ignore_errors=True)
        return None

    def build(self, source: str, toolchain: Toolchain) -> Build:
        """`source` built by `toolchain`, found in the cache or built into it: `Build.library` is
        the product (the C library, the PTX)."""
        started = time.perf_counter()
        key = self.key(source, toolchain)
        found = self.lookup(key, toolchain.product)
        if found is not None:
            return Build(found, key, True, time.perf_counter() - started)

        def make(staging: Path) -> None:
            (staging / toolchain.source_file).write_text(source)
            toolchain.compile(source, staging, self.jobs)

        described = {**toolchain.key_parts, **({"cpu": self.cpu} if toolchain.host_specific else {})}
        self._store(key, toolchain.product, make, described)
        return Build(self.entry(key) / toolchain.product, key, False, time.perf_counter() - started)

    def _store(self, key: str, product: str, make, described: dict) -> None:
        """Build an entry in a temporary folder (`make` writes its files) and rename it into place."""
        with writing_to(str(self.root)):
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=self.root))
        try:
            with writing_to(str(self.root)):  # a full disk: no entry, the staging folder removed below
                make(staging)
                (staging / ENTRY).write_text(json.dumps({"key": key, "sha256": _sha256_file(staging / product),
                                                         "target": self.target, **described}))
            folder = self.entry(key)
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(staging, folder)
            except OSError:
                # Another process put a whole entry there first; use it if it is whole.
                if self.lookup(key, product) is None:
                    moved = folder.with_name(f".{key}-{uuid.uuid4().hex[:8]}")
                    os.replace(staging, moved)
                    os.replace(moved, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def entries(self) -> list[Path]:
        return sorted(path for path in self.root.glob("*/*") if path.is_dir())

    def clear(self) -> int:
        """Remove every entry of this target; returns how many there were."""
        count = len(self.entries())
        shutil.rmtree(self.root, ignore_errors=True)
        return count
