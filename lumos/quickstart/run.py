"""`lumos quickstart`: an empty folder → a project that has been through every verb.

It writes lumos.toml and the embedded recipes into the folder (keeping any the user already has
there, so edits survive a rerun), generates the synthetic data, then runs ingest → train →
eval (every task) → promote → infer in one process and one Spark session. Each step is the same
core function the verb's command calls; nothing here is quickstart-only logic.
"""

from __future__ import annotations

import datetime
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lumos.core.config import load_config
from lumos.core.progress import Report
from lumos.core.registry import DEFAULT_ALIAS
from lumos.core.workspace import CONFIG_FILE, Workspace, init_workspace, open_workspace
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES

MODEL_NAME = "quickstart"
# The promotion gate: tell next week's buyers from the rest clearly better than chance (AUC 0.5).
REQUIREMENTS = ("will_purchase_7d:auc_roc>=0.6",)


@dataclass
class QuickstartSummary:
    directory: Path
    workspace: Workspace
    tables: dict[str, str]
    run_id: str
    eval_primary: dict[str, tuple[str, float, float | None]]
    """task → (primary metric, the model's value, the baseline's value)."""
    model: str
    predictions: str
    prediction_rows: int
    as_of: datetime.date
    seconds: dict[str, float] = field(default_factory=dict)


def run_quickstart(
    directory: Path,
    data_spec: SyntheticSpec | None = None,
    train_overrides: tuple[str, ...] = (),
    requirements: tuple[str, ...] = REQUIREMENTS,
    report: Report = lambda _: None,
) -> QuickstartSummary:
    from lumos.core.spark import workspace_spark
    from lumos.data.ingest import run_ingest
    from lumos.data.recipe import IngestRecipe
    from lumos.eval.evaluate import evaluate, resolve_subject
    from lumos.eval.promote import parse_requirement, promote
    from lumos.eval.tasks import load_tasks
    from lumos.infer.run import InferOptions, infer
    from lumos.train.config import TrainConfig
    from lumos.train.run import train

    data_spec = data_spec or SyntheticSpec()
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        seconds[stage] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    directory = directory.resolve()
    _write_project(directory, report)
    data = directory / "data"
    if not (data / "events").is_dir():
        report(f"generating synthetic data in {data}")
        generate_quickstart(data, data_spec)
    workspace = open_workspace(directory)
    lap("setup")

    report("ingest: events → quickstart.sequences, .vocab, .rejects")
    recipe = load_config(IngestRecipe, directory / "ingest.toml")
    ingested = run_ingest(workspace_spark(workspace), workspace, recipe, directory, report)
    lap("ingest")

    report("train")
    config = load_config(TrainConfig, directory / "train.toml", list(train_overrides))
    trained = train(config, workspace, report=report)
    lap("train")

    report("eval: every task, each beside its baseline")
    tasks = load_tasks([directory / "tasks"])
    results = evaluate(workspace, list(tasks.values()), resolve_subject(workspace, trained.run_id, None), report=report)
    primary = {}
    for result in results:
        metric = tasks[result.task].spec.primary_metric
        primary[result.task] = (metric, result.metrics.get(metric, float("nan")), result.baseline_metrics.get(metric))
    lap("eval")

    report(f"promote: {MODEL_NAME}@{DEFAULT_ALIAS}, gated on {', '.join(requirements) or 'nothing'}")
    promoted = promote(workspace, MODEL_NAME, DEFAULT_ALIAS, run_id=trained.run_id,
                       requirements=[parse_requirement(item) for item in requirements])
    lap("promote")

    as_of = data_spec.start + datetime.timedelta(days=data_spec.days)  # the morning after the last activity
    report(f"infer: every user as of {as_of}")
    predicted = infer(workspace, f"{MODEL_NAME}@{DEFAULT_ALIAS}", InferOptions(as_of=as_of), report)
    lap("infer")
    return QuickstartSummary(
        directory=directory, workspace=workspace, tables=ingested.tables, run_id=trained.run_id, eval_primary=primary,
        model=f"{promoted.name}/{promoted.version}", predictions=predicted.output, prediction_rows=predicted.rows,
        as_of=as_of, seconds=seconds,
    )


def _write_project(directory: Path, report: Report) -> None:
    """lumos.toml and the recipes, each only where the folder does not have it yet."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / CONFIG_FILE).exists():
        init_workspace(directory)
    copied = []
    for source in [RECIPES / "ingest.toml", RECIPES / "train.toml", *sorted((RECIPES / "tasks").glob("*.toml"))]:
        target = directory / source.relative_to(RECIPES)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(str(target.relative_to(directory)))
    if copied:
        report(f"wrote {', '.join(copied)} into {directory}")
