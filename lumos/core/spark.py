"""The one Spark session factory: local by default, any master from config, Delta always on.

Delta's jars come from Spark's package mechanism (Maven coordinates that match the installed
pyspark and delta-spark) or, on air-gapped clusters, from a local folder of jars named in config.
A local session remembers the jars Ivy resolved and names them directly at its next start
(`remembered_delta_jars`), which spares every later command Ivy's resolution.
In a process that already has a session, that session is reused; under `spark-submit`, the master
and jars it was given stand, and the other settings apply to the session Lumos starts.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from lumos.core.errors import LumosError, UsageError
from lumos.core.settings import SparkSettings
from lumos.core.workspace import Workspace, is_uri

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def delta_maven_coordinates() -> str:
    """io.delta:delta-spark_<spark major.minor>_2.13:<delta-spark version>, as delta-spark's pip helper does."""
    spark_major_minor = ".".join(metadata.version("pyspark").split(".")[:2])
    return f"io.delta:delta-spark_{spark_major_minor}_2.13:{metadata.version('delta-spark')}"


def spark_conf(settings: SparkSettings) -> dict[str, str]:
    """Every Spark setting Lumos applies, later entries winning; `[spark] conf` wins over all."""
    conf = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        # Delta rebuilds a table's state (its file list and stats) with a shuffle into 50
        # partitions by default, at every read and after every commit: 50 tiny tasks that took
        # 3-5 s each time on 2 cores. Lumos's tables overwrite their files at each version, so a
        # log holds a few files per version: its size does not grow with the data, and one
        # partition holds it. An overwrite of an existing table took 0.8-1.0 s against 1.2-1.5 s
        # with 8 partitions, and a re-ingest of 100,000 events 6.1-8.2 s against 7.4-10.2 s.
        "spark.databricks.delta.snapshotPartitions": "1",
        "spark.ui.enabled": str(settings.ui).lower(),
        "spark.driver.memory": driver_memory(settings.driver_memory),
        # Event times are instants; reading and writing them in UTC keeps days and hours stable
        # whatever the machine's time zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "false",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Every Lumos write is a version with its own lineage, even one that rewrites an empty
        # table with no rows (an ingest with no rejects); Delta skips such commits by default.
        "spark.databricks.delta.skipRecordingEmptyCommits": "false",
        # pandas writes Parquet timestamps in nanoseconds, which Spark refuses unless read as
        # longs; lumos.data.sources turns those columns back into timestamps.
        "spark.sql.legacy.parquet.nanosAsLong": "true",
        # Ingest persists its frames (checked events, tokens, sequences) and reads each back a few
        # times. Compressing Spark's in-memory cache gathers statistics per value through boxed
        # hash maps: 9% of a profiled ingest's CPU, and 16% less CPU without it
        # (benchmarks/ingest.py). Lumos's cached frames are short-lived, so memory is the cheaper price.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Spark 4 bounds each Arrow batch sent to Python (mapInArrow: ingest's row builder, infer's
        # scoring) by bytes too, and checks the bound after every row by summing every vector's
        # buffer sizes: a tenth of the JVM's samples while infer scored (JFR). Int.MaxValue
        # turns that check off; batches stay bounded by maxRecordsPerBatch (10,000 rows).
        "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
        # The parallel collector instead of G1 for the JVM Lumos starts (local mode runs every
        # task in it): G1's concurrent threads compete with the tasks for a few cores, and an
        # ingest ran 10-15% faster without them (benchmarks/ingest.py, 2 cores). Executors on a
        # cluster keep their own settings.
        "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    }
    if settings.delta_jars_dir:
        jars = sorted(glob.glob(os.path.join(settings.delta_jars_dir, "*.jar")))
        if not jars:
            raise UsageError(
                f"spark.delta_jars_dir = {settings.delta_jars_dir!r} holds no .jar files; "
                "copy delta-spark and delta-storage jars there, or unset it to resolve them from Maven"
            )
        conf["spark.jars"] = ",".join(jars)
    else:
        coordinates = settings.delta_package or delta_maven_coordinates()
        remembered = remembered_delta_jars(coordinates) if _remembers_jars(settings) else None
        if remembered:
            conf["spark.jars"] = ",".join(remembered)
        else:
            conf["spark.jars.packages"] = coordinates
    conf.update(settings.conf)
    return conf


def driver_memory(setting: str) -> str:
    """The setting, or for "auto" a third of the memory this process may use, between 1g and 8g."""
    if setting != "auto":
        return setting
    megabytes = usable_memory_bytes() // 3 // 2**20
    return f"{min(max(megabytes, 1024), 8192)}m"


def usable_memory_bytes() -> int:
    """Physical memory, or the container's (cgroup v2 or v1) limit when that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            return min(physical, int(limit))
    return physical


def jar_memory(coordinates: str) -> Path:
    """Where the jars Ivy resolved for `coordinates` are remembered: one path or URI per line."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "lumos" / "delta-jars" / (coordinates.replace(":", "_") + ".txt")


