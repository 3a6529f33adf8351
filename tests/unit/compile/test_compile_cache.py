"""The kernel cache: miss then hit, a corrupt or partial entry rebuilt, the key covering flags."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from lumos.compile.runtime.kernel_cache import ENTRY, LIBRARY, UNIT_BREAK, KernelCache, gcc, host_cpu, translation_units

SOURCE = "float lumos_answer(void) { return 42.0f; }\n"
FLAGS = ("-O1",)


def answer(path) -> float:
    library = ctypes.CDLL(str(path))
    library.lumos_answer.restype = ctypes.c_float
    return library.lumos_answer()


def test_miss_then_hit(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    first = cache.build(SOURCE, gcc("gcc", FLAGS))
    second = cache.build(SOURCE, gcc("gcc", FLAGS))
    assert not first.hit and second.hit and first.library == second.library
    assert first.library.is_relative_to(tmp_path / "cpu") and answer(second.library) == 42.0
    assert len(cache.entries()) == 1 and not list((tmp_path / "cpu").glob(".build-*"))


def test_key_covers_source_flags_and_target(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    key = cache.key(SOURCE, gcc("gcc", FLAGS))
    assert key != cache.key(SOURCE + "\n", gcc("gcc", FLAGS))
    assert key != cache.key(SOURCE, gcc("gcc", ("-O2",)))
    assert key != KernelCache(tmp_path, "cuda").key(SOURCE, gcc("gcc", FLAGS))


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
    assert here.key(SOURCE, gcc("gcc", FLAGS)) != elsewhere.key(SOURCE, gcc("gcc", FLAGS))
    built = here.build(SOURCE, gcc("gcc", FLAGS))
    assert not elsewhere.build(SOURCE, gcc("gcc", FLAGS)).hit and here.build(SOURCE, gcc("gcc", FLAGS)).hit
    assert json.loads((built.library.parent / ENTRY).read_text())["cpu"] == host_cpu()


def test_corrupt_or_partial_entries_are_rebuilt(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    built = cache.build(SOURCE, gcc("gcc", FLAGS))
    built.library.write_bytes(built.library.read_bytes()[:100])  # truncated library
    rebuilt = cache.build(SOURCE, gcc("gcc", FLAGS))
    assert not rebuilt.hit and rebuilt.library.stat().st_size > 100
    (rebuilt.library.parent / ENTRY).unlink()  # an entry without its record: a partial write
    assert not cache.build(SOURCE, gcc("gcc", FLAGS)).hit
    entry = cache.entry(cache.key(SOURCE, gcc("gcc", FLAGS)))
    (entry / ENTRY).write_text(json.dumps({"key": "other", "sha256": "0"}))
    assert not cache.build(SOURCE, gcc("gcc", FLAGS)).hit
    assert cache.build(SOURCE, gcc("gcc", FLAGS)).hit and (entry / LIBRARY).is_file()


def test_clear(tmp_path):
    cache = KernelCache(tmp_path, "cpu")
    cache.build(SOURCE, gcc("gcc", FLAGS))
    assert cache.clear() == 1 and cache.entries() == []
    assert not cache.build(SOURCE, gcc("gcc", FLAGS)).hit


HEADER = '#define HIDDEN __attribute__((visibility("hidden")))\n'
PARTS = [f"HIDDEN float part{i}(void) {{ return {i}.0f; }}\n" for i in range(5)]
DRIVER = ("HIDDEN float part0(void); HIDDEN float part1(void); HIDDEN float part2(void); HIDDEN float part3(void);\n"
          "HIDDEN float part4(void);\nfloat lumos_answer(void) { return part0() + part1() + part2() + part3() + part4() + 32.0f; }\n")
UNITS_SOURCE = HEADER + "".join(UNIT_BREAK + part for part in [*PARTS, DRIVER])


def test_a_source_is_cut_into_units_that_each_start_with_the_header():
    units = translation_units(UNITS_SOURCE, 3)
    assert len(units) == 3 and all(unit.startswith(HEADER) for unit in units)
    assert "".join(unit.removeprefix(HEADER) for unit in units) == UNITS_SOURCE.removeprefix(HEADER).replace(UNIT_BREAK, "")
    assert translation_units(UNITS_SOURCE, 1) == [UNITS_SOURCE] and translation_units(SOURCE, 4) == [SOURCE]
    assert 1 < len(translation_units(UNITS_SOURCE, 64)) <= len(PARTS) + 1  # never more units than parts


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_units_compiled_at_once_link_into_one_library_that_exports_only_the_driver(tmp_path, jobs):
    built = KernelCache(tmp_path, "cpu", jobs=jobs).build(UNITS_SOURCE, gcc("gcc", FLAGS))
    assert answer(built.library) == 42.0
    with pytest.raises(AttributeError):
        _ = ctypes.CDLL(str(built.library)).part1  # hidden: another library's part1 can never be bound instead
    assert sorted(path.name for path in built.library.parent.iterdir()) == [ENTRY, "library.c", LIBRARY]
    assert (built.library.parent / "library.c").read_text() == UNITS_SOURCE


def test_a_unit_that_does_not_compile_is_a_build_error_and_leaves_no_entry(tmp_path):
    from lumos.compile.runtime.kernel_cache import BuildError

    broken = UNITS_SOURCE.replace("return 3.0f;", "return 3.0f +;")
    cache = KernelCache(tmp_path, "cpu", jobs=3)
    with pytest.raises(BuildError, match="expected expression"):
        cache.build(broken, gcc("gcc", FLAGS))
    assert cache.entries() == [] and not list((tmp_path / "cpu").glob(".build-*"))
