"""Leaderboards live in MLflow: one experiment per task (`lumos-eval/<task>`), one run per entry.

An entry is (task, evaluated model, data version). Evaluating the same triple again replaces its
entry (the old run is deleted), so a leaderboard never shows a model twice for one data version.
Reading a leaderboard touches only the tracking store, so it works against a remote server too.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from lumos.core.lineage import code_version
from lumos.core.runs import EVAL_TAG_PREFIX as TAG
from lumos.core.runs import delta_dataset_input
from lumos.core.tables import TableRef, table_location
from lumos.core.tracking import NOTE_TAG, ensure_experiment, source_tags, tracking_client
from lumos.core.workspace import Workspace
from lumos.eval.sides import on_side, user_sides, whole_split
from lumos.eval.tasks import TaskSpec


@dataclass(frozen=True)
class Subject:
    """What is evaluated: a training run, a registered model version, or a baseline."""

    key: str
    """Identifies the entry: run:<id>, model:<name>/<version> or baseline:<name>."""
    label: str
    """How the leaderboard names it."""
    run_id: str | None = None
    """The training run (none for baselines)."""
    model: str | None = None
    """name/version when a registered model version was named."""

    @property
    def kind(self) -> str:
        """What kind of entry it makes: model (a training run or registered version), baseline or submission."""
        return entry_kind(self.key)


ENTRY_KINDS = ("model", "baseline", "submission")


def entry_kind(subject_key: str) -> str:
    prefix = subject_key.partition(":")[0]
    return "model" if prefix in ("run", "model") else prefix


@dataclass(frozen=True)
class Entry:
    rank: int
    label: str
    kind: str
    """model, baseline or submission."""
    run_id: str | None
    model: str | None
    data: str
    metrics: dict[str, float]
    """Scores on the side the leaderboard ranks by: the public users when the task has a private
    side, else the whole split."""
    date: str
    eval_run_id: str
    scored_on: str = "all"
    """public or all: the users `metrics` are on."""
    private_metrics: dict[str, float] = field(default_factory=dict)
    """Scores on the private side (empty when the task has none); shown only with --private."""


def experiment_name(task: str) -> str:
    return f"lumos-eval/{task}"


def record(workspace: Workspace, spec: TaskSpec, subject: Subject, data: str, metrics: dict[str, float], rows: int,
           details: dict[str, str] | None = None) -> str:
    """Log one leaderboard entry (replacing an earlier one for the same subject and data).
    `details` become tags lumos.eval.<key> (a submission's file digest, rows and description)."""
    from mlflow.entities import Param

    client = tracking_client(workspace)
    experiment_id = ensure_experiment(client, workspace, experiment_name(spec.name))
    for old in client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG}subject` = '{_quote(subject.key)}' and tags.`{TAG}data` = '{_quote(data)}'",
    ):
        client.delete_run(old.info.run_id)
    tags = {
        **source_tags("eval", code_version()),
        NOTE_TAG: f"Leaderboard entry: **{subject.label}** on `{data}` split `{spec.split}`, task `{spec.name}`." + (
            f" `<metric>` is on all the split's users, `public/<metric>` on the {spec.public_fraction:.0%} the "
            "leaderboard ranks by, `private/<metric>` on the rest." if user_sides(spec) else ""),
        f"{TAG}task": spec.name,
        f"{TAG}kind": spec.kind,
        f"{TAG}subject": subject.key,
        f"{TAG}entry": subject.kind,
        f"{TAG}label": subject.label,
        f"{TAG}data": data,
        f"{TAG}primary_metric": mlflow_key(spec.primary_metric),  # the metric key, as logged
        f"{TAG}rows": str(rows),
    }
    if subject.run_id:
        tags[f"{TAG}run"] = subject.run_id
    if subject.model:
        tags[f"{TAG}model"] = subject.model
    tags |= {f"{TAG}{key}": value for key, value in (details or {}).items()}
    run = client.create_run(experiment_id, run_name=entry_run_name(subject), tags=tags)
    params = {"task": spec.name, "kind": spec.kind, "subject": subject.key, "data": data, "split": spec.split,
              "primary_metric": mlflow_key(spec.primary_metric), "rows": str(rows)}
    # One batch per run, not one call per metric: a 150-task eval makes hundreds fewer store round
    # trips. NaN is logged as NaN (MLflow stores it): a skipped metric would read as "not measured".
    client.log_batch(run.info.run_id, params=[Param(key, value) for key, value in params.items()],
                     metrics=_metrics(metrics, ""))
    table = TableRef.parse(data)
    client.log_inputs(run.info.run_id, [delta_dataset_input(table, table_location(workspace, table), "eval")])
    client.set_terminated(run.info.run_id, "FINISHED")
    client.set_experiment_tag(experiment_id, NOTE_TAG, experiment_description(spec, leaderboard(workspace, spec, top=10)))
    if subject.run_id and subject.kind == "model":
        # The training run carries its scores too, so a run's page shows how it evaluated; promotion
        # gates read them there, so only a model entry ever writes them.
        client.log_batch(subject.run_id, metrics=_metrics(metrics, f"eval/{spec.name}/"))
    return run.info.run_id


def entry_start_times(workspace: Workspace, spec: TaskSpec, subject: Subject) -> list[int]:
    """When each entry of `subject` on the task was logged (ms since the epoch), the entries an
    evaluation of the same data replaced (deleted runs) included."""
    from mlflow.entities import ViewType

    client = tracking_client(workspace)
    experiment = client.get_experiment_by_name(experiment_name(spec.name))
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{TAG}subject` = '{_quote(subject.key)}'",
                              run_view_type=ViewType.ALL, max_results=5000)
    return sorted(run.info.start_time for run in runs)


