"""`lumos promote`: register a training run as a model version behind eval gates and move an alias.

Gates read the scores `lumos eval` logged into the training run (eval/TASK/METRIC), so promotion
needs nothing but the tracking store. The version's tags copy the run's lineage and its eval
results, so the registry alone says what data, recipe and config made the model and how it scored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lumos.core.errors import GateError, UsageError
from lumos.core.faults import fault_point
from lumos.core.registry import (
    ModelVersionInfo,
    check_model_name,
    model_versions,
    register_version,
    resolve_model,
    set_alias,
    version_for_run,
)
from lumos.core.runs import (
    CHECKPOINT_TAG,
    EVAL_TAG_PREFIX,
    LINEAGE_TAGS,
    MODEL_URI_TAG,
    RUN_TAG,
    get_run,
    training_run_problem,
)
from lumos.core.workspace import Workspace
from lumos.eval.leaderboard import metric_name, mlflow_key
from lumos.train.trained_model import load_training_run

_REQUIREMENT = re.compile(r"^(?P<task>[^:\s]+):(?P<metric>[^<>=\s]+)\s*(?P<op>>=|<=|>|<)\s*(?P<value>[-+0-9.eE]+)$")
_COMPARE = {">=": float.__ge__, "<=": float.__le__, ">": float.__gt__, "<": float.__lt__}


@dataclass(frozen=True)
class Requirement:
    task: str
    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.task}:{self.metric}{self.op}{self.value:g}"


@dataclass
class PromoteResult:
    name: str
    alias: str
    version: int
    run_id: str
    reused_version: bool
    """True when the run was already registered under `name` (its version was reused)."""
    previous_version: int | None
    """The version the alias pointed at before, if any."""
    checks: list[str] = field(default_factory=list)
    """The requirements that were checked, with the measured values."""
    dry_run: bool = False


def parse_requirement(text: str) -> Requirement:
    match = _REQUIREMENT.match(text.strip())
    if not match:
        raise UsageError(f"--require {text!r}: expected TASK:METRIC>=VALUE (or <=, >, <), e.g. next_item:ndcg@10>=0.1")
    try:
        value = float(match["value"])
    except ValueError:
        raise UsageError(f"--require {text!r}: {match['value']!r} is not a number") from None
    return Requirement(match["task"], match["metric"], match["op"], value)


def eval_results(run) -> dict[str, dict[str, float]]:
    """task → metric → value, from the eval/TASK/METRIC metrics of a training run."""
    results: dict[str, dict[str, float]] = {}
    for key, value in run.data.metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "eval":
            results.setdefault(parts[1], {})[metric_name(parts[2])] = value
    return results


def check_requirements(requirements: list[Requirement], results: dict[str, dict[str, float]]) -> tuple[list[str], list[str]]:
    """(passed, failed) descriptions; a task or metric without a result fails."""
    passed, failed = [], []
    for requirement in requirements:
        task_results = results.get(requirement.task)
        if task_results is None:
            failed.append(f"{requirement}: no eval result for task {requirement.task!r}; "
                          f"run `lumos eval --task {requirement.task} --run RUN_ID` first")
            continue
        value = task_results.get(requirement.metric)
        if value is None:
            failed.append(f"{requirement}: task {requirement.task} has no metric {requirement.metric!r} "
                          f"(it has {', '.join(sorted(task_results))})")
        elif _COMPARE[requirement.op](float(value), requirement.value):
            passed.append(f"{requirement}: {value:.4f}")
        else:
            failed.append(f"{requirement}: measured {value:.4f}")
    return passed, failed


def promote(
    workspace: Workspace,
    name: str,
    alias: str,
    run_id: str | None = None,
    version: int | None = None,
    requirements: list[Requirement] = (),
    dry_run: bool = False,
) -> PromoteResult:
    """Point `name@alias` at the version made from `run_id` (registering it when new), or at an
    existing `version` (a rollback). Raises GateError (exit 3) when a requirement is not met."""
    check_model_name(name)
    if (run_id is None) == (version is None):
        raise UsageError("name what to promote: a RUN_ID, or --version V to move the alias to an existing version")
    existing = None
    if version is not None:
        existing = resolve_model(workspace, f"{name}/{version}", "--version")
        run_id = existing.run_id
    run = _finished_training_run(workspace, run_id)
    results = eval_results(run)
    passed, failed = check_requirements(list(requirements), results)
    if failed:
        raise GateError(f"not promoting run {run_id} to {name}@{alias}:\n  " + "\n  ".join(failed))
    # A truncated or garbled checkpoint would be found only by the first infer that serves it:
    # load it once now (CorruptCheckpoint, exit 1, names the file), before the alias moves.
    load_training_run(workspace, run_id)

    previous = _alias_target(workspace, name, alias)
    existing = existing or version_for_run(workspace, name, run_id)
    result = PromoteResult(name=name, alias=alias, version=existing.version if existing else 0, run_id=run_id,
                           reused_version=existing is not None, previous_version=previous, checks=passed,
                           dry_run=dry_run)
    if dry_run:
        return result
    if existing is None:
        tags = {key: run.data.tags[key] for key in LINEAGE_TAGS if key in run.data.tags}
        tags[RUN_TAG] = run_id
        for task, metrics in results.items():
            for metric, value in metrics.items():
                tags[f"{EVAL_TAG_PREFIX}{task}.{mlflow_key(metric)}"] = f"{value:.6g}"
        # The logged MLflow model (signature, no pickle) when the run has one; else the checkpoint folder.
        source = run.data.tags.get(MODEL_URI_TAG) or f"runs:/{run_id}/{run.data.tags[CHECKPOINT_TAG]}"
        existing = register_version(workspace, name, run_id, source, tags, _version_description(run, results))
        result.version = existing.version
    # Killed here, the registry holds the new version and the alias still names the old one; a
    # rerun finds the version (version_for_run) and only moves the alias.
    fault_point("promote.alias")
    set_alias(workspace, name, alias, result.version)
    return result


def _finished_training_run(workspace: Workspace, run_id: str):
    """The run, or exit 2 when it does not exist and exit 3 when it is not a finished Lumos training run."""
    run = get_run(workspace, run_id, "RUN_ID")
    problem = training_run_problem(run, finished=True)
    if problem:
        raise GateError(f"run {run_id} is {problem}; only a finished Lumos training run with a checkpoint can be promoted")
    return run


def _version_description(run, results: dict[str, dict[str, float]]) -> str:
    """Markdown shown at the top of the model version page: lineage first, then the eval scores
    (the version's tags carry the same facts, but MLflow lists them alphabetically)."""
    tags = run.data.tags
    lines = [f"From training run `{run.info.run_name}` (`{run.info.run_id}`).", "", "| lineage | |", "|---|---|"]
    lines += [f"| {key.removeprefix('lumos.')} | `{tags[key]}` |" for key in LINEAGE_TAGS if key in tags]
    if results:
        lines += ["", "| eval | metric | value |", "|---|---|---|"]
        lines += [f"| {task} | {metric} | {value:.4f} |" for task, metrics in sorted(results.items())
                  for metric, value in sorted(metrics.items())]
    return "\n".join(lines)


def _alias_target(workspace: Workspace, name: str, alias: str) -> int | None:
    for version in model_versions(workspace, name):
        if alias in version.aliases:
            return version.version
    return None


def version_json(version: ModelVersionInfo) -> dict:
    return {"name": version.name, "version": version.version, "run_id": version.run_id,
            "aliases": list(version.aliases), "tags": version.tags, "created_at": version.created_at}
