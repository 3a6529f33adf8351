"""`lumos infer`: score every user for one as-of date with a registered model, into a Delta partition.

The model is named by alias (what cron uses) or version. Its training run names the data version
it learned from; that version's lineage names the recipe, the vocabulary version and the sources.
Each user's last tokens are kept in `<dataset>.user_state` (`lumos.data.user_state`): a night
reads the events since the state's date (or, on a first run, a changed recipe or source, or
--full, the whole log), moves the state to the date in one commit, and scores every user of the
state (one model load per Spark worker). The rows are written as partition as_of = DATE of
`<dataset>.predictions`, replacing any earlier run for it.
The commit's lineage names the model version and run, every input version, the recipe hash and
the engine; each row names its model version, so any prediction walks back to its data.
"""

from __future__ import annotations

import datetime
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

from lumos.core.config import config_hash
from lumos.core.errors import UsageError
from lumos.core.faults import crash_during_write, fault_point
from lumos.core.lineage import LineageInput, LineageRecord
from lumos.core.progress import Report
from lumos.core.runs import CONFIG_HASH_TAG, RECIPE_HASH_TAG
from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import Workspace
from lumos.data.commit_metrics import rows_written
from lumos.data.predictions import partition_lock, write_partition
from lumos.data.training_data import TrainingData, training_data
from lumos.data.user_state import Night, NightWritten, read_night, write_night
from lumos.infer.scoring import ENGINES, ScoringJob, score_tokens
from lumos.infer.trace import MODEL_SNAPSHOT, model_snapshot
from lumos.train.trained_model import TrainedModel, load_registered_model

STAGE = "infer"


@dataclass(frozen=True)
class InferOptions:
    as_of: datetime.date
    source: str | None = None
    """Events to read instead of the source recorded in the model's data lineage."""
    output: str | None = None
    """dataset.table to write; default <training dataset>.predictions."""
    engine: str = "torch"
    top_k: int = 10
    exclude_history: bool = True
    """Leave items already in a user's history out of their top-k."""
    batch_size: int = 512
    torch_threads: int = 1
    full: bool = False
    """Rebuild the user state from the whole event log instead of carrying it forward."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if self.top_k < 1 or self.batch_size < 1 or self.torch_threads < 1:
            raise UsageError("--top-k, --batch-size and --threads must be at least 1")
        if self.output is not None and TableRef.parse(self.output).version is not None:
            raise UsageError(f"--output {self.output}: name a table without @version; infer always writes a new version")


@dataclass
class InferSummary:
    model: str
    run_id: str
    as_of: datetime.date
    output: str
    """The predictions table version written, e.g. quickstart.predictions@3."""
    rows: int
    engine: str
    training_data: str
    inputs: list[LineageInput] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    rejects: str = ""
    """The rejects table version written for the date, e.g. quickstart.infer_rejects@3."""
    rows_rejected: int = 0
    """Events that failed the training recipe's rules (rows of `rejects`; by rule in the lineage)."""
    mode: str = ""
    """full (the state rebuilt from the whole log) or incremental (carried forward)."""
    mode_reason: str = ""
    events_read: int = 0
    """Event rows read and checked: the whole log (full) or the new events only (incremental)."""
    users_updated: int = 0
    late_users: int = 0
    """Users with late events (before the state's date, in new files), recomputed from the log."""
    state: str = ""
    """The user state version written, e.g. quickstart.user_state@4."""
    state_write_seconds: float = 0.0


