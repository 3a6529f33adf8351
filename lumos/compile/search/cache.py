"""The search cache: the schedule the search chose for each distinct kernel, kept on disk.

Keyed by (kernel key, target, machine signature): the same kernel on another CPU, compiler or
flags is searched again. The kernel key (search.climb.kernel_key) hashes the kernel's C with its
buffers' storage dtypes, so a kernel that reads or writes a bfloat16 or float16 buffer has an entry
apart from its float32 twin's; a kernel with float32 buffers only has the key it had before there
were half dtypes (existing caches stay valid). An entry is one small JSON file under `<kernel cache>/<target>/search/`,
written to a temporary name and renamed into place, so a reader never sees half of one; an entry
that does not parse is ignored (and searched again).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from lumos.compile.runtime.kernel_cache import KernelCache, compiler_version
from lumos.compile.schedule.kernels import KernelSchedule

FORMAT = 2
"""2: the register-blocked matmul joined the candidates; choices made without it are not reused."""


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_signature(cc: str, cflags: tuple[str, ...]) -> str:
    """What makes a measured schedule valid elsewhere: CPU, threads per call, compiler and flags."""
    import torch  # the driver runs on torch's thread count (runtime.py)

    described = {"cpu": cpu_model(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                 "cc": compiler_version(cc), "flags": list(cflags)}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SearchEntry:
    schedule: KernelSchedule
    best_ms: float
    worst_ms: float
    baseline_ms: float | None
    candidates: int
    tried: int
    rejected: int
    rules: dict[str, int] = field(default_factory=dict)
    alternatives: list[dict] = field(default_factory=list)
    """Every candidate timed or rejected, fastest first (search.Group.tried)."""

    @staticmethod
    def from_group(group) -> SearchEntry:
        report = group.report()
        return SearchEntry(group.best.schedule, report["best_ms"], report["worst_ms"], report["baseline_ms"],
                           report["candidates"], report["tried"], report["rejected"], dict(group.rules),
                           report["alternatives"])

    def report(self) -> dict:
        return {"rules": self.rules, "candidates": self.candidates, "tried": self.tried, "rejected": self.rejected,
                "baseline_ms": self.baseline_ms, "best": self.schedule.describe(), "best_ms": self.best_ms,
                "worst_ms": self.worst_ms, "alternatives": self.alternatives}


class SearchCache:
    def __init__(self, kernel_cache: KernelCache, cc: str, cflags: tuple[str, ...]):
        self.target = kernel_cache.target
        self.machine = machine_signature(cc, cflags)
        self.root = kernel_cache.root / "search" / self.machine

    def path(self, kernel_key: str) -> Path:
        digest = hashlib.sha256(f"{kernel_key}|{self.target}|{self.machine}|{FORMAT}".encode()).hexdigest()
        return self.root / f"{digest}.json"

    def get(self, kernel_key: str) -> SearchEntry | None:
        try:
            data = json.loads(self.path(kernel_key).read_text())
            if data.get("format") != FORMAT or data.get("kernel_key") != kernel_key:
                return None
            entry = data["entry"]
            entry["schedule"] = KernelSchedule(**entry["schedule"])
            return SearchEntry(**entry)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, kernel_key: str, entry: SearchEntry) -> None:
        path = self.path(kernel_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "kernel_key": kernel_key, "target": self.target, "machine": self.machine,
                "entry": dataclasses.asdict(entry)}
        staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text(json.dumps(data, indent=1))
        os.replace(staging, path)

    def get_decision(self, key: str) -> dict | None:
        """A whole-program decision (e.g. whether to fuse attention) stored under `key`."""
        try:
            data = json.loads(self.path(f"decision:{key}").read_text())
            return data["decision"] if data.get("format") == FORMAT and data.get("kernel_key") == f"decision:{key}" else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put_decision(self, key: str, decision: dict) -> None:
        path = self.path(f"decision:{key}")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "kernel_key": f"decision:{key}", "target": self.target, "machine": self.machine,
                "decision": decision}
        staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        staging.write_text(json.dumps(data, indent=1))
        os.replace(staging, path)

    def clear(self) -> int:
        files = list(self.root.parent.glob("*/*.json")) if self.root.parent.exists() else []
        for file in files:
            file.unlink(missing_ok=True)
        return len(files)
