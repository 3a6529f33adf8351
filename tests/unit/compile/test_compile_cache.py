"""The kernel cache: miss then hit, a corrupt or partial entry rebuilt, the key covering flags."""

from __future__ import annotations

import ctypes
import json

from lumos.compile.cache import ENTRY, LIBRARY, KernelCache

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
