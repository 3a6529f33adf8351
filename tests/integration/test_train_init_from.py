"""`lumos train --init-from` on a real quickstart ingest, a real SQLite MLflow store and real gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import torch
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, to_toml
from lumos.core.registry import ModelVersionInfo
from lumos.core.tables import TableRef
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.sequences_version import open_sequences
from lumos.data.synthetic import SyntheticSpec
from lumos.infer.trace import model_snapshot
from lumos.train.checkpoint import load_model
from lumos.train.config import TrainConfig
from lumos.train.run import train

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")
EXPERIMENT = "test-init-from"

TINY = {
    "data": {"table": "quickstart.sequences@0", "loader_workers": 1},  # later tests ingest again
    "model": {"d_model": 8, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16,
              "dropout": 0.0, "max_len": 20, "heads": ["retrieval"]},
    "optim": {"lr": 3e-3, "warmup_steps": 2},
    "run": {"batch_size": 32, "max_steps": 4, "eval_every": 100, "eval_batches": 2, "log_every": 1,
            "checkpoint_every": 100, "seed": 0, "experiment": EXPERIMENT},
}
NEW_HEAD = {"act_head.weight", "act_head.bias", "log_variance.binary"}


def child_config(folder: Path, **changes) -> Path:
    """A train.toml like the parent's with the binary head added, and `changes` at the top level
    (init_from, freeze) or as section.key."""
    raw = json.loads(json.dumps(TINY))
    raw["model"]["heads"] = ["retrieval", "binary"]
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            raw[section][name] = value
        else:
            raw[section] = value
    path = folder / "child.toml"
    path.write_text(to_toml(from_dict(TrainConfig, raw)))
    return path


@pytest.fixture(scope="module")
def project(ingest_quickstart, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("init-from")
    ingest_quickstart(folder, SyntheticSpec(users=200, events=8_000, seed=3), max_len=20)
    return folder


@pytest.fixture(scope="module")
def parent(project) -> str:
    """A retrieval-only run of 4 steps: the pretrained model the children start from."""
    return train(from_dict(TrainConfig, TINY), open_workspace(project)).run_id


def checkpoint_state(workspace, run_id: str) -> dict[str, torch.Tensor]:
    tag = tracking_client(workspace).get_run(run_id).data.tags["lumos.checkpoint"]
    folder = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=tag, tracking_uri=workspace.mlflow_tracking_uri)
    return load_model(Path(folder))[0].state_dict()


def parent_prefixes(state: dict[str, torch.Tensor]) -> list[str]:
    """Freeze prefixes covering every tensor of the retrieval-only parent (log_variance only its own)."""
    return sorted({name.split(".")[0] for name in state if not name.startswith("log_variance")} | {"log_variance.retrieval"})


def run_count(workspace) -> int:
    client = tracking_client(workspace)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return len(client.search_runs([experiment.experiment_id])) if experiment else 0


def test_init_from_loads_exactly_the_parents_matching_tensors_and_records_the_parent(project, parent, tmp_path):
    workspace = open_workspace(project)
    theirs = checkpoint_state(workspace, parent)
    # Every tensor the parent has is frozen, so after training the child's must equal the parent's
    # exactly: they were loaded, not initialised (the seeds match, but the parent trained 4 steps).
    config = child_config(tmp_path, freeze=parent_prefixes(theirs))
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(config),
                                 "--init-from", parent, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["init_from"]["run"] == parent and summary["init_from"]["data"] == "quickstart.sequences@0"
    assert summary["init_from"]["loaded"] == len(theirs) and set(summary["init_from"]["new"]) == NEW_HEAD
    assert summary["init_from"]["unused"] == [] and len(summary["frozen"]) > 0

    ours = checkpoint_state(workspace, summary["run_id"])
    assert set(ours) == set(theirs) | NEW_HEAD
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    run = tracking_client(workspace).get_run(summary["run_id"])
    tags = run.data.tags
    assert tags["lumos.init_from.run"] == parent and tags["lumos.init_from.data"] == "quickstart.sequences@0"
    assert tags["lumos.init_from.checkpoint"] == "checkpoints/step-00000004"
    assert run.data.params["init_from"] == parent  # the resolved config names the run


def test_freeze_keeps_the_named_parameters_and_trains_the_rest(project, parent, tmp_path):
    workspace = open_workspace(project)
    theirs = checkpoint_state(workspace, parent)
    child = train(from_dict(TrainConfig, {**TINY, "init_from": parent, "freeze": ["encoder", "token_embeddings"]}),
                  workspace)
    ours = checkpoint_state(workspace, child.run_id)
    frozen = [name for name in theirs if name.startswith(("encoder.", "token_embeddings."))]
    assert frozen and sorted(child.frozen) == sorted(frozen)
    for name in frozen:
        assert torch.equal(ours[name], theirs[name]), name
    assert not torch.equal(ours["decoder_ln.weight"], theirs["decoder_ln.weight"])  # the rest trained


def test_a_shape_mismatch_exits_2_naming_the_tensor_and_leaves_no_run(project, parent, tmp_path):
    workspace = open_workspace(project)
    before = run_count(workspace)
    config = child_config(tmp_path, model__d_ff=24)
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(config), "--init-from", parent])
    assert result.exit_code == 2, result.output
    assert "encoder.0.mlp.fc.weight: the parent's is (16, 8), the child's (24, 8)" in result.stderr
    assert "model.d_ff = 16 in the parent, 24 here" in result.stderr
    assert run_count(workspace) == before


def test_an_unknown_freeze_prefix_exits_2_and_leaves_no_run(project, parent, tmp_path):
    workspace = open_workspace(project)
    before = run_count(workspace)
    config = child_config(tmp_path, init_from=parent, freeze=["encoder", "encodr"])
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "'encodr' names no parameter" in result.stderr
    assert run_count(workspace) == before


@pytest.mark.slow  # two gloo ranks: about a minute on two shared cores
def test_init_from_on_two_ranks_loads_on_every_rank(project, parent):
    workspace = open_workspace(project)
    theirs = checkpoint_state(workspace, parent)
    everything_but_log_variance = [prefix for prefix in parent_prefixes(theirs) if prefix != "log_variance.retrieval"]
    child = train(from_dict(TrainConfig, {**TINY, "init_from": parent, "freeze": everything_but_log_variance}),
                  workspace, nproc=2)
    ours = checkpoint_state(workspace, child.run_id)
    for name in theirs:
        if not name.startswith("log_variance"):
            assert torch.equal(ours[name], theirs[name]), name


def test_init_from_a_registered_alias_and_the_trace_names_the_parent(project, parent):
    workspace = open_workspace(project)
    client = tracking_client(workspace)
    client.create_registered_model("pretrained")
    version = client.create_model_version("pretrained", f"runs:/{parent}/model", run_id=parent)
    client.set_registered_model_alias("pretrained", "base", version.version)
    child = train(from_dict(TrainConfig, {**TINY, "init_from": "pretrained@base", "freeze": ["encoder"]}), workspace)
    assert child.init_from.run == parent and child.init_from.model == "pretrained/1"
    run = client.get_run(child.run_id)
    assert run.data.tags["lumos.init_from.model"] == "pretrained/1" and run.data.params["init_from"] == parent

    # A grandchild: the trace follows the chain back through the child to the pretrained run.
    grandchild = train(from_dict(TrainConfig, {**TINY, "init_from": child.run_id}), workspace)
    snapshot = model_snapshot(workspace, ModelVersionInfo("finetuned", 1, grandchild.run_id, ()),
                              client.get_run(grandchild.run_id))
    chain = snapshot["run"]["init_from"]
    assert [(entry["run"], entry["data"], entry["exists"]) for entry in chain] == [
        (child.run_id, "quickstart.sequences@0", True), (parent, "quickstart.sequences@0", True)]
    assert chain[1]["model"] == "pretrained/1"


@pytest.mark.slow  # an ingest and a training run rebuilt: about a minute
def test_reproduce_of_a_child_starts_from_the_same_parent_and_refuses_a_moved_one(project, parent):
    workspace = open_workspace(project)
    child = train(from_dict(TrainConfig, {**TINY, "init_from": parent, "freeze": ["encoder"]}), workspace).run_id
    result = runner.invoke(app, ["--workspace", str(project), "reproduce", child, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["matches"] and summary["mode"] == "exact" and summary["parent_run_id"] == parent

    client = tracking_client(workspace)
    client.set_tag(parent, "lumos.checkpoint", "checkpoints/step-00000002")  # as if the parent were resumed
    try:
        moved = runner.invoke(app, ["--workspace", str(project), "reproduce", child])
    finally:
        client.set_tag(parent, "lumos.checkpoint", "checkpoints/step-00000004")
    assert moved.exit_code == 2, moved.output
    assert f"parent run {parent} of {child} has moved on" in moved.stderr


@pytest.mark.slow  # a second ingest: about a minute
def test_data_with_other_vocabularies_exits_2_naming_the_feature(project, parent, ingest_quickstart):
    workspace = open_workspace(project)
    ingest_quickstart(project, SyntheticSpec(users=200, events=8_000, seed=4), max_len=20)  # other events
    latest = open_sequences(workspace, TableRef.parse("quickstart.sequences")).ref
    before = run_count(workspace)
    config = child_config(project, data__table=str(latest))
    result = runner.invoke(app, ["--workspace", str(project), "train", "--config", str(config), "--init-from", parent])
    assert result.exit_code == 2, result.output
    assert f"number tokens differently from {latest}" in result.stderr
    assert "\n  item: token " in result.stderr
    assert run_count(workspace) == before
