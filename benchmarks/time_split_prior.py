"""Choose the time split's recency prior on an earlier cutoff, never on the test window.

tasks/movielens_time_split.toml scores a model trained on the ratings before 1998-03-08 by the
movies each user first rates in the 30 days after. Its `[window] recency_prior` weights the
popularity of the 7 days before the cutoff into the model's scores. That weight is chosen here by
the same protocol one cutoff earlier: the ratings before the validation cutoff (default 30 days
before) are ingested and a model is trained on them exactly as run.sh trains the time-split model;
each weight of the grid is scored on the 30 days after the validation cutoff by the task's own code.
Nothing on or after the validation cutoff reaches that model or its counts, so the choice sees
neither the test window nor the month before it as targets.

    examples/movielens/run.sh                  # fetch.py's data/events.parquet
    python benchmarks/time_split_prior.py --seeds 0 1
    python benchmarks/time_split_prior.py --skip-ingest --seeds 0 --runs RUN_ID   # score a trained one again

Writes benchmarks/results/time_split_prior.json and prints NDCG@10 per weight and seed, the
7-day popularity baseline's on the same window, and the weight with the best mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from lumos.core.config import load_config
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.sequences_version import open_sequences
from lumos.eval.score import score_baselines, score_model
from lumos.eval.tasks import LoadedTask, load_tasks
from lumos.train.config import TrainConfig
from lumos.train.run import train
from lumos.train.trained_model import load_training_run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "movielens"
RESULTS = ROOT / "benchmarks" / "results"
TEST_CUTOFF = "1998-03-08"
GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""From the model alone to the recent counts deciding, with the model only breaking their ties."""
TIME_STEPS = 600
"""run.sh's TIME_STEPS: the validation model trains as the time-split model does."""


def validation_recipes(cutoff: datetime.date) -> list[Path]:
    """ingest_before.toml and ingest_cutoff.toml moved to `cutoff`, written beside the fetched data
    (git-ignored). More ratings fall after this cutoff, so the reject ceiling is raised to match."""
    folder = EXAMPLE / "data" / "time_split_prior"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in ("ingest_before", "ingest_cutoff"):
        text = (EXAMPLE / f"{name}.toml").read_text()
        dataset = f'"{name.replace("ingest", "movielens")}_valid"'
        text = (text.replace(TEST_CUTOFF, cutoff.isoformat())
                .replace(f'"{name.replace("ingest", "movielens")}"', dataset)
                .replace('"data/events.parquet"', json.dumps(str(EXAMPLE / "data" / "events.parquet")))
                .replace("max_reject_fraction = 0.2 ", "max_reject_fraction = 0.4 "))
        if cutoff.isoformat() not in text or dataset not in text or "0.4" not in text:
            raise SystemExit(f"{name}.toml changed shape: update validation_recipes()")
        paths.append(folder / f"{name}_valid.toml")
        paths[-1].write_text(text)
    return paths


def ingest(recipe: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
    subprocess.run([sys.executable, "-m", "lumos", "--workspace", str(EXAMPLE), "ingest", "--recipe", str(recipe)],
                   check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--days-before", type=int, default=30, help="the validation cutoff: this many days before the test cutoff")
    parser.add_argument("--steps", type=int, default=TIME_STEPS)
    parser.add_argument("--skip-ingest", action="store_true", help="the validation tables are already ingested")
    parser.add_argument("--runs", nargs="+", default=[], help="validation models already trained here (one per seed): score them again")
    parser.add_argument("--out", type=Path, default=RESULTS / "time_split_prior.json")
    args = parser.parse_args()

    cutoff = datetime.date.fromisoformat(TEST_CUTOFF) - datetime.timedelta(days=args.days_before)
    if not args.skip_ingest:
        for recipe in validation_recipes(cutoff):
            ingest(recipe)
    workspace = open_workspace(EXAMPLE)
    test_task = load_tasks([EXAMPLE / "tasks"])["movielens_time_split"]
    data_name = "movielens_cutoff_valid.sequences"
    data = open_sequences(workspace, TableRef.parse(data_name))
    spec = dataclasses.replace(test_task.spec, name="movielens_time_split_valid", data=data_name,
                               window=dataclasses.replace(test_task.spec.window, cutoff=cutoff))
    baselines = {name: scores.metrics["ndcg@10"] for name, scores in score_baselines(LoadedTask(spec, test_task.path), data)}
    print(f"validation cutoff {cutoff}: baselines {baselines}", flush=True)

    scores: dict[float, list[float]] = {weight: [] for weight in GRID}
    runs = list(args.runs)
    for seed in args.seeds[len(runs):]:
        config = load_config(TrainConfig, EXAMPLE / "train.toml", [
            "data.table=movielens_before_valid.sequences", f"run.max_steps={args.steps}", f"run.seed={seed}",
            "run.experiment=movielens-time-split-prior"])
        runs.append(train(config, workspace).run_id)
    for seed, run_id in zip(args.seeds, runs, strict=True):
        model = load_training_run(workspace, run_id).model
        for weight in GRID:
            task = LoadedTask(dataclasses.replace(spec, window=dataclasses.replace(spec.window, recency_prior=weight)),
                              test_task.path)
            scores[weight].append(score_model(model, task, data).metrics["ndcg@10"])
            print(f"seed {seed} recency_prior {weight}: valid NDCG@10 {scores[weight][-1]:.4f}", flush=True)

    best = max(GRID, key=lambda weight: (np.mean(scores[weight]), -weight))  # ties: the smaller weight
    print(f"chosen recency_prior = {best} (valid NDCG@10 {np.mean(scores[best]):.4f}; "
          f"7-day popularity {baselines.get('popularity_last_7d', float('nan')):.4f})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"validation_cutoff": cutoff.isoformat(), "steps": args.steps, "seeds": args.seeds,
                                    "runs": runs,
                                    "baselines": baselines, "ndcg_at_10": {str(w): s for w, s in scores.items()},
                                    "chosen": best}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
