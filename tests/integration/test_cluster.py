"""Lumos on a real Spark standalone cluster: a master and two one-core workers on 127.0.0.1, started
from pyspark's own distribution. `lumos ingest`, `lumos infer` and a spark-submit job run there as a
user runs them (subprocesses: the test process holds a local session, which Lumos would reuse) and
must write the same rows and lineage as the local session does, also when an executor is
killed in the middle of the ingest's write.

Selected with `pytest -m cluster`; slow (six Spark applications start: the file took 13 min on
a shared 2-core machine before the executor-kill test added about 1.5 min), so not in the default run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.spark import delta_maven_coordinates
from lumos.core.tables import TableRef, read_table, table_location
from lumos.core.workspace import open_workspace
from lumos.data.table_metadata import version_lineage
from lumos.quickstart import RECIPES

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
IVY_JARS = Path.home() / ".ivy2.5.2" / "jars"
AS_OF = "2026-09-14"
MAX_LEN = 20
WORKERS = 2
# Executors run the driver's Python (PySpark sends PYSPARK_PYTHON with every task) and inherit the
# workers' environment, PYTHONPATH included, so they import the same Lumos as the driver.
SPARK_ENV = {
    **os.environ,
    "SPARK_HOME": str(SPARK_HOME),
    "PYSPARK_PYTHON": sys.executable,
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no fixed REST port 6066 to collide on
}


# -- the cluster ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StandaloneCluster:
    url: str
    worker_dirs: list[Path]

    def applications(self) -> set[str]:
        return {app.name for folder in self.worker_dirs for app in folder.glob("app-*")}

    def executor_files(self, application: str) -> list[set[str]]:
        """The files in each worker's executor folder of `application`: the jars it fetched."""
        return [{path.name for path in folder.glob(f"{application}/*/*")} for folder in self.worker_dirs]


