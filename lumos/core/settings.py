"""The schema of `lumos.toml`: where the workspace lives and how to reach Spark, MLflow and compilers.

Every default here is the embedded default: with no `lumos.toml` at all, Lumos runs on a local
Spark session, a SQLite MLflow store inside `.lumos/`, and gcc for the CPU compile target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lumos.core.config import require_valid


@dataclass(frozen=True)
class WorkspaceSettings:
    root: str = ".lumos"
    """Where tables, MLflow runs and kernels are written: a local path (relative to the folder
    holding lumos.toml) or a URI such as s3a://bucket/lumos."""


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    """Spark master: local[*], spark://host:7077, yarn, k8s://… (ignored under spark-submit)."""
    app_name: str = "lumos"
    """Application name shown by the cluster manager."""
    shuffle_partitions: int = 8
    """spark.sql.shuffle.partitions; raise it with the data (at 40M events in a 4 GB driver, 8 spilled
    each task's sort to disk and 32 did not) and on a cluster."""
    driver_memory: str = "auto"
    """spark.driver.memory for sessions Lumos starts itself, e.g. "4g"; "auto" is a third of this
    machine's memory (or of its container's limit), between 1g and 8g. On local[*] every task runs
    in this JVM, so it bounds the check's cache and the sorts beside it: a million-user `lumos infer`
    checked its events 15-20 s faster with 8g than 4g (benchmarks/infer.py, README)."""
    delta_package: str | None = None
    """Maven coordinates of Delta Lake for Spark's package mechanism; unset means the artifact that
    matches the installed pyspark and delta-spark (e.g. io.delta:delta-spark_4.2_2.13:4.4.0). A local
    session resolves it through Ivy once, then names the jars it resolved (~/.cache/lumos/delta-jars)."""
    delta_jars_dir: str | None = None
    """A folder of Delta jars to use instead of resolving delta_package (air-gapped clusters)."""
    ui: bool = False
    """Start the Spark web UI."""
    log_level: str = "ERROR"
    """Spark's log level: ERROR keeps the terminal quiet; WARN or INFO when debugging."""
    conf: dict[str, str] = field(default_factory=dict)
    """Any other Spark settings, e.g. { "spark.executor.memory" = "8g" }."""

    def __post_init__(self) -> None:
        problems = []
        if self.shuffle_partitions < 1:
            problems.append(("shuffle_partitions", "must be at least 1"))
        if self.driver_memory != "auto" and not re.fullmatch(r"[1-9][0-9]*[kmgt]?", self.driver_memory.lower()):
            problems.append(("driver_memory", f"{self.driver_memory!r} is not a JVM size; use e.g. \"4g\", \"512m\" or \"auto\""))
        if self.log_level.upper() not in {"ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN"}:
            problems.append(("log_level", f"unknown log level {self.log_level!r}; use ERROR, WARN or INFO"))
        require_valid(problems)


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None = None
    """MLflow tracking URI; unset means sqlite:///<workspace>/mlflow.db."""
    artifact_root: str | None = None
    """Where new experiments store artifacts; unset means <workspace>/mlartifacts."""


@dataclass(frozen=True)
class CompileSettings:
    target: str = "cpu"
    """Default compile target: cpu (gcc + OpenMP) or cuda (nvcc/NVRTC)."""
    cc: str = "gcc"
    """C compiler for the CPU target."""
    cflags: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp")
    """Flags for the CPU target; part of every kernel's cache key."""
    nvcc: str | None = None
    """Path to nvcc; unset means look on PATH and in the nvidia-cuda-nvcc wheel."""

    def __post_init__(self) -> None:
        require_valid([("target", "must be 'cpu' or 'cuda'")] if self.target not in ("cpu", "cuda") else [])


@dataclass(frozen=True)
class LumosSettings:
    """Everything `lumos.toml` may hold."""

    workspace: WorkspaceSettings = field(default_factory=WorkspaceSettings)
    """Where Lumos writes."""
    spark: SparkSettings = field(default_factory=SparkSettings)
    """The Spark session every table read and write goes through."""
    mlflow: MlflowSettings = field(default_factory=MlflowSettings)
    """Runs, metrics, artifacts and the model registry."""
    compile: CompileSettings = field(default_factory=CompileSettings)
    """The tensor compiler's targets and toolchains."""