def _metrics(metrics: dict[str, float], prefix: str) -> list:
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    return [Metric(key=prefix + mlflow_key(name), value=value, timestamp=stamp, step=0)
            for name, value in metrics.items()]


def entry_run_name(subject: Subject) -> str:
    """model/quickstart-v1, baseline/popularity, submission/TEAM/MODEL or run/<training run name>: what the entry is."""
    kind, _, name = subject.key.partition(":")
    if subject.model:
        model, _, version = subject.model.partition("/")
        return f"model/{model}-v{version}"
    if kind == "run":
        return f"run/{subject.label}"
    return f"{kind}/{name}"


def experiment_description(spec: TaskSpec, entries: list[Entry]) -> str:
    """The leaderboard experiment's Markdown description: the task, and its top entries by the
    primary metric (MLflow's runs table shows no metric column until one is picked)."""
    key = mlflow_key(spec.primary_metric)
    # The first line is what MLflow shows while the description is folded: the standings.
    standings = ", ".join(f"{entry.label} {entry.metrics[spec.primary_metric]:.4f}" for entry in entries
                          if entry.metrics.get(spec.primary_metric) is not None)
    lines = [
        f"Leaderboard of **{spec.name}** by `{key}`: {standings or 'no entries yet'}",
        "",
        f"Task ({spec.kind}): {spec.description or 'see tasks/' + spec.name + '.toml'}",
        "",
        f"Primary metric: `{key}` ({'higher' if spec.primary_direction == 'max' else 'lower'} is better); one run per "
        "evaluated model (or baseline) and data version, from `lumos eval`."
        + (f" Ranked on the public side ({spec.public_fraction:.0%} of the users, `public/{key}`)." if user_sides(spec) else ""),
        "",
        f"| rank | entry | kind | data | {key} |",
        "|---|---|---|---|---|",
    ]
    for entry in entries:
        value = entry.metrics.get(spec.primary_metric)
        lines.append(f"| {entry.rank} | {entry.label} | {entry.kind} | `{entry.data}` | {'' if value is None else f'{value:.4f}'} |")
    return "\n".join(lines)


def leaderboard(workspace: Workspace, spec: TaskSpec, top: int | None = None) -> list[Entry]:
    """Entries ranked by the task's primary metric (entries without it, or with NaN, last)."""
    client = tracking_client(workspace)
    experiment = client.get_experiment_by_name(experiment_name(spec.name))
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], max_results=5000)
    sign = -1.0 if spec.primary_direction == "max" else 1.0
    entries = []
    for run in runs:
        tags = run.data.tags
        logged = {metric_name(key): value for key, value in run.data.metrics.items()}
        public = on_side(logged, "public")
        entries.append(Entry(
            rank=0, label=tags.get(f"{TAG}label", run.info.run_id),
            kind=tags.get(f"{TAG}entry") or entry_kind(tags.get(f"{TAG}subject", "")), run_id=tags.get(f"{TAG}run"),
            model=tags.get(f"{TAG}model"), data=tags.get(f"{TAG}data", ""), metrics=public or whole_split(logged),
            date=_date(run.info.start_time), eval_run_id=run.info.run_id, scored_on="public" if public else "all",
            private_metrics=on_side(logged, "private"),
        ))

    def order(entry: Entry) -> tuple[int, float, str]:
        value = entry.metrics.get(spec.primary_metric)
        missing = value is None or math.isnan(value)  # NaN would break the sort's ordering
        return (missing, 0.0 if missing else sign * value, entry.eval_run_id)

    ranked = sorted(entries, key=order)
    return [replace(entry, rank=rank) for rank, entry in enumerate(ranked[:top] if top else ranked, start=1)]


