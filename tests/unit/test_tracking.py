"""The workspace's MLflow store: every artifact under the workspace, the Default experiment's too."""

from __future__ import annotations

from pathlib import Path

from lumos.core.tracking import ensure_experiment, source_tags, tracking_client
from lumos.core.workspace import open_workspace


def test_every_experiment_keeps_its_artifacts_in_the_workspace(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's default would put the Default experiment's mlruns/0 here
    workspace = open_workspace(project)
    client = tracking_client(workspace)
    ensure_experiment(client, workspace, "lumos-eval/next_item", description="the **leaderboard**")
    experiments = client.search_experiments()
    assert {experiment.name for experiment in experiments} == {"Default", "lumos-eval/next_item"}
    for experiment in experiments:
        assert Path(experiment.artifact_location.removeprefix("file://")).is_relative_to(project), experiment
    assert client.get_experiment_by_name("lumos-eval/next_item").tags["mlflow.note.content"] == "the **leaderboard**"
    assert not list(elsewhere.iterdir())


def test_source_tags_name_the_command_user_and_commit():
    commit = "0123456789abcdef0123456789abcdef01234567"
    tags = source_tags("train", f"{commit}+dirty")
    assert tags["mlflow.source.name"] == "lumos train" and tags["mlflow.user"]
    assert tags["mlflow.source.git.commit"] == commit
    assert "mlflow.source.git.commit" not in source_tags("train", "0.1.0")  # a package version is no commit
