"""Evaluation at the scale of a team's leaderboard: 150 generated probe tasks scored in one pass.

    python benchmarks/eval.py [--tasks 150] [--users 2000] [--events 200000] [--out benchmarks/results/eval.json]

A quickstart-sized world (lumos/quickstart defaults: 2,000 users, 200,000 events) is ingested and
the quickstart model (lumos/quickstart/train.toml, a few steps: the time does not depend on how
well it learned) trained once. A labels table with one column per task is derived from the
generator's hidden truths with growing noise (a third binary, a third multi-class, a third numeric),
`lumos eval tasks generate` writes one probe task per column, and `lumos eval --all` is timed end
to end: model load, one embedding pass, every probe fit, every leaderboard entry in MLflow.
For comparison, the scoring alone is timed with the embeddings shared and, on a few tasks, with
the model run again for every task (as before the embeddings were shared).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lumos.core.config import load_config
from lumos.core.runs import download_checkpoint
from lumos.core.tables import TableRef
from lumos.core.workspace import init_workspace, open_workspace
from lumos.data.sequences_version import open_sequences
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.eval.evaluate import evaluate, resolve_subject
from lumos.eval.generate import generate_probe_tasks
from lumos.eval.score import EmbeddingCache, score_model
from lumos.eval.tasks import load_tasks
from lumos.quickstart import RECIPES
from lumos.train.checkpoint import load_model
from lumos.train.config import TrainConfig
from lumos.train.run import train


def setup(folder: Path, users: int, events: int) -> str:
    """A workspace with one ingest of a synthetic world and one trained run; returns the run id."""
    from lumos.core.spark import workspace_spark
    from lumos.data.ingest import run_ingest
    from lumos.data.recipe import IngestRecipe

    init_workspace(folder)
    generate_quickstart(folder / "data", SyntheticSpec(users=users, events=events))
    workspace = open_workspace(folder)
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={folder / 'data' / 'events'}", f"users.path={folder / 'data' / 'users.parquet'}",
        f"calendar.path={folder / 'data' / 'calendar.csv'}",
    ])
    spark = workspace_spark(workspace)
    run_ingest(spark, workspace, recipe, RECIPES)
    spark.stop()
    config = load_config(TrainConfig, RECIPES / "train.toml", ["run.max_steps=5", "run.eval_every=1000"])
    return train(config, workspace).run_id


def write_labels(source: Path, target: Path, tasks: int) -> list[str]:
    """`tasks` label columns from the hidden truths, each with its own amount of noise."""
    truths = pq.read_table(source)
    users = truths["user_id"]
    segment = np.array([int(name[1:]) for name in truths["segment"].to_pylist()])
    churned = np.array(truths["churned"].to_pylist(), dtype=bool)
    rng = np.random.default_rng(0)
    columns = {"user_id": users}
    for index in range(tasks):
        noise = index / tasks  # from clean to mostly noise
        flip = rng.random(len(segment)) < noise
        if index % 3 == 0:
            columns[f"binary_{index:03d}"] = pa.array(np.where(flip, rng.random(len(segment)) < 0.5, churned))
        elif index % 3 == 1:
            columns[f"class_{index:03d}"] = pa.array([f"s{value}" for value in np.where(flip, rng.integers(0, 8, len(segment)), segment)])
        else:
            columns[f"amount_{index:03d}"] = pa.array(segment * 10.0 + rng.normal(0.0, 1.0 + 40 * noise, len(segment)))
    pq.write_table(pa.table(columns), target)
    return [name for name in columns if name != "user_id"]


def scoring_only(workspace, run_id: str, tasks, shared: bool) -> float:
    """Seconds to score `tasks` without MLflow: embeddings shared across them, or per task."""
    model, _ = load_model(download_checkpoint(workspace, run_id, "bench"))
    data = open_sequences(workspace, TableRef.parse(tasks[0].spec.data))
    cache = EmbeddingCache()
    started = time.perf_counter()
    for task in tasks:
        score_model(model, task, data, cache if shared else EmbeddingCache())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=150)
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--unshared-tasks", type=int, default=5, help="tasks scored the old way, for comparison")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "eval.json")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="lumos-bench-eval-"))
    print(f"workspace {folder}: ingesting {args.users:,} users and training a quickstart-sized model", flush=True)
    run_id = setup(folder, args.users, args.events)
    workspace = open_workspace(folder)
    columns = write_labels(folder / "data" / "labels.parquet", folder / "data" / "many_labels.parquet", args.tasks)
    generate_probe_tasks(folder / "data" / "many_labels.parquet", folder / "tasks", columns, data="quickstart.sequences")
    tasks = list(load_tasks([folder / "tasks"]).values())

    started = time.perf_counter()
    results = evaluate(workspace, tasks, resolve_subject(workspace, run_id, None))
    end_to_end = time.perf_counter() - started
    shared = scoring_only(workspace, run_id, tasks, shared=True)
    few = tasks[: args.unshared_tasks]
    unshared_per_task = scoring_only(workspace, run_id, few, shared=False) / len(few)

    report = {
        "benchmark": "eval", "tasks": len(results), "users": args.users, "events": args.events,
        "threads": torch.get_num_threads(),
        "end_to_end_seconds": round(end_to_end, 2),
        "seconds_per_task": round(end_to_end / len(results), 3),
        "scoring_seconds_shared_embeddings": round(shared, 2),
        "scoring_seconds_per_task_unshared": round(unshared_per_task, 3),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
    }
    print(f"{len(results)} probe tasks, {args.users:,} users: `lumos eval --all` {end_to_end:.1f} s end to end "
          f"({end_to_end / len(results):.2f} s a task, MLflow included) on {torch.get_num_threads()} thread(s); "
          f"scoring alone {shared:.1f} s with shared embeddings, {unshared_per_task:.2f} s a task without", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
