"""`lumos sweep`: one training recipe over a grid of overrides and several seeds, as nested MLflow runs.

    lumos sweep --config train.toml --grid optim.lr=1e-3,2e-3 --grid model.dropout=0.1,0.3 --seeds 0 1 2

- **Points**: the cartesian product of the grids, in the order given; each point trains once per
  seed. Every child config is checked before anything trains (bad keys and values exit 2 at once).
- **Runs**: a parent run in the recipe's experiment (tag lumos.stage = sweep) and one child per
  point and seed, nested under it with MLflow's mlflow.parentRunId tag.
- **Resumable**: the parent is found again by the sweep's hash (recipe, grids, seeds); a finished
  child with the same config hash is kept, so an interrupted sweep reruns only what is missing.
- **Summary**: mean ± std over seeds of the valid metric per point (the best valid retrieval
  metric when run.valid_metric is set, else the final valid loss), best point first.
- **Eval**: optionally the best point's seeds are scored on the test tasks (leaderboard entries).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from lumos.core.config import config_hash, from_dict, read_toml
from lumos.core.errors import ConfigError, GateError, Problem, UsageError
from lumos.core.progress import Report
from lumos.core.runs import STAGE_TAG
from lumos.core.tracking import ensure_experiment, tracking_client
from lumos.core.workspace import Workspace
from lumos.train.config import TrainConfig

PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag: the UI shows children under the parent
SWEEP_TAG = "lumos.sweep"
STAGE = "sweep"


@dataclass(frozen=True)
class Point:
    overrides: tuple[str, ...]
    """The grid's KEY=VALUE overrides of this point."""

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or "(recipe as is)"


@dataclass
class PointSummary:
    point: Point
    runs: dict[int, str]
    """seed → child run id."""
    values: dict[int, float]
    """seed → the metric (missing when a run logged none)."""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values.values()) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values.values()) if len(self.values) > 1 else 0.0


@dataclass
class SweepResult:
    parent_run_id: str
    experiment: str
    metric: str
    direction: str
    points: list[PointSummary]
    """Best point first."""
    trained: int
    skipped: int
    failed: list[str] = field(default_factory=list)
    evaluation: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    """--eval: task → metric → (mean, std) over the best point's seeds."""


def parse_grid(items: list[str]) -> list[list[str]]:
    """["optim.lr=1e-3,2e-3", …] → [["optim.lr=1e-3", "optim.lr=2e-3"], …]."""
    grids, keys = [], set()
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        choices = [value.strip() for value in values.split(",") if value.strip()]
        if not sep or not key or not choices:
            raise UsageError(f"--grid {item!r}: expected KEY=V1,V2,…, e.g. optim.lr=1e-3,2e-3")
        if key in keys:
            raise UsageError(f"--grid {key} is given twice; list all its values in one --grid")
        keys.add(key)
        grids.append([f"{key}={value}" for value in choices])
    return grids