def remembered_delta_jars(coordinates: str) -> list[str] | None:
    """The jars an earlier start resolved for `coordinates`, if every one is still on disk.

    Ivy resolves the same fixed versions to the same files at every start, and takes seconds
    parsing its cache to say so, paid by every command: naming them instead took a cold `lumos
    ingest` of 2M events from 33.5 to 31.0 s (median of 4 pairs, 2 cores). A jar gone from disk
    (a cleared Ivy cache) sends the start back through Ivy, which fetches it and remembers again.
    """
    try:
        jars = jar_memory(coordinates).read_text().split()
    except OSError:
        return None
    if not jars or not all(os.path.isfile(jar.removeprefix("file://")) for jar in jars):
        return None
    return jars


def forget_delta_jars(coordinates: str) -> None:
    jar_memory(coordinates).unlink(missing_ok=True)


def remember_delta_jars(coordinates: str, resolved: str) -> None:
    """Keep the jars a start resolved through Ivy (`resolved`: its spark.jars), if Delta is among them."""
    jars = [jar for jar in resolved.split(",") if jar]
    if not any("delta-spark" in jar for jar in jars):
        return
    memory = jar_memory(coordinates)
    try:
        memory.parent.mkdir(parents=True, exist_ok=True)
        partial = memory.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text("\n".join(jars) + "\n")
        partial.replace(memory)  # whole or not at all, whatever starts beside this one
    except OSError:
        pass  # a read-only home: every start resolves through Ivy, as before


def _remembers_jars(settings: SparkSettings) -> bool:
    """Local sessions only: on a cluster, the second is small against the job, and the jars that
    reach the executors stay what Spark's package mechanism (or delta_jars_dir) gives them. Any
    `spark.jars*` setting of the user's (another Ivy home, repository or jar) also turns it off."""
    return settings.master.startswith("local") and not any(key.startswith("spark.jars") for key in settings.conf)


def get_spark(settings: SparkSettings, log_file: Path | None = None):
    """Return the active session if there is one, else start one from `settings`.

    The JVM inherits this process's stderr, where Ivy's resolution reports and Spark's start-up
    warnings would land on the user's terminal; with `log_file`, they go there instead, and a
    failed start quotes the end of that log in its error.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = spark_conf(settings)
    builder = SparkSession.builder.appName(settings.app_name)
    if launched_by_spark_submit():
        # spark-submit started the JVM with its own --master, --packages and --jars; setting them
        # again here would move the job off the cluster, and jars can no longer reach the driver.
        for key in ("spark.master", "spark.jars", "spark.jars.packages"):
            conf.pop(key, None)
        _require_delta_classes()
    else:
        builder = builder.master(settings.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    # Ivy resolves Delta at this start (packages) or the jars it resolved before are named (jars).
    remembering = _remembers_jars(settings) and not settings.delta_jars_dir and not launched_by_spark_submit()
    try:
        with _stderr_to(log_file):
            session = builder.getOrCreate()
    except Exception as error:
        if remembering and "spark.jars" in conf:  # they may be what failed: the next start resolves afresh
            forget_delta_jars(settings.delta_package or delta_maven_coordinates())
        raise LumosError(_start_failure_message(error, log_file)) from error
    if remembering and "spark.jars.packages" in conf:
        remember_delta_jars(conf["spark.jars.packages"], session.sparkContext.getConf().get("spark.jars", ""))
    session.sparkContext.setLogLevel(settings.log_level.upper())
    return session


def launched_by_spark_submit() -> bool:
    """True in a driver that spark-submit (or another JVM launcher) started: its gateway is given."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _require_delta_classes() -> None:
    from py4j.java_gateway import JavaClass
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    if not isinstance(SparkContext._jvm.io.delta.sql.DeltaSparkSessionExtension, JavaClass):
        raise UsageError(
            "Delta Lake is not on this spark-submit's classpath: pass "
            f"--packages {delta_maven_coordinates()} (or --jars with the delta-spark and delta-storage jars)"
        )


@contextlib.contextmanager
def _stderr_to(log_file: Path | None) -> Iterator[None]:
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_file, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _start_failure_message(error: Exception, log_file: Path | None) -> str:
    lines = [f"Spark did not start: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}"]
    if log_file is not None and log_file.is_file():
        tail = log_file.read_text(errors="replace").splitlines()[-15:]
        lines += [f"last lines of {log_file}:"] + [f"  {line}" for line in tail if not line.startswith("\tat ")]
    lines.append(
        "Check Java 17 with `java -version`; if Delta's jars cannot be downloaded, fill the local Maven "
        f"repository with `mvn dependency:get -Dartifact={delta_maven_coordinates()}` or set "
        "[spark] delta_jars_dir. `lumos doctor` checks all of this."
    )
    return "\n".join(lines)


def workspace_spark(workspace: Workspace):
    """The session for a workspace, with Spark's own log in <workspace>/logs/spark.log when local."""
    log_file = None if is_uri(workspace.root) else Path(workspace.root) / "logs" / "spark.log"
    return get_spark(workspace.settings.spark, log_file=log_file)


def job_steps(spark, stage: str, report: Callable[[str], None]) -> Callable[[str | None], None]:
    """A `step(name)` that reports a step and names the Spark jobs after it, so that the Spark UI
    and the event log show "lumos <stage>: <step>" instead of a call site; step(None) clears it."""
    def step(name: str | None) -> None:
        if name is not None:
            report(name)
        spark.sparkContext.setJobDescription(None if name is None else f"lumos {stage}: {name}")
    return step
