"""Model selection that carries over: how often does a choice made on a validation agree with test?

On MovieLens, valid (each user's second-to-last rating) and test (the last) have disagreed: choices
that raised valid left test where it was. The other validation sits where test sits: the last rating
of a seeded share of users who are left out of training (`splits.holdout_users`, split "holdout").
One table holds both: ingest.toml with a 10% holdout. Test is the other users' last rating.

For each model (Lumos with train.toml, SASRec with benchmarks/sasrec.py's tuned setting) a few
settings × seeds are trained for a fixed budget with no early stopping, so no split chooses the
weights, and each trained model is scored on valid, holdout and test by the same metric code
(NDCG@10, the full corpus ranked, history excluded). For every seed and pair of settings, a
validation agrees with test when it orders the pair as test does; and per seed, whether the
setting it would choose is the one test would.

    lumos --workspace examples/movielens ingest --recipe examples/movielens/ingest.toml \\
        --set dataset=movielens_holdout --set splits.holdout_users=0.1
    python benchmarks/selection.py --workspace examples/movielens --seeds 0 1 2 --lumos-steps 600 --sasrec-epochs 10

Writes benchmarks/results/selection.json and prints each run's three scores and the agreement.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import numpy as np

from lumos.core.config import load_config
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.sequences_version import open_sequences
from lumos.eval.score import score_model
from lumos.eval.tasks import LoadedTask, TaskSpec
from lumos.train import retrieval_metrics as M
from lumos.train.config import TrainConfig
from lumos.train.run import train
from lumos.train.trained_model import load_training_run

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SPLITS = ("valid", "holdout", "test")
LUMOS_SETTINGS = {  # train.toml overrides: the recipe and two of the choices its search made
    "recipe": [],
    "dropout 0.3": ["model.dropout=0.3"],
    "lr 1e-3": ["optim.lr=1e-3"],
}
SASREC_SETTINGS = {  # SASRecConfig fields: the tuned setting and two it was chosen over
    "tuned": {},
    "dropout 0.2": {"dropout": 0.2},
    "lr 1e-3": {"lr": 1e-3},
}


def _sasrec():
    spec = importlib.util.spec_from_file_location("sasrec_benchmark", ROOT / "benchmarks" / "sasrec.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def lumos_runs(workspace_dir: str, table: str, seeds: list[int], steps: int) -> list[dict]:
    workspace = open_workspace(workspace_dir)
    data = open_sequences(workspace, TableRef.parse(table))
    tasks = {split: LoadedTask(TaskSpec(name=f"selection_{split}", kind="retrieval", primary_metric="ndcg@10",
                                        data=table, split=split, ks=(10,)), ROOT / "selection.toml") for split in SPLITS}
    runs = []
    for setting, overrides in LUMOS_SETTINGS.items():
        for seed in seeds:
            config = load_config(TrainConfig, ROOT / "examples" / "movielens" / "train.toml", [
                f"data.table={table}", f"run.max_steps={steps}", "run.patience=0", f"run.eval_every={steps}",
                f"run.seed={seed}", "run.experiment=movielens-selection", *overrides])
            summary = train(config, workspace)
            model = load_training_run(workspace, summary.run_id).model  # the last step: patience 0 keeps it
            scores = {split: score_model(model, task, data).metrics["ndcg@10"] for split, task in tasks.items()}
            runs.append({"model": "lumos", "setting": setting, "seed": seed, **scores})
            print(runs[-1], flush=True)
    return runs


def sasrec_runs(workspace_dir: str, table: str, seeds: list[int], epochs: int) -> list[dict]:
    sasrec = _sasrec()
    data = sasrec.read_table(workspace_dir, table)
    runs = []
    for setting, fields in SASREC_SETTINGS.items():
        for seed in seeds:
            config = sasrec.SASRecConfig(**fields, max_epochs=epochs, keep_best=False, seed=seed)
            model, _, _ = sasrec.train_model(data, config, report=lambda _: None)
            max_len = config.max_len or data.max_len
            scores = {split: M.retrieval_metrics(sasrec.rank_rows(model, getattr(data, split), data.max_len, max_len))["ndcg@10"]
                      for split in SPLITS}
            runs.append({"model": "sasrec", "setting": setting, "seed": seed, **scores})
            print(runs[-1], flush=True)
    return runs


def agreement(runs: list[dict], validation: str) -> dict[str, float]:
    """pairs: the share of (seed, pair of settings) that `validation` orders as test does (a tie
    on either side counts half); picks: the share of seeds whose best setting on it is test's best."""
    agree, pairs, picks = [], 0, []
    for seed in sorted({run["seed"] for run in runs}):
        mine = [run for run in runs if run["seed"] == seed]
        for a, b in itertools.combinations(mine, 2):
            chosen, truth = np.sign(a[validation] - b[validation]), np.sign(a["test"] - b["test"])
            agree.append(0.5 if chosen == 0 or truth == 0 else float(chosen == truth))
            pairs += 1
        picks.append(max(mine, key=lambda run: run[validation])["setting"] == max(mine, key=lambda run: run["test"])["setting"])
    return {"pairs": float(np.mean(agree)), "pair_count": pairs, "picks": float(np.mean(picks)), "seeds": len(picks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", default="examples/movielens")
    parser.add_argument("--table", default="movielens_holdout.sequences")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lumos-steps", type=int, default=600)
    parser.add_argument("--sasrec-epochs", type=int, default=10)
    parser.add_argument("--models", nargs="+", default=["lumos", "sasrec"], choices=["lumos", "sasrec"])
    parser.add_argument("--out", type=Path, default=RESULTS / "selection.json")
    args = parser.parse_args()
    runs = []
    if "lumos" in args.models:
        runs += lumos_runs(args.workspace, args.table, args.seeds, args.lumos_steps)
    if "sasrec" in args.models:
        runs += sasrec_runs(args.workspace, args.table, args.seeds, args.sasrec_epochs)
    report = {model: {validation: agreement([run for run in runs if run["model"] == model], validation)
                      for validation in ("valid", "holdout")} for model in args.models}
    for model, by_validation in report.items():
        for validation, numbers in by_validation.items():
            print(f"{model}: {validation} orders {numbers['pairs']:.2f} of {numbers['pair_count']} pairs as test does; "
                  f"its pick is test's on {numbers['picks']:.2f} of {numbers['seeds']} seeds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"table": args.table, "lumos_steps": args.lumos_steps,
                                    "sasrec_epochs": args.sasrec_epochs, "runs": runs, "agreement": report}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
