"""Eval gates, leaderboards and promote requirements on NaN and on lower-is-better metrics, with a
real SQLite MLflow store (no Spark, no model: the scores are the input)."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict
from lumos.core.errors import ConfigError
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.eval.evaluate import gate_failures
from lumos.eval.leaderboard import Subject, leaderboard, record
from lumos.eval.promote import check_requirements, eval_results, parse_requirement
from lumos.eval.tasks import TaskSpec

NAN = float("nan")


def spend_task(**fields) -> TaskSpec:
    return from_dict(TaskSpec, {"name": "spend_7d", "kind": "regression", "primary_metric": "mae", **fields})


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """One SQLite store for the module (creating one costs seconds); tests keep apart by task name."""
    return open_workspace(tmp_path_factory.mktemp("gates"))


def training_run(workspace) -> str:
    client = tracking_client(workspace)
    experiment = client.get_experiment_by_name("train") or client.get_experiment(client.create_experiment("train"))
    return client.create_run(experiment.experiment_id).info.run_id


# -- NaN ------------------------------------------------------------------------------------------


def test_a_nan_metric_fails_task_thresholds_in_both_directions_and_fail_below():
    failures = gate_failures({"ndcg@10": 0.01, "mae": 100.0}, {"hr@10": 0.0}, {"ndcg@10": NAN, "mae": NAN, "hr@10": NAN})
    assert len(failures) == 3 and all("nan" in failure for failure in failures)


def test_a_nan_metric_fails_every_promote_requirement():
    results = {"spend_7d": {"mae": NAN}}
    requirements = [parse_requirement(f"spend_7d:mae{op}1e9") for op in (">=", "<=", ">", "<")]
    passed, failed = check_requirements(requirements, results)
    assert passed == [] and len(failed) == 4


def test_non_finite_bars_are_refused_with_their_key(tmp_path):
    with pytest.raises(ConfigError, match="thresholds"):
        spend_task(thresholds={"mae": NAN})
    result = CliRunner().invoke(app, ["--workspace", str(tmp_path), "eval", "--task", "spend_7d", "--run", "r",
                                      "--fail-below", "hr@10=nan"])
    assert result.exit_code == 2 and "--fail-below" in result.output


def test_nan_results_are_logged_and_rank_last(workspace):
    spec = spend_task(name="nan_last")
    client = tracking_client(workspace)
    training = training_run(workspace)
    for label, mae in (("nan", NAN), ("worse", 3.0), ("best", 1.0)):
        record(workspace, spec, Subject(key=f"run:{label}", label=label, run_id=training if label == "nan" else None),
               "quickstart.sequences@0", {"mae": mae, "rmse": 2.0}, rows=10)
    entries = leaderboard(workspace, spec)
    assert [entry.label for entry in entries] == ["best", "worse", "nan"]
    assert math.isnan(entries[-1].metrics["mae"])  # logged, not skipped
    assert math.isnan(eval_results(client.get_run(training))["nan_last"]["mae"])


# -- lower is better ------------------------------------------------------------------------------


def test_leaderboard_ranks_lower_is_better_metrics_ascending_and_the_task_direction_overrides(workspace):
    spec = spend_task(name="ascending")
    for label, mae in (("middle", 2.0), ("worst", 5.0), ("best", 0.5)):
        record(workspace, spec, Subject(key=f"run:{label}", label=label), "quickstart.sequences@0",
               {"mae": mae, "rmse": 1.0}, rows=10)
    assert [entry.label for entry in leaderboard(workspace, spec)] == ["best", "middle", "worst"]
    flipped = spend_task(name="ascending", direction="max")
    assert [entry.label for entry in leaderboard(workspace, flipped)] == ["worst", "middle", "best"]
    assert [entry.label for entry in leaderboard(workspace, spec, top=2)] == ["best", "middle"]


def test_task_thresholds_are_ceilings_for_lower_is_better_metrics():
    thresholds = {"mae": 2.0, "log_loss": 0.5, "auc_roc": 0.6}
    assert gate_failures(thresholds, {}, {"mae": 2.0, "log_loss": 0.4, "auc_roc": 0.6}) == []
    failures = gate_failures(thresholds, {}, {"mae": 2.5, "log_loss": 0.6, "auc_roc": 0.7})
    assert [failure.split(" ")[0] for failure in failures] == ["mae", "log_loss"]
    assert len(gate_failures(thresholds, {}, {"mae": 1.0, "log_loss": 0.1})) == 1  # a missing metric fails


@pytest.mark.parametrize(("requirement", "passes"), [
    ("spend_7d:mae<=2.0", True), ("spend_7d:mae<=1.9", False),
    ("spend_7d:mae<2.1", True), ("spend_7d:mae<2.0", False),
    ("spend_7d:mae>1.0", True), ("spend_7d:mae>2.0", False),
    ("spend_7d:mae>=2.0", True), ("spend_7d:mae>=2.1", False),
])
def test_promote_gates_on_an_existing_lower_is_better_result(workspace, requirement, passes):
    client = tracking_client(workspace)
    training = training_run(workspace)
    record(workspace, spend_task(), Subject(key=f"run:{training}", label="run", run_id=training),
           "quickstart.sequences@0", {"mae": 2.0, "rmse": 3.0}, rows=10)
    passed, failed = check_requirements([parse_requirement(requirement)], eval_results(client.get_run(training)))
    assert (len(passed), len(failed)) == ((1, 0) if passes else (0, 1))
