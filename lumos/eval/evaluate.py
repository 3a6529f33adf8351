"""`lumos eval`: score a training run or a registered model on tasks and record leaderboard entries.

Each task also refreshes its "no model" baseline entry for the same data version, so every
leaderboard shows what a model has to beat. Gates (the task's thresholds and --fail-below bars)
are checked after everything is logged; a miss raises GateError (exit code 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lumos.core.errors import GateError
from lumos.core.progress import Report
from lumos.core.runs import resolve_run
from lumos.core.tables import TableRef
from lumos.core.workspace import Workspace
from lumos.data.sequences_version import SequencesVersion, open_sequences
from lumos.eval.embeddings import EmbeddingCache
from lumos.eval.leaderboard import Subject, record
from lumos.eval.metrics import direction
from lumos.eval.score import Scores, has_baseline, score_baselines, score_model
from lumos.eval.sides import side_metrics, user_sides
from lumos.eval.tasks import LoadedTask
from lumos.train.trained_model import load_training_run


@dataclass
class TaskResult:
    task: str
    data: str
    metrics: dict[str, float]
    rows: int
    eval_run_id: str
    baseline: str | None = None
    baseline_metrics: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    """Std over folds of each metric, for kinds that score over folds (mean ± spread)."""
    baseline_spread: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def resolve_subject(workspace: Workspace, run_id: str | None, model: str | None) -> Subject:
    """The leaderboard subject for --run RUN_ID or --model NAME@alias (a Lumos training run either way)."""
    resolved = resolve_run(workspace, run_id, model)
    run = resolved.run
    if resolved.version is not None:
        label = resolved.version.label
        return Subject(key=f"model:{label}", label=label, run_id=run.info.run_id, model=label)
    return Subject(key=f"run:{run.info.run_id}", label=run.info.run_name or run.info.run_id, run_id=run.info.run_id)


def evaluate(
    workspace: Workspace,
    tasks: list[LoadedTask],
    subject: Subject,
    fail_below: dict[str, float] | None = None,
    report: Report = lambda _: None,
) -> list[TaskResult]:
    # One pass over many tasks: the model is loaded once, each named table resolved once, and the
    # user embeddings computed once per (data version, split) for all the probe tasks that read them.
    model = _load_run_model(workspace, subject.run_id)
    opened: dict[str, SequencesVersion] = {}
    embeddings = EmbeddingCache()
    results = []
    for task in tasks:
        spec = task.spec
        if spec.data not in opened:
            opened[spec.data] = open_sequences(workspace, TableRef.parse(spec.data))
        data = opened[spec.data]
        report(f"{spec.name}: scoring {data.ref} split {spec.split}")
        scores = score_model(model, task, data, embeddings)
        sides = side_metrics(spec, lambda share, task=task, data=data: score_model(model, task, data.side(share), embeddings).metrics)
        eval_run_id = record(workspace, spec, subject, str(data.ref), logged_metrics(scores) | sides, scores.rows)
        result = TaskResult(spec.name, str(data.ref), scores.metrics, scores.rows, eval_run_id, spread=scores.spread)
        if has_baseline(task):
            baselines = score_baselines(task, data)  # the main one first: `lumos eval` prints it beside the model
            (result.baseline, main), *_ = baselines
            result.baseline_metrics, result.baseline_spread = main.metrics, main.spread
            by_side = {share.side: score_baselines(task, data.side(share)) for share in user_sides(spec)}
            for position, (name, baseline) in enumerate(baselines):
                sides = side_metrics(spec, lambda share, position=position, by_side=by_side: by_side[share.side][position][1].metrics)
                record(workspace, spec, Subject(key=f"baseline:{name}", label=f"baseline: {name}"),
                       str(data.ref), logged_metrics(baseline) | sides, baseline.rows)
        result.failures = gate_failures(spec.thresholds, fail_below or {}, scores.metrics)
        results.append(result)
    failures = [f"{result.task}: {failure}" for result in results for failure in result.failures]
    if failures:
        raise GateError("below the bar (results are logged):\n  " + "\n  ".join(failures))
    return results


def logged_metrics(scores: Scores) -> dict[str, float]:
    """What a leaderboard entry logs: the metrics, and beside each one scored over folds its std."""
    return scores.metrics | {f"{name}_std": value for name, value in scores.spread.items()}


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
    return load_training_run(workspace, run_id).model