# Params that tell seeds of one config apart; everything else logged from the config groups runs.
SEED_PARAMS = ("run.seed", "run.run_name")


@dataclass(frozen=True)
class Group:
    """The entries of training runs whose configs differ only in the seed (or one non-run entry)."""

    rank: int
    label: str
    """The config params that vary across groups (e.g. optim.lr=0.002 model.dropout=0.1), or the entry's label."""
    run_ids: list[str]
    metrics: dict[str, tuple[float, float]]
    """metric → (mean, sample std over the group's entries; 0 for one entry)."""


def grouped_leaderboard(workspace: Workspace, spec: TaskSpec, top: int | None = None) -> list[Group]:
    """One row per training config: mean ± std over its seeds, ranked by the primary metric's mean."""
    import statistics

    client = tracking_client(workspace)
    members: dict[str, dict[str, Entry]] = {}  # group key → run id (or label) → entry
    configs: dict[str, dict[str, str]] = {}
    for entry in leaderboard(workspace, spec):
        if entry.run_id is None:
            key, config = f"entry:{entry.label}", None
        else:
            params = client.get_run(entry.run_id).data.params
            config = {name: value for name, value in params.items() if name not in SEED_PARAMS}
            key = json.dumps(config, sort_keys=True)
            configs[key] = config
        members.setdefault(key, {}).setdefault(entry.run_id or entry.label, entry)  # a run entered as run and model counts once
    varying = sorted({name for config in configs.values() for name in config
                      if len({other.get(name) for other in configs.values()}) > 1})
    groups = []
    for key, entries in members.items():
        config = configs.get(key)
        label = " ".join(f"{name}={config.get(name)}" for name in varying) if config and varying else next(iter(entries.values())).label
        names = sorted({name for entry in entries.values() for name in entry.metrics})
        metrics = {}
        for name in names:
            values = [entry.metrics[name] for entry in entries.values() if name in entry.metrics]
            metrics[name] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
        groups.append((label, [entry.run_id for entry in entries.values() if entry.run_id], metrics))
    sign = -1.0 if spec.primary_direction == "max" else 1.0
    primary = spec.primary_metric

    def order(group) -> tuple[bool, float, str]:
        value = group[2].get(primary)
        return (value is None, sign * value[0] if value is not None else 0.0, group[0])

    ranked = sorted(groups, key=order)
    return [Group(rank, label, run_ids, metrics) for rank, (label, run_ids, metrics) in enumerate(ranked[:top] if top else ranked, start=1)]


def group_json(group: Group) -> dict[str, Any]:
    return {"rank": group.rank, "label": group.label, "runs": group.run_ids, "n": max(1, len(group.run_ids)),
            "metrics": {name: {"mean": mean, "std": std} for name, (mean, std) in group.metrics.items()}}


def entry_json(entry: Entry, private: bool = False) -> dict[str, Any]:
    """An entry for scripts; its private scores only when asked (`--private`)."""
    shown = {"rank": entry.rank, "label": entry.label, "kind": entry.kind, "run_id": entry.run_id, "model": entry.model,
             "data": entry.data, "scored_on": entry.scored_on, "metrics": entry.metrics, "date": entry.date,
             "eval_run_id": entry.eval_run_id}
    return shown | ({"private_metrics": entry.private_metrics} if private else {})


def _quote(text: str) -> str:
    """MLflow filter strings quote with '; ids and table names never hold one, but be exact."""
    return text.replace("'", "\\'")


def mlflow_key(name: str) -> str:
    """MLflow metric names may not hold "@": hr@10 is logged as hr_at_10."""
    return name.replace("@", "_at_")


def metric_name(key: str) -> str:
    return key.replace("_at_", "@")


def _date(millis: int | None) -> str:
    import datetime

    if not millis:
        return ""
    return datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
