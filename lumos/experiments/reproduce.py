"""`lumos reproduce RUN_ID`: rebuild a training run from its lineage alone and show that it matches.

1. **Lineage**: the run's lineage.json (config, seed, code version, thread count) and the ingest
   lineage in the commit of the sequences version it trained on (recipe, input fingerprints,
   content hash).
2. **Inputs**: every input of that ingest must still exist with the fingerprint it had (files) or
   still be at the version read (Delta); otherwise UsageError (exit 2) naming each change.
3. **Data**: the recorded recipe, with its inputs pinned to the recorded locations, is ingested
   again into a new sequences version; its order-independent content hash must equal the recorded one.
4. **Train**: the recorded config and seed on the rebuilt version, at the recorded thread count
   and number of ranks; the new run is tagged lumos.reproduces = RUN_ID. A run that started from
   a parent's weights (init_from) starts from them again: the parent must still hold the
   checkpoint it read (checked first, exit 2 otherwise).
5. **Eval**: the tasks the run was scored on (its eval/<task>/<metric> metrics), on the rebuilt version.
6. **Compare**: every train/, valid/ and eval/ metric and, in exact mode, the checkpoint's weights.

On CPU with one rank the result must match exactly (same seed, same threads, same data: same
floats). On GPU or with several ranks kernels and reductions are not bit-for-bit repeatable, so
values must agree within `tolerance` (|a - b| <= tolerance * max(1, |a|)).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from lumos.core.config import from_dict
from lumos.core.errors import GateError, UsageError
from lumos.core.lineage import LineageInput, LineageRecord, code_version
from lumos.core.progress import Report
from lumos.core.runs import CHECKPOINT_TAG, DATA_TAG, INIT_CHECKPOINT_TAG, download_checkpoint, training_run
from lumos.core.tables import TableRef, content_hash, hash_algorithm, open_delta_table, read_table
from lumos.core.tracking import tracking_client
from lumos.core.workspace import Workspace
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import ingest_lineage
from lumos.data.sources import fingerprint
from lumos.eval.tasks import LoadedTask, load_tasks, task_folders
from lumos.train.config import TrainConfig
from lumos.train.run import train

COMPARED_PREFIXES = ("train/", "valid/", "eval/")  # results; samples/s, memory and lr schedules are not
REPRODUCES_TAG = "lumos.reproduces"


@dataclass(frozen=True)
class Comparison:
    name: str
    recorded: float | str | None
    reproduced: float | str | None
    match: bool


@dataclass
class ReproduceResult:
    run_id: str
    reproduced_run_id: str
    code_recorded: str
    code_current: str
    data_recorded: str
    data_rebuilt: str
    exact: bool
    """True: values must be equal; False: within `tolerance`."""
    tolerance: float
    comparisons: list[Comparison] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    parent_run_id: str | None = None
    """The run whose weights both runs started from (train.init_from); None for a run from scratch."""

    @property
    def matches(self) -> bool:
        return all(comparison.match for comparison in self.comparisons)

    @property
    def mode(self) -> str:
        return "exact" if self.exact else f"within {self.tolerance:g} × max(1, |recorded|)"

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "reproduced_run_id": self.reproduced_run_id, "matches": self.matches,
                "mode": self.mode, "code": {"recorded": self.code_recorded, "current": self.code_current},
                "data": {"recorded": self.data_recorded, "rebuilt": self.data_rebuilt}, "warnings": self.warnings,
                "parent_run_id": self.parent_run_id,
                "comparisons": [{"name": c.name, "recorded": c.recorded, "reproduced": c.reproduced, "match": c.match}
                                for c in self.comparisons]}


def reproduce(
    workspace: Workspace,
    run_id: str,
    tolerance: float = 0.01,
    tasks_dir: Path | None = None,
    report: Report = lambda _: None,
) -> ReproduceResult:
    """Rebuild `run_id` from its lineage; raises GateError (exit 3) when the result differs."""
    from lumos.core.spark import workspace_spark
    from lumos.data.ingest import run_ingest
    from lumos.eval.evaluate import evaluate, resolve_subject

    if tolerance < 0:
        raise UsageError(f"--tolerance {tolerance}: must be 0 or more")
    run = training_run(workspace, run_id, "RUN_ID")
    lineage = _run_lineage(workspace, run_id)
    config = from_dict(TrainConfig, lineage.config, source=f"lineage.json of run {run_id}")
    recorded_ref = TableRef.parse(run.data.tags[DATA_TAG])
    if config.init_from is not None:
        report(f"checking parent run {config.init_from}")
        check_parent(workspace, run, config.init_from)
    ingest, _ = ingest_lineage(workspace, recorded_ref)
    recipe = from_dict(IngestRecipe, ingest.config, source=f"the recipe in the lineage of {recorded_ref}")

    warnings = []
    current_code = code_version()
    if lineage.code_version != current_code:
        warnings.append(f"the code differs: the run was made by {lineage.code_version}, this is {current_code}")
    report(f"checking the {len(ingest.inputs)} input(s) of {recorded_ref}")
    changed, unverifiable = check_inputs(ingest.inputs)
    if changed:
        raise UsageError(f"the inputs of {recorded_ref} changed since run {run_id} was made; it cannot be rebuilt:\n  "
                         + "\n  ".join(changed))
    warnings += unverifiable

    report(f"rebuilding {recorded_ref} from its recorded recipe")
    spark = workspace_spark(workspace)
    rebuilt = run_ingest(spark, workspace, pin_inputs(recipe, ingest.inputs), Path.cwd(), report, rebuild=True)
    rebuilt_ref = TableRef.parse(rebuilt.tables["sequences"])
    rebuilt_hash = rebuilt.stats["content_hash"]
    recorded_hash = recorded_content_hash(spark, workspace, recorded_ref, ingest.stats.get("content_hash"), rebuilt_hash)
    comparisons = [Comparison("data content hash", recorded_hash, rebuilt_hash, recorded_hash == rebuilt_hash)]

    world_size = int(lineage.stats.get("world_size", 1))
    recorded_on_cuda = bool(lineage.stats.get("cuda", False))
    reproduced_on_cuda = config.run.device != "cpu" and torch.cuda.is_available()
    exact = world_size == 1 and not recorded_on_cuda and not reproduced_on_cuda
    if recorded_on_cuda or reproduced_on_cuda:
        warnings.append("trained on a GPU: values are compared within the tolerance, not exactly")
    config = replace(config, data=replace(config.data, table=str(rebuilt_ref)))
    tasks = _recorded_tasks(workspace, run, tasks_dir, recorded_ref, rebuilt_ref, warnings)
    threads = torch.get_num_threads()
    torch.set_num_threads(int(lineage.stats.get("threads", threads)))  # floats repeat only at the same count
    try:
        report(f"retraining with the recorded config and seed {config.run.seed} on {rebuilt_ref}")
        new_run_id = train(config, workspace, nproc=world_size, report=report).run_id
        client = tracking_client(workspace)
        client.set_tag(new_run_id, REPRODUCES_TAG, run_id)
        if tasks:
            report(f"evaluating {', '.join(task.spec.name for task in tasks)}")
            try:
                evaluate(workspace, tasks, resolve_subject(workspace, new_run_id, None), report=report)
            except GateError:
                pass  # a task threshold missed: the scores are logged, and the comparison is what counts here
    finally:
        torch.set_num_threads(threads)

    evaluated = {f"eval/{task.spec.name}/" for task in tasks}
    reproduced = client.get_run(new_run_id).data.metrics
    for key in sorted(run.data.metrics):
        if not key.startswith(COMPARED_PREFIXES) or (key.startswith("eval/") and not key.startswith(tuple(evaluated))):
            continue
        value, again = run.data.metrics[key], reproduced.get(key)
        comparisons.append(Comparison(key, value, again, again is not None and _close(value, again, exact, tolerance)))
    if exact:
        difference = _weights_difference(workspace, run_id, new_run_id)
        comparisons.append(Comparison("checkpoint weights (max |Δ|)", 0.0, difference, difference == 0.0))
    return ReproduceResult(run_id, new_run_id, lineage.code_version, current_code, str(recorded_ref), str(rebuilt_ref),
                           exact, tolerance, comparisons, warnings, parent_run_id=config.init_from)


def check_parent(workspace: Workspace, run, parent_id: str) -> None:
    """A run that started from a parent's weights rebuilds only from those same weights: the parent
    must still be a training run whose checkpoint is the one read (UsageError, exit 2, otherwise).
    The parent itself is not rebuilt: `lumos reproduce PARENT` does that."""
    try:
        parent = training_run(workspace, parent_id, "init_from")
    except UsageError as error:
        raise UsageError(f"run {run.info.run_id} started from a parent run that cannot be read: {error}") from None
    if parent.info.lifecycle_stage != "active":
        raise UsageError(f"the parent run {parent_id} of {run.info.run_id} was deleted; restore it "
                         f"(mlflow runs restore --run-id {parent_id}) to rebuild this run")
    recorded, now = run.data.tags.get(INIT_CHECKPOINT_TAG), parent.data.tags[CHECKPOINT_TAG]
    if recorded is not None and recorded != now:
        raise UsageError(f"the parent run {parent_id} of {run.info.run_id} has moved on: its checkpoint is {now}, "
                         f"the run started from {recorded}; it cannot be rebuilt from the same weights")


def recorded_content_hash(spark, workspace: Workspace, recorded: TableRef, recorded_hash: str | None,
                          rebuilt_hash: str) -> str:
    """The recorded table's content hash in the rebuilt one's algorithm: the hash its ingest
    recorded when that is the same algorithm, else computed over the table as stored (ingests
    before the sequences writers hashed their own rows recorded Spark's xxhash64 sum; a recipe
    built by Spark still does)."""
    algorithm = hash_algorithm(rebuilt_hash)
    if recorded_hash is not None and hash_algorithm(recorded_hash) == algorithm:
        return recorded_hash
    return content_hash(read_table(spark, workspace, recorded), algorithm)


def check_inputs(inputs: list[LineageInput]) -> tuple[list[str], list[str]]:
    """(changes that prevent a rebuild, warnings about inputs that cannot be checked)."""
    changed, unverifiable = [], []
    for item in inputs:
        if item.kind == "delta":
            try:
                now = open_delta_table(item.uri).version()
            except Exception:  # noqa: BLE001 - any failure to read the log means the table is not there
                changed.append(f"{item.uri}: the Delta table is gone (version {item.version} was read)")
                continue
            if now != item.version:
                changed.append(f"{item.uri}: the Delta table is at version {now}; version {item.version} was read")
        elif item.version is None:
            unverifiable.append(f"{item.uri}: no fingerprint was recorded (a remote location); it is read as it is now")
        elif not Path(item.uri).exists():
            changed.append(f"{item.uri}: no longer exists")
        elif (now := fingerprint(Path(item.uri))) != item.version:
            changed.append(f"{item.uri}: its content changed (fingerprint {now}, recorded {item.version})")
    return changed, unverifiable


def pin_inputs(recipe: IngestRecipe, inputs: list[LineageInput]) -> IngestRecipe:
    """The recipe with each source path replaced by the exact location its ingest read.

    Recipe paths may be relative to a recipe folder that is not recorded; the lineage inputs hold
    the resolved locations, in the order the ingest reads them: events, users, calendar, items.
    """
    sections = [section for _, section in recipe.source_sections()]
    if len(sections) != len(inputs):
        raise UsageError(f"the ingest lineage names {len(inputs)} input(s) but its recipe reads {len(sections)}")
    pinned = {name: replace(getattr(recipe, name), path=item.uri) for name, item in zip(sections, inputs, strict=True)}
    return replace(recipe, **pinned)


def _run_lineage(workspace: Workspace, run_id: str) -> LineageRecord:
    client = tracking_client(workspace)
    folder = tempfile.mkdtemp(prefix="lumos-lineage-")
    return LineageRecord.from_json(Path(client.download_artifacts(run_id, "lineage.json", folder)).read_text())


def _recorded_tasks(workspace: Workspace, run, tasks_dir: Path | None, recorded: TableRef, rebuilt: TableRef,
                    warnings: list[str]) -> list[LoadedTask]:
    """The tasks the run was scored on, reading the rebuilt version where they read the run's table."""
    names = sorted({key.split("/")[1] for key in run.data.metrics if key.startswith("eval/")})
    if not names:
        return []
    known = load_tasks([tasks_dir] if tasks_dir else task_folders(workspace.project_dir))
    tasks = []
    for name in names:
        if name not in known:
            warnings.append(f"task {name} was scored but is not defined here; its metrics are not compared")
            continue
        task = known[name]
        if TableRef.parse(task.spec.data).name == recorded.name:
            task = LoadedTask(replace(task.spec, data=str(rebuilt)), task.path)
        tasks.append(task)
    return tasks


def _close(recorded: float, reproduced: float, exact: bool, tolerance: float) -> bool:
    if math.isnan(recorded) or math.isnan(reproduced):
        return math.isnan(recorded) and math.isnan(reproduced)
    if exact:
        return recorded == reproduced
    return abs(recorded - reproduced) <= tolerance * max(1.0, abs(recorded))


def _weights_difference(workspace: Workspace, run_id: str, new_run_id: str) -> float:
    """The largest absolute difference between the two runs' final checkpoint weights."""
    from lumos.train.checkpoint import load_model

    first, _ = load_model(download_checkpoint(workspace, run_id, "RUN_ID"))
    second, _ = load_model(download_checkpoint(workspace, new_run_id, "RUN_ID"))
    first_state, second_state = first.state_dict(), second.state_dict()
    if first_state.keys() != second_state.keys() or any(
            first_state[name].shape != second_state[name].shape for name in first_state):
        return math.inf
    return max((float((first_state[name] - second_state[name]).abs().max()) for name in first_state if first_state[name].numel()),
               default=0.0)

