"""`lumos eval`: score a training run or a registered model on tasks and record leaderboard entries.

Each task also refreshes its "no model" baseline entry for the same data version, so every
leaderboard shows what a model has to beat. Gates (the task's thresholds and --fail-below bars)
are checked after everything is logged; a miss raises GateError (exit code 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lumos.core.errors import GateError, UsageError
from lumos.core.tables import TableRef
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace
from lumos.data.sequences_version import open_sequences
from lumos.eval.leaderboard import Subject, record
from lumos.eval.metrics import direction
from lumos.eval.score import score_baseline, score_model
from lumos.eval.tasks import LoadedTask
from lumos.train.checkpoint import load_model
from lumos.train.run import download_checkpoint, training_run

Report = Callable[[str], None]


@dataclass
class TaskResult:
    task: str
    data: str
    metrics: dict[str, float]
    rows: int
    eval_run_id: str
    baseline: str | None = None
    baseline_metrics: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def resolve_subject(workspace: Workspace, run_id: str | None, model: str | None) -> Subject:
    """The training run behind --run or --model NAME@alias, checked to be a finished Lumos run."""
    import mlflow

    client = tracking_client(workspace)
    model_label = None
    if model is not None:
        name, _, alias = model.partition("@")
        if not name or not alias:
            raise UsageError(f"--model {model!r}: expected NAME@alias, e.g. quickstart@production")
        try:
            version = client.get_model_version_by_alias(name, alias)
        except mlflow.exceptions.MlflowException:
            raise UsageError(f"--model {model}: no registered model {name!r} with alias {alias!r}") from None
        run_id, model_label = version.run_id, f"{name}/{version.version}"
    if run_id is None:
        raise UsageError("name what to evaluate: --run RUN_ID or --model NAME@alias")
    run = training_run(workspace, run_id, "--run")
    label = model_label or run.info.run_name or run_id
    key = f"model:{model_label}" if model_label else f"run:{run_id}"
    return Subject(key=key, label=label, run_id=run_id, model=model_label)


def evaluate(
    workspace: Workspace,
    tasks: list[LoadedTask],
    subject: Subject,
    fail_below: dict[str, float] | None = None,
    report: Report = lambda _: None,
) -> list[TaskResult]:
    model = _load_run_model(workspace, subject.run_id)
    results = []
    for task in tasks:
        spec = task.spec
        data = open_sequences(workspace, TableRef.parse(spec.data))
        report(f"{spec.name}: scoring {data.ref} split {spec.split}")
        scores = score_model(model, task, data)
        eval_run_id = record(workspace, spec, subject, str(data.ref), scores.metrics, scores.rows)
        result = TaskResult(spec.name, str(data.ref), scores.metrics, scores.rows, eval_run_id)
        if spec.kind != "embedding_probe":
            result.baseline, baseline = score_baseline(task, data)
            result.baseline_metrics = baseline.metrics
            record(workspace, spec, Subject(key=f"baseline:{result.baseline}", label=f"baseline: {result.baseline}"),
                   str(data.ref), baseline.metrics, baseline.rows)
        result.failures = gate_failures(spec.thresholds, fail_below or {}, scores.metrics)
        results.append(result)
    failures = [f"{result.task}: {failure}" for result in results for failure in result.failures]
    if failures:
        raise GateError("below the bar (results are logged):\n  " + "\n  ".join(failures))
    return results


def gate_failures(thresholds: dict[str, float], fail_below: dict[str, float], metrics: dict[str, float]) -> list[str]:
    """What misses a bar. A bar is passed only by a number on its good side: a missing or NaN
    value fails (every comparison with NaN is false, so `value < bar` alone would let it through)."""
    failures = []
    for metric, bar in thresholds.items():
        value = metrics.get(metric)
        passed = value is not None and (value >= bar if direction(metric) == "max" else value <= bar)
        if not passed:
            failures.append(f"{metric} = {value} misses the task's threshold {bar}")
    for metric, bar in fail_below.items():
        value = metrics.get(metric)
        if value is None or not value >= bar:
            failures.append(f"{metric} = {value} is below --fail-below {bar}")
    return failures


def _load_run_model(workspace: Workspace, run_id: str):
    model, _ = load_model(download_checkpoint(workspace, run_id, "--run"))
    return model
