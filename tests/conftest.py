"""One local Spark session with Delta for the whole test run (starting Spark costs seconds)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from lumos.core.settings import SparkSettings
    from lumos.core.spark import get_spark

    settings = SparkSettings(master="local[2]", shuffle_partitions=2, driver_memory="2g")
    session = get_spark(settings, log_file=tmp_path_factory.mktemp("spark") / "spark.log")
    yield session
    session.stop()
