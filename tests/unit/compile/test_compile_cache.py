"""The kernel cache: miss then hit, a corrupt or partial entry rebuilt, the key covering flags."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

from lumos.compile.cache import ENTRY, LIBRARY, KernelCache, host_cpu

SOURCE = "float lumos_answer(void) { return 42.0f; }\n"
FLAGS = ("-O1",)


def answer(path) -> float:
    library = ctypes.CDLL(str(path))
    library.lumos_answer.restype = ctypes.c_float
    return library.lumos_answer()


def test_miss_then_hit(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    first = cache.build(SOURCE, "gcc", FLAGS)
    second = cache.build(SOURCE, "gcc", FLAGS)
    assert not first.hit and second.hit and first.library == second.library
    assert first.library.is_relative_to(tmp_path / "cpu") and answer(second.library) == 42.0
    assert len(cache.entries()) == 1 and not list((tmp_path / "cpu").glob(".build-*"))


def test_key_covers_source_flags_and_target(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    key = cache.key(SOURCE, "gcc", FLAGS)
    assert key != cache.key(SOURCE + "\n", "gcc", FLAGS)
    assert key != cache.key(SOURCE, "gcc", ("-O2",))
    assert key != KernelCache(tmp_path, "cuda").key(SOURCE, "gcc", FLAGS)


def test_key_covers_the_host_cpu(tmp_path):
    # -march=native makes a library specific to the CPU that built it; another CPU sharing the
    # workspace must get its own entry instead of loading it (SIGILL).
    here = KernelCache(tmp_path, "cpu")
    assert here.cpu == host_cpu() and host_cpu()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and "model name" in cpuinfo.read_text():
        model = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("model name"))
        assert " ".join(model.partition(":")[2].split()) in host_cpu()
    elsewhere = KernelCache(tmp_path, "cpu", cpu="another CPU; flags: sse2")
    assert here.key(SOURCE, "gcc", FLAGS) != elsewhere.key(SOURCE, "gcc", FLAGS)
    built = here.build(SOURCE, "gcc", FLAGS)
    assert not elsewhere.build(SOURCE, "gcc", FLAGS).hit and here.build(SOURCE, "gcc", FLAGS).hit
    assert json.loads((built.library.parent / ENTRY).read_text())["cpu"] == host_cpu()


def test_corrupt_or_partial_entries_are_rebuilt(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    built = cache.build(SOURCE, "gcc", FLAGS)
    built.library.write_bytes(built.library.read_bytes()[:100])  # truncated library
    rebuilt = cache.build(SOURCE, "gcc", FLAGS)
    assert not rebuilt.hit and rebuilt.library.stat().st_size > 100
    (rebuilt.library.parent / ENTRY).unlink()  # an entry without its record: a partial write
    assert not cache.build(SOURCE, "gcc", FLAGS).hit
    entry = cache.entry(cache.key(SOURCE, "gcc", FLAGS))
    (entry / ENTRY).write_text(json.dumps({"key": "other", "sha256": "0"}))
    assert not cache.build(SOURCE, "gcc", FLAGS).hit
    assert cache.build(SOURCE, "gcc", FLAGS).hit and (entry / LIBRARY).is_file()


def test_clear(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    cache.build(SOURCE, "gcc", FLAGS)
    assert cache.clear() == 1 and cache.entries() == []
    assert not cache.build(SOURCE, "gcc", FLAGS).hit