def infer(workspace: Workspace, model_ref: str, options: InferOptions, report: Report = lambda _: None) -> InferSummary:
    started = time.perf_counter()
    trained = load_registered_model(workspace, model_ref)
    data = training_data(workspace, trained.training_data)
    output = TableRef.parse(options.output or f"{data.recipe.dataset}.predictions")
    report(f"model {trained.version.label} (run {trained.run_id}, trained on {data.sequences})")
    engine, warnings = _choose_engine(workspace, options.engine, trained.run_id, trained.model, report)

    from lumos.core.spark import job_steps, workspace_spark

    # The lock comes before Spark starts: a second run for the date fails in seconds, having done nothing.
    with partition_lock(workspace, output, options.as_of), ExitStack() as cleanup:
        spark = workspace_spark(workspace)
        step = job_steps(spark, STAGE, report)
        cleanup.callback(step, None)
        night = read_night(spark, workspace, data, options.as_of, options.source, output, options.full)
        cleanup.callback(night.release)  # the cached frames go once rows, rejects and state are written
        report(f"{night.mode} night: {night.reason}")
        step(f"checking {night.events_read:,} events, writing rejects and the user state as of {options.as_of}")
        written = write_night(spark, workspace, night, trained.version.label, trained.features)
        lineage = _predictions_lineage(workspace, trained, data, engine, options, night, written)
        job = _scoring_job(spark, workspace, trained, written, engine, options)
        predictions = score_tokens(spark, written.tokens, written.plan, written.future, job, trained.model)
        step(f"scoring and writing {output.name} partition as_of={options.as_of}")
        fault_point("infer.write")
        with crash_during_write("infer.mid_write", table_location(workspace, output)):
            output_version = write_partition(spark, workspace, output, predictions, options.as_of, lineage)
    return InferSummary(model=trained.version.label, run_id=trained.run_id, as_of=options.as_of,
                        output=str(output_version), rows=rows_written(spark, workspace, output_version), engine=engine,
                        training_data=str(data.sequences), inputs=lineage.inputs,
                        seconds=time.perf_counter() - started, warnings=warnings, rejects=str(written.rejects),
                        rows_rejected=night.counts.rejected, mode=night.mode, mode_reason=night.reason,
                        events_read=night.events_read, users_updated=written.users_updated,
                        late_users=night.late_users, state=str(written.state),
                        state_write_seconds=written.state_write_seconds)


def _scoring_job(spark, workspace: Workspace, trained: TrainedModel, written: NightWritten, engine: str,
                 options: InferOptions) -> ScoringJob:
    return ScoringJob(
        model_key=trained.version.label, run_id=trained.run_id, checkpoint=trained.checkpoint,
        item_tokens=written.item_tokens,
        as_of=options.as_of, top_k=options.top_k, exclude_history=options.exclude_history,
        batch_size=options.batch_size, torch_threads=options.torch_threads,
        compiled=(workspace, trained.run_id) if engine == "compiled" else None,
        rows_per_sort=int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")),
    )


def _predictions_lineage(workspace: Workspace, trained: TrainedModel, data: TrainingData, engine: str,
                         options: InferOptions, night: Night, written: NightWritten) -> LineageRecord:
    """The predictions commit's lineage: the model version and run, every input version (the user
    state's too), the recipe hash, the engine, the night's mode and reject counts."""
    version, run = trained.version, trained.run
    request = {"model": version.label, "as_of": options.as_of.isoformat(), "engine": engine,
               "top_k": options.top_k, "exclude_history": options.exclude_history}
    return LineageRecord(
        stage=STAGE,
        config=request,
        config_hash=config_hash(request),
        inputs=[LineageInput("model-version", f"models:/{version.name}/{version.version}", version.version),
                LineageInput("mlflow-run", f"runs:/{run.info.run_id}", run.info.run_id),
                LineageInput("delta", table_location(workspace, data.sequences), data.sequences.version),
                # the state scored: `user_state.last_state` trusts only a state version named here
                LineageInput("delta", table_location(workspace, written.state), written.state.version),
                *night.inputs],
        stats={"training_data": str(data.sequences), "recipe_hash": run.data.tags.get(RECIPE_HASH_TAG),
               "config_hash": run.data.tags.get(CONFIG_HASH_TAG), "rejects": str(written.rejects),
               "mode": night.mode, "mode_reason": night.reason, "users_updated": written.users_updated,
               **night.counts.lineage_stats(),
               # so `lumos data trace` answers from this commit alone, without opening MLflow
               MODEL_SNAPSHOT: model_snapshot(workspace, version, run)},
    )


def _choose_engine(workspace: Workspace, engine: str, run_id: str, model, report: Report) -> tuple[str, list[str]]:
    """The compiled engine when a verified plan is stored for the run; otherwise torch, with a warning."""
    if engine != "compiled":
        return engine, []
    from lumos.compile.engine import load_compiled

    if load_compiled(workspace, run_id, model) is not None:
        return engine, []
    warning = f"no compiled plan is stored for run {run_id}; scoring with torch (run `lumos compile --run {run_id}` first)"
    report(f"warning: {warning}")
    return "torch", [warning]