def master_url(master_log: Path, master: subprocess.Popen, timeout_s: float = 120) -> str:
    """The URL the master started on: it binds port 0 itself and logs the port it got (a port
    probed free here first could be taken by another process before the master bound it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and master.poll() is None:
        started = re.search(r"Starting Spark master at (spark://\S+)", master_log.read_text(errors="replace"))
        if started:
            return started[1]
        time.sleep(0.5)
    raise RuntimeError(f"the Spark master did not start; see {master_log}")


def spark_class(main_class: str, args: list[str], log: Path) -> subprocess.Popen:
    # spark-class ends in `exec java …`, so the process's PID is the daemon's own.
    with open(log, "wb") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), main_class, *args], stdout=out,
                                stderr=subprocess.STDOUT, env=SPARK_ENV, start_new_session=True)


def wait_for_workers(master_log: Path, daemons: list[subprocess.Popen], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if master_log.read_text(errors="replace").count("Registering worker") >= WORKERS:
            return
        if any(daemon.poll() is not None for daemon in daemons):
            break
        time.sleep(1)
    raise RuntimeError(f"{WORKERS} workers did not register with the master; see {master_log.parent}/*.log")


def stop(daemon: subprocess.Popen) -> None:
    daemon.terminate()
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory) -> StandaloneCluster:
    folder = tmp_path_factory.mktemp("standalone")
    daemons: list[subprocess.Popen] = []
    try:
        daemons.append(spark_class("org.apache.spark.deploy.master.Master",
                                   ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"], folder / "master.log"))
        url = master_url(folder / "master.log", daemons[0])
        worker_dirs = []
        for number in range(1, WORKERS + 1):
            worker_dirs.append(folder / f"worker-{number}")
            worker_dirs[-1].mkdir()
            daemons.append(spark_class("org.apache.spark.deploy.worker.Worker",
                                       ["--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", "0",
                                        "--work-dir", str(worker_dirs[-1]), url], folder / f"worker-{number}.log"))
        wait_for_workers(folder / "master.log", daemons)
        yield StandaloneCluster(url=url, worker_dirs=worker_dirs)
    finally:
        for daemon in reversed(daemons):
            stop(daemon)


# -- the same project, local and on the cluster -------------------------------------------------------


@pytest.fixture(scope="module")
def local_project(trained_quickstart, tmp_path_factory) -> Path:
    """Ingested, trained, promoted and scored for AS_OF in this process, on the local session."""
    folder = tmp_path_factory.mktemp("local")
    run = trained_quickstart(folder, seed=7, max_len=MAX_LEN, steps=10, experiment="test-cluster")
    for args in (["promote", run, "--model", "quickstart"],
                 ["infer", "--model", "quickstart@production", "--as-of", AS_OF]):
        result = CliRunner().invoke(app, ["--workspace", str(folder), *args])
        assert result.exit_code == 0, result.output
    return folder


def cluster_project(folder: Path, master: str, root: Path, delta_jars_dir: Path | None = None,
                    shuffle_partitions: int = 4, event_log: Path | None = None) -> Path:
    """A project folder whose lumos.toml points Spark at `master` and the workspace at `root`
    (and, with `event_log`, has Spark write its listener events as JSON lines in that folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    jars = f'delta_jars_dir = "{delta_jars_dir}"\n' if delta_jars_dir else ""
    events = ""
    if event_log:
        event_log.mkdir(parents=True, exist_ok=True)
        events = (f'conf = {{ "spark.eventLog.enabled" = "true", "spark.eventLog.dir" = "file://{event_log}", '
                  '"spark.eventLog.compress" = "false" }\n')
    (folder / "lumos.toml").write_text(
        f'[workspace]\nroot = "{root}"\n\n[spark]\nmaster = "{master}"\ndriver_memory = "1g"\n'
        f"shuffle_partitions = {shuffle_partitions}\n{jars}{events}"
    )
    return folder


def ingest_args(data: Path) -> list[str]:
    """The recipe and overrides the trained_quickstart fixture ingests with."""
    return ["ingest", "--recipe", str(RECIPES / "ingest.toml"), "--set", f"source.path={data / 'events'}",
            "--set", f"users.path={data / 'users.parquet'}", "--set", f"calendar.path={data / 'calendar.csv'}",
            "--set", f"tokens.max_len={MAX_LEN}"]


def run_lumos(project: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "lumos", "--workspace", str(project), *args]
    return subprocess.run(command, env=SPARK_ENV, capture_output=True, text=True, timeout=900)


def rows(spark, project: Path, table: str) -> list[str]:
    frame = read_table(spark, open_workspace(project), TableRef.parse(table))
    return sorted(json.dumps(row.asDict(recursive=True), sort_keys=True, default=str) for row in frame.collect())


def lineage(project: Path, table: str) -> dict:
    """The lineage of the table's latest version, less what differs between two runs of the same work."""
    record = json.loads(version_lineage(open_workspace(project), TableRef.parse(table)).to_json())
    return {key: value for key, value in record.items() if key not in {"created_at", "record_id"}}


def new_application(cluster: StandaloneCluster, before: set[str]) -> str:
    started = cluster.applications() - before
    assert len(started) == 1, f"expected one new application on the workers, found {sorted(started)}"
    return started.pop()


# -- the tests ----------------------------------------------------------------------------------------


def test_ingest_on_the_cluster_writes_the_local_rows_and_lineage(spark, standalone_cluster, local_project, tmp_path):
    project = cluster_project(tmp_path / "project", standalone_cluster.url, tmp_path / "workspace")
    before = standalone_cluster.applications()
    result = run_lumos(project, *ingest_args(local_project / "data"), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["tables"]["sequences"] == "quickstart.sequences@0"

    # Both workers ran an executor, and each fetched Delta's jars from the driver's Ivy resolution.
    for files in standalone_cluster.executor_files(new_application(standalone_cluster, before)):
        assert any(name.startswith("io.delta_delta-spark_") for name in files), files
    for table in ("quickstart.sequences", "quickstart.vocab", "quickstart.rejects"):
        assert rows(spark, project, table) == rows(spark, local_project, table), table
        assert lineage(project, table) == lineage(local_project, table), table


def executor_processes(cluster: StandaloneCluster, application: str) -> dict[int, Path]:
    """PID → executor folder of each live executor JVM of `application` on this cluster's workers
    (the Worker starts it in worker-dir/app-id/executor-id)."""
    folders = [folder / application for folder in cluster.worker_dirs]
    found = {}
    for process in Path("/proc").iterdir():
        try:
            command = (process / "cmdline").read_bytes().split(b"\0")
            cwd = (process / "cwd").resolve()
        except (OSError, ValueError):  # gone, or not ours to read
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in command and cwd.parent in folders:
            found[int(process.name)] = cwd
    return found


def data_files(folder: Path) -> set[str]:
    return {path.name for path in folder.glob("*.parquet")}


def spark_events(folder: Path) -> list[dict]:
    """The listener events of the application that logged to `folder` (event log v2: a folder per
    application, holding events_<n>_<app> files of JSON lines)."""
    files = sorted(folder.rglob("events_*"), key=lambda path: int(path.name.split("_")[1]))
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def stage_ids(events: list[dict], call_site: str) -> set[int]:
    return {event["Stage Info"]["Stage ID"] for event in events
            if event["Event"] == "SparkListenerStageSubmitted" and call_site in event["Stage Info"]["Stage Name"]}


@pytest.mark.faults
def test_an_executor_killed_mid_write_is_replaced_and_the_ingest_writes_the_clean_rows(
    spark, standalone_cluster, local_project, tmp_path
):
    """`lumos ingest` on the cluster, one executor JVM SIGKILLed as soon as the sequences' first
    Parquet file is in the table's folder. The executors' Python workers write each partition's
    rows straight into that folder (`lumos.data.sequence_files`), and the driver commits only the
    files its finished tasks report. Eight partitions on two one-core executors: the write runs
    in four waves, so the kill lands while the killed executor runs one of them; Spark's event
    log shows it did."""
    root, event_log = tmp_path / "workspace", tmp_path / "events"
    project = cluster_project(tmp_path / "project", standalone_cluster.url, root, shuffle_partitions=8,
                              event_log=event_log)
    folder = Path(table_location(open_workspace(project), TableRef.parse("quickstart.sequences")).removeprefix("file:"))
    before = standalone_cluster.applications()
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        ingest = subprocess.Popen([sys.executable, "-m", "lumos", "--workspace", str(project),
                                   *ingest_args(local_project / "data"), "--json"],
                                  env=SPARK_ENV, stdout=stdout, stderr=stderr)
    try:
        deadline = time.monotonic() + 900
        while not data_files(folder):
            assert ingest.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.005)
        executors = executor_processes(standalone_cluster, new_application(standalone_cluster, before))
        assert len(executors) == WORKERS, executors
        pid, executor_folder = min(executors.items(), key=lambda item: item[1].name)
        os.kill(pid, signal.SIGKILL)
        code = ingest.wait(timeout=900)
    finally:
        if ingest.poll() is None:
            ingest.kill()
            ingest.wait()

    # The kill hit the write: a task of its stages failed (the killed executor's own task, or
    # one reading shuffle output that executor held), and the master started a third executor.
    killed = executor_folder.name  # the executor's id
    events = spark_events(event_log)
    writes = stage_ids(events, "sequence_files.py")
    failures = [event["Task End Reason"] for event in events
                if event["Event"] == "SparkListenerTaskEnd" and event["Stage ID"] in writes
                and event["Task End Reason"]["Reason"] != "Success"]
    assert failures, "the write finished before the kill: no task of it failed"
    assert {failure["Reason"] for failure in failures} <= {"ExecutorLostFailure", "FetchFailed"}, failures
    assert all(failure["Executor ID"] == killed for failure in failures if failure["Reason"] == "ExecutorLostFailure")
    assert [event["Executor ID"] for event in events if event["Event"] == "SparkListenerExecutorRemoved"] == [killed]
    assert len([event for event in events if event["Event"] == "SparkListenerExecutorAdded"]) == WORKERS + 1

    # Spark reran the lost tasks: the ingest succeeded with exactly what a clean ingest writes.
    assert code == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert json.loads((tmp_path / "stdout").read_text())["tables"]["sequences"] == "quickstart.sequences@0"
    for table in ("quickstart.sequences", "quickstart.vocab", "quickstart.rejects"):
        assert rows(spark, project, table) == rows(spark, local_project, table), table
        assert lineage(project, table) == lineage(local_project, table), table


@pytest.fixture
def delta_jars_dir(tmp_path) -> Path:
    """Delta's own jars copied out of the Ivy cache, as an air-gapped cluster would hold them."""
    folder = tmp_path / "delta-jars"
    folder.mkdir()
    jars = [*IVY_JARS.glob("io.delta_delta-spark_*.jar"), *IVY_JARS.glob("io.delta_delta-storage-*.jar")]
    assert len(jars) == 2, f"Delta's jars are not in {IVY_JARS}; any Lumos command with Spark resolves them"
    for jar in jars:
        shutil.copy(jar, folder / jar.name.removeprefix("io.delta_"))
    return folder


def test_infer_on_the_cluster_with_delta_jars_dir_writes_the_local_predictions(
    spark, standalone_cluster, local_project, delta_jars_dir, tmp_path
):
    # The same workspace, seen through a lumos.toml that sends Spark to the cluster.
    project = cluster_project(tmp_path / "project", standalone_cluster.url, local_project / ".lumos", delta_jars_dir)
    before = standalone_cluster.applications()
    result = run_lumos(project, "infer", "--model", "quickstart@production", "--as-of", AS_OF,
                       "--output", "quickstart.predictions_cluster", "--json")
    assert result.returncode == 0, result.stderr[-3000:]

    for files in standalone_cluster.executor_files(new_application(standalone_cluster, before)):
        assert {path.name for path in delta_jars_dir.iterdir()} <= files
    local = {row["user_id"]: row for row in map(json.loads, rows(spark, local_project, "quickstart.predictions"))}
    remote = {row["user_id"]: row for row in map(json.loads, rows(spark, project, "quickstart.predictions_cluster"))}
    assert remote.keys() == local.keys() and len(remote) == json.loads(result.stdout)["rows"] > 100
    for user, row in remote.items():
        assert row["top_items"] == local[user]["top_items"]
        assert row["user_embedding"] == pytest.approx(local[user]["user_embedding"], abs=1e-5)
        assert row["p_act_7d"] == pytest.approx(local[user]["p_act_7d"], abs=1e-5)
    remote_lineage = lineage(project, "quickstart.predictions_cluster")
    local_lineage = lineage(local_project, "quickstart.predictions")
    # Both runs write rejects to the workspace's one infer_rejects table: the cluster's, its next version.
    assert local_lineage["stats"].pop("rejects") == "quickstart.infer_rejects@0"
    assert remote_lineage["stats"].pop("rejects") == "quickstart.infer_rejects@1"
    # And the dataset's one user_state: the local night wrote version 0 for quickstart.predictions,
    # which no commit of the cluster's output names, so the cluster's night rebuilt it as version 1.
    assert local_lineage["stats"].pop("mode_reason") == "no state yet (first run)"
    assert "another --output" in remote_lineage["stats"].pop("mode_reason")
    for record, version in ((local_lineage, 0), (remote_lineage, 1)):
        (state,) = [item for item in record["inputs"] if item["uri"].endswith("/user_state")]
        assert state.pop("version") == version
    assert remote_lineage == local_lineage


# A Lumos command as a Spark application: spark-submit [options] job.py [lumos arguments].
SUBMITTED_JOB = """
import sys
from lumos.cli.app import app

try:
    app(sys.argv[1:], prog_name="lumos")
except SystemExit as end:
    exit_code = end.code or 0
"""
# Test only: where the executors' Python and Lumos come from, beside the driver's.
EXECUTOR_PROBE = """
import json, os, lumos
from pyspark.sql import SparkSession

spark = SparkSession.getActiveSession()
probe = lambda _: (sys.executable, __import__("lumos").__file__)
executors = sorted(set(spark.sparkContext.parallelize(range(4), 4).map(probe).collect()))
with open(os.environ["LUMOS_TEST_PROBE"], "w") as out:
    json.dump({"driver": [sys.executable, lumos.__file__], "executors": executors}, out)
sys.exit(exit_code)
"""


def spark_submit(cluster: StandaloneCluster, job: Path, *args: str, packages: bool = True,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    submit = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url, "--driver-memory", "1g"]
    if packages:
        submit += ["--packages", delta_maven_coordinates()]
    return subprocess.run([*submit, str(job), *args], env={**SPARK_ENV, **(env or {})}, capture_output=True,
                          text=True, timeout=900)


def test_spark_submit_runs_a_lumos_job_on_the_cluster(spark, standalone_cluster, local_project, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(SUBMITTED_JOB + EXECUTOR_PROBE)
    # The project's own lumos.toml names a local master: under spark-submit, --master wins.
    project = cluster_project(tmp_path / "project", "local[1]", tmp_path / "workspace")
    before = standalone_cluster.applications()
    probe = tmp_path / "python.json"
    result = spark_submit(standalone_cluster, job, "--workspace", str(project), *ingest_args(local_project / "data"),
                          env={"LUMOS_TEST_PROBE": str(probe)})
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]

    assert all(files for files in standalone_cluster.executor_files(new_application(standalone_cluster, before)))
    python = json.loads(probe.read_text())
    assert python["executors"] == [python["driver"]]
    for table in ("quickstart.sequences", "quickstart.vocab"):
        assert rows(spark, project, table) == rows(spark, local_project, table), table
        assert lineage(project, table) == lineage(local_project, table), table


def test_spark_submit_without_delta_names_the_packages_to_pass(standalone_cluster, local_project, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(SUBMITTED_JOB + "\nsys.exit(exit_code)\n")
    project = cluster_project(tmp_path / "project", "local[1]", tmp_path / "workspace")
    result = spark_submit(standalone_cluster, job, "--workspace", str(project), *ingest_args(local_project / "data"),
                          packages=False)
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert f"--packages {delta_maven_coordinates()}" in result.stdout + result.stderr