def plan_configs(config_path: Path, grids: list[list[str]], seeds: list[int], overrides: list[str] = ()) -> dict[Point, dict[int, TrainConfig]]:
    """Every child config, checked: all problems of all points in one ConfigError."""
    if not seeds:
        raise UsageError("--seeds: give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise UsageError("--seeds: a seed is given twice")
    raw = read_toml(config_path)
    plan: dict[Point, dict[int, TrainConfig]] = {}
    problems: list[Problem] = []
    for combination in itertools.product(*grids):
        point = Point(tuple(combination))
        for seed in seeds:
            try:
                config = from_dict(TrainConfig, raw, source=str(config_path),
                                   overrides=[*overrides, *combination, f"run.seed={seed}"])
            except ConfigError as error:
                problems += [problem for problem in error.problems if problem not in problems]
                continue
            plan.setdefault(point, {})[seed] = config
    if problems:
        raise ConfigError(f"{config_path} (with the sweep's grid)", problems)
    return plan


def sweep(
    workspace: Workspace,
    config_path: Path,
    grid: list[str],
    seeds: list[int],
    overrides: list[str] = (),
    parallel: int = 1,
    evaluate_best: bool = False,
    tasks_dir: Path | None = None,
    report: Report = lambda _: None,
) -> SweepResult:
    if parallel < 1:
        raise UsageError("--parallel must be at least 1")
    grids = parse_grid(grid)
    plan = plan_configs(config_path, grids, seeds, list(overrides))
    base = next(iter(next(iter(plan.values())).values()))
    metric, direction = _valid_metric(base)
    sweep_hash = _sweep_hash(config_path, grids, seeds, overrides)
    client = tracking_client(workspace)
    experiment_id = ensure_experiment(client, workspace, base.run.experiment)
    parent = _parent_run(client, experiment_id, sweep_hash, grids, seeds, config_path)
    done = _finished_children(client, experiment_id, parent)

    todo = [(point, seed, config) for point, by_seed in plan.items() for seed, config in by_seed.items()
            if config_hash(config) not in done]
    skipped = sum(len(by_seed) for by_seed in plan.values()) - len(todo)
    report(f"sweep {parent}: {len(plan)} point(s) × {len(seeds)} seed(s); {skipped} finished already, {len(todo)} to train")
    failed = []
    status = "FAILED"
    try:
        for (point, seed, config), outcome in zip(todo, _train_all(workspace, [c for _, _, c in todo], parallel, report), strict=True):
            if isinstance(outcome, str) and outcome.startswith("error:"):
                failed.append(f"{point.label} seed {seed}: {outcome.removeprefix('error: ')}")
                continue
            client.set_tag(outcome, PARENT_TAG, parent)
            client.set_tag(outcome, f"{SWEEP_TAG}.point", point.label)
            client.set_tag(outcome, f"{SWEEP_TAG}.config_hash", config_hash(config))
            done[config_hash(config)] = outcome
        status = "FINISHED" if not failed else "FAILED"
    finally:
        client.set_terminated(parent, status)

    summaries = []
    for point, by_seed in plan.items():
        runs = {seed: done[config_hash(config)] for seed, config in by_seed.items() if config_hash(config) in done}
        values = {}
        for seed, run_id in runs.items():
            value = client.get_run(run_id).data.metrics.get(metric.replace("@", "_at_"))
            if value is not None and not math.isnan(value):
                values[seed] = value
        summaries.append(PointSummary(point, runs, values))
    sign = -1.0 if direction == "max" else 1.0
    summaries.sort(key=lambda s: (not s.values, sign * s.mean if s.values else 0.0))
    result = SweepResult(parent, base.run.experiment, metric, direction, summaries, len(todo) - len(failed), skipped, failed)
    if summaries and summaries[0].values:
        client.set_tag(parent, f"{SWEEP_TAG}.best_point", summaries[0].point.label)
        client.log_metric(parent, f"best/{metric.replace('@', '_at_')}", summaries[0].mean)
    if evaluate_best and summaries and summaries[0].runs:
        result.evaluation = _evaluate_seeds(workspace, list(summaries[0].runs.values()), tasks_dir, report)
    return result


def _train_all(workspace: Workspace, configs: list[TrainConfig], parallel: int, report: Report) -> list[str]:
    """Run ids (or "error: …") in the order of `configs`; `parallel` children at once in their own processes."""
    if parallel == 1:
        return [_train_one(workspace, config, report) for config in configs]
    import concurrent.futures
    import multiprocessing

    threads = max(1, (os.cpu_count() or 1) // parallel)  # children share the cores, as DDP ranks do
    context = multiprocessing.get_context("spawn")  # no forked torch or SQLite state
    with concurrent.futures.ProcessPoolExecutor(parallel, mp_context=context) as pool:
        futures = [pool.submit(_train_in_process, workspace, config, threads) for config in configs]
        outcomes = []
        for config, future in zip(configs, futures, strict=True):
            outcomes.append(future.result())
            report(f"seed {config.run.seed}: {outcomes[-1]}")
        return outcomes


def _train_one(workspace: Workspace, config: TrainConfig, report: Report) -> str:
    from lumos.core.errors import LumosError
    from lumos.train.run import train

    report(f"training seed {config.run.seed}: {config_hash(config)[:19]}")
    try:
        return train(config, workspace).run_id
    except LumosError as error:
        return f"error: {error}"


def _train_in_process(workspace: Workspace, config: TrainConfig, threads: int) -> str:
    import torch

    torch.set_num_threads(threads)
    return _train_one(workspace, config, lambda _: None)


def _valid_metric(config: TrainConfig) -> tuple[str, str]:
    if config.data.valid_split is None:
        raise UsageError("a sweep ranks points on the valid split; set data.valid_split in the recipe")
    if config.run.valid_metric:
        return f"valid/best_{config.run.valid_metric}", "max"
    return "valid/loss", "min"


def _sweep_hash(config_path: Path, grids: list[list[str]], seeds: list[int], overrides) -> str:
    identity = {"recipe": read_toml(config_path), "grid": grids, "seeds": seeds, "overrides": list(overrides)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _parent_run(client, experiment_id: str, sweep_hash: str, grids, seeds, config_path: Path) -> str:
    """The sweep's parent run: the earlier one of the same sweep when there is one (resume)."""
    earlier = client.search_runs([experiment_id], filter_string=f"tags.`{SWEEP_TAG}.hash` = '{sweep_hash}'",
                                 order_by=["attributes.start_time ASC"], max_results=1)
    if earlier:
        client.update_run(earlier[0].info.run_id, status="RUNNING")
        return earlier[0].info.run_id
    tags = {STAGE_TAG: STAGE, f"{SWEEP_TAG}.hash": sweep_hash, f"{SWEEP_TAG}.grid": json.dumps(grids),
            f"{SWEEP_TAG}.seeds": json.dumps(seeds), f"{SWEEP_TAG}.config": str(config_path)}
    return client.create_run(experiment_id, run_name=f"sweep-{sweep_hash[:8]}", tags=tags).info.run_id


def _finished_children(client, experiment_id: str, parent: str) -> dict[str, str]:
    """config hash → run id of the parent's finished children."""
    children = client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'", max_results=5000)
    return {run.data.tags[f"{SWEEP_TAG}.config_hash"]: run.info.run_id for run in children
            if run.info.status == "FINISHED" and f"{SWEEP_TAG}.config_hash" in run.data.tags}


def _evaluate_seeds(workspace: Workspace, run_ids: list[str], tasks_dir: Path | None, report: Report):
    from lumos.eval.evaluate import evaluate, resolve_subject
    from lumos.eval.leaderboard import metric_name
    from lumos.eval.tasks import load_tasks, task_folders

    tasks = list(load_tasks([tasks_dir] if tasks_dir else task_folders(workspace.project_dir)).values())
    if not tasks:
        raise UsageError("--eval: no tasks found; add task specs to tasks/ or pass --tasks")
    client = tracking_client(workspace)
    scores: dict[str, dict[str, list[float]]] = {}
    for run_id in run_ids:
        report(f"evaluating {run_id} on {len(tasks)} task(s)")
        try:
            evaluate(workspace, tasks, resolve_subject(workspace, run_id, None), report=report)
        except GateError as error:
            report(f"{run_id}: {error}")  # thresholds are the promote gate's business; the scores are logged
        # Read back what eval logged into the run (eval/<task>/<metric>), gates missed or not.
        for key, value in client.get_run(run_id).data.metrics.items():
            if key.startswith("eval/"):
                _, task, name = key.split("/", 2)
                scores.setdefault(task, {}).setdefault(metric_name(name), []).append(value)
    return {task: {name: (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
                   for name, values in sorted(metrics.items())} for task, metrics in sorted(scores.items())}
