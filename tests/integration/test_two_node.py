"""Two-node training on loopback: two `lumos train` processes, one per "node", meet on gloo at
127.0.0.1 and must train as one node with two ranks does, with one MLflow run, node 0's."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, load_config, to_toml
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.run import train

EXPERIMENT = "test-two-node"
TRAIN = {
    "data": {"table": "quickstart.sequences", "loader_workers": 0},
    "model": {"d_model": 16, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32,
              "dropout": 0.0, "max_len": 20},
    "run": {"batch_size": 32, "max_steps": 6, "eval_every": 100, "log_every": 1, "checkpoint_every": 100,
            "seed": 0, "experiment": EXPERIMENT},
}


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory) -> Path:
    """A workspace holding a small quickstart ingest, on a path both "nodes" see."""
    folder = tmp_path_factory.mktemp("two-node")
    generate_quickstart(folder / "data", SyntheticSpec(users=200, events=8_000, seed=2))
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={folder / 'data' / 'events'}", f"users.path={folder / 'data' / 'users.parquet'}",
        f"calendar.path={folder / 'data' / 'calendar.csv'}", "tokens.max_len=20",
    ])
    run_ingest(spark, open_workspace(folder), recipe, RECIPES)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node(project: Path, config_file: Path, rank: int, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lumos", "--workspace", str(project), "train", "--config", str(config_file),
         "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    """Kill the node and the ranks it spawned (its process group): a rank left behind would wait on
    the rendezvous for torch's 30 minutes, holding the node's stdout open, so `communicate` would too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def train_two_nodes(project: Path, config_file: Path, ports: Iterator[int], attempts: int = 3
                    ) -> tuple[list[tuple[int, str, str]], int]:
    """Both nodes' (exit code, stdout, stderr), and on which try of the `ports` they trained.

    Both nodes are given --master-port before either starts, as on real machines, so the port is
    probed free here and another process may take it before node 0 binds it. Node 0 then exits 1
    naming it (`test_node_0_names_its_master_port_when_another_process_holds_it`), before any
    MLflow run exists, and the pair starts again on another port. Node 1 is stopped, ranks and all,
    whenever node 0 fails: it would wait for node 0's store until torch's 30-minute timeout."""
    for attempt, port in enumerate(itertools.islice(ports, attempts), start=1):
        nodes = [node(project, config_file, rank, port) for rank in (0, 1)]
        try:
            first = nodes[0].communicate(timeout=900)
            if nodes[0].returncode != 0:
                stop(nodes[1])
                if f"master port {port} is in use" in first[1]:
                    continue
                raise AssertionError(f"node 0 exited {nodes[0].returncode}: {first[1][-3000:]}")
            second = nodes[1].communicate(timeout=900)
            return [(nodes[0].returncode, *first), (nodes[1].returncode, *second)], attempt
        finally:
            for process in nodes:
                if process.returncode is None:  # a timeout: nothing may outlive the test
                    stop(process)
    raise AssertionError(f"node 0 found its master port taken {attempts} times")


def train_metrics(client, run_id: str) -> dict[str, list[float]]:
    keys = [key for key in client.get_run(run_id).data.metrics if key.startswith("train/")]
    return {key: [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)] for key in keys}


@pytest.mark.slow  # four training processes (two nodes, then one node of two ranks): about 40 s
def test_two_nodes_train_as_one_node_with_two_ranks(project, tmp_path):
    workspace = open_workspace(project)
    config = from_dict(TrainConfig, TRAIN)
    one_node = train(config, workspace, nproc=2)

    config_file = tmp_path / "train.toml"
    config_file.write_text(to_toml(config))
    with socket.socket() as holder:  # the first port is taken, as another process might take it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        outputs, attempt = train_two_nodes(project, config_file, itertools.chain([taken], iter(free_port, None)))
    assert attempt >= 2  # the pair started again on a free port
    for code, _, stderr in outputs:
        assert code == 0, stderr[-3000:]
    first, second = (json.loads(stdout) for _, stdout, _ in outputs)
    assert first["world_size"] == second["world_size"] == 2 and first["step"] == second["step"] == 6
    assert first["run_id"] is not None and second["run_id"] is None

    client = tracking_client(workspace)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    assert {run.info.run_id for run in client.search_runs([experiment])} == {one_node.run_id, first["run_id"]}
    assert client.get_run(first["run_id"]).data.params["world_size"] == "2"
    expected = train_metrics(client, one_node.run_id)
    measured = train_metrics(client, first["run_id"])
    assert measured.keys() == expected.keys() and len(expected["train/retrieval"]) == 6
    for key, losses in expected.items():
        assert measured[key] == pytest.approx(losses, rel=1e-5), key


def test_bad_node_flags_are_usage_errors(project, tmp_path):
    config_file = tmp_path / "train.toml"
    config_file.write_text(to_toml(from_dict(TrainConfig, TRAIN)))
    train_args = ["--workspace", str(project), "train", "--config", str(config_file), "--nnodes", "2"]
    no_rendezvous = CliRunner().invoke(app, [*train_args, "--node-rank", "0"])
    assert no_rendezvous.exit_code == 2 and "--master-addr and --master-port" in no_rendezvous.output
    past_the_end = CliRunner().invoke(app, [*train_args, "--node-rank", "2", "--master-addr", "127.0.0.1",
                                            "--master-port", "29500"])
    assert past_the_end.exit_code == 2 and "--node-rank 2" in past_the_end.output


@pytest.mark.faults
def test_node_0_names_its_master_port_when_another_process_holds_it(project, tmp_path):
    """Node 0's `lumos train` binds the rendezvous store itself, before the MLflow run opens: a
    port another process listens on ends it at once with exit 1 naming the port, and no run."""
    config_file = tmp_path / "train.toml"
    config_file.write_text(to_toml(from_dict(TrainConfig, {**TRAIN, "run": {**TRAIN["run"], "experiment": "test-port-taken"}})))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = CliRunner().invoke(app, ["--workspace", str(project), "train", "--config", str(config_file),
                                          "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                                          "--master-port", str(port)])
    assert result.exit_code == 1, result.output
    assert f"master port {port} is in use on node 0" in result.output
    assert tracking_client(open_workspace(project)).get_experiment_by_name("test-port-taken") is None  # no run opened
