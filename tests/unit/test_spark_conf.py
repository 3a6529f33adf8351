"""What a session Lumos starts is given: Delta's jars (through Ivy at the first local start, the jars it
resolved after) and the driver's memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lumos.core.config import from_dict
from lumos.core.errors import ConfigError
from lumos.core.settings import LumosSettings, SparkSettings
from lumos.core.spark import remember_delta_jars, remembered_delta_jars, spark_conf, usable_memory_bytes

COORDINATES = "io.delta:delta-spark_4.2_2.13:4.4.0"


@pytest.fixture
def resolved(tmp_path, monkeypatch) -> list[str]:
    """Jars as Ivy lists them in spark.jars, remembered in a cache of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jars = []
    for name in ("io.delta_delta-spark_4.2_2.13-4.4.0.jar", "io.delta_delta-storage-4.4.0.jar"):
        (tmp_path / name).write_bytes(b"PK")
        jars.append(f"file://{tmp_path / name}")
    remember_delta_jars(COORDINATES, ",".join(jars))
    return jars


def test_a_first_local_start_resolves_delta_through_ivy(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = spark_conf(SparkSettings(master="local[2]", delta_package=COORDINATES))
    assert conf["spark.jars.packages"] == COORDINATES and "spark.jars" not in conf


def test_a_later_local_start_names_the_jars_ivy_resolved(resolved):
    conf = spark_conf(SparkSettings(master="local[2]", delta_package=COORDINATES))
    assert conf["spark.jars"] == ",".join(resolved) and "spark.jars.packages" not in conf


def test_a_jar_gone_from_disk_sends_the_start_back_through_ivy(resolved):
    Path(resolved[1].removeprefix("file://")).unlink()  # a cleared Ivy cache
    assert remembered_delta_jars(COORDINATES) is None
    assert spark_conf(SparkSettings(master="local[2]", delta_package=COORDINATES))["spark.jars.packages"] == COORDINATES


@pytest.mark.parametrize("settings", [
    SparkSettings(master="spark://127.0.0.1:7077", delta_package=COORDINATES),
    SparkSettings(master="local[2]", delta_package=COORDINATES, conf={"spark.jars.ivy": "/opt/ivy"}),
], ids=["a cluster", "an Ivy setting of the user's"])
def test_clusters_and_user_jar_settings_keep_spark_package_mechanism(resolved, settings):
    conf = spark_conf(settings)
    assert conf["spark.jars.packages"] == COORDINATES and "spark.jars" not in conf


def test_other_coordinates_are_resolved_apart(resolved):
    conf = spark_conf(SparkSettings(master="local[2]", delta_package="io.delta:delta-spark_4.2_2.13:4.5.0"))
    assert conf["spark.jars.packages"] == "io.delta:delta-spark_4.2_2.13:4.5.0"


def test_a_resolution_without_delta_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "other.jar").write_bytes(b"PK")
    remember_delta_jars(COORDINATES, f"file://{tmp_path / 'other.jar'}")
    assert remembered_delta_jars(COORDINATES) is None


GiB = 2**30


@pytest.mark.parametrize(("machine", "expected"), [
    (int(1.5 * GiB), "1024m"),  # a third is 512 MiB: the 1 GiB floor
    (3 * GiB, "1024m"),  # exactly the floor
    (10 * GiB, "3413m"),  # 10240 MiB / 3, rounded down
    (12 * GiB, "4096m"),
    (24 * GiB, "8192m"),  # exactly the cap
    (64 * GiB, "8192m"),  # a third is 21845 MiB: the 8 GiB cap
], ids=["1.5 GiB", "3 GiB", "10 GiB", "12 GiB", "24 GiB", "64 GiB"])
def test_auto_driver_memory_is_a_third_of_the_machine_within_bounds(monkeypatch, machine, expected):
    monkeypatch.setattr("lumos.core.spark.usable_memory_bytes", lambda: machine)
    assert spark_conf(SparkSettings())["spark.driver.memory"] == expected
    assert spark_conf(SparkSettings(driver_memory="2g"))["spark.driver.memory"] == "2g"


def test_usable_memory_is_at_most_the_physical_memory():
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < usable_memory_bytes() <= physical


@pytest.mark.parametrize("value", ["4gb", "0g", "-1g", "lots", ""])
def test_a_driver_memory_that_is_no_jvm_size_is_named(value):
    with pytest.raises(ConfigError) as caught:
        from_dict(LumosSettings, {"spark": {"driver_memory": value}})
    assert [problem.key for problem in caught.value.problems] == ["spark.driver_memory"]
