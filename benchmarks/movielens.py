"""MovieLens-100K next-item table: Lumos vs SASRec vs popularity, mean ± std over seeds.

Run after `examples/movielens/run.sh` (or its fetch and ingest steps), from the repository root:

    python benchmarks/movielens.py                        # Lumos and SASRec, seeds 0 to 4
    python benchmarks/movielens.py --models lumos --seeds 0

Every model is scored on the same table version, split and rows by the same code: test split
(each user's last rating), full item corpus, history excluded. Lumos runs are ordinary MLflow runs
in the example's workspace (experiment "movielens"), each scored with the task
examples/movielens/tasks/movielens_next_item.toml. Writes benchmarks/results/movielens.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lumos.core.config import load_config
from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import open_workspace
from lumos.data.delta_snapshot import open_snapshot
from lumos.data.sequences_version import ingest_lineage, open_sequences
from lumos.eval.evaluate import evaluate
from lumos.eval.leaderboard import Subject
from lumos.eval.tasks import load_tasks
from lumos.train import retrieval_metrics as M
from lumos.train.config import TrainConfig
from lumos.train.run import train

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "movielens"
RESULTS = Path(__file__).resolve().parent / "results"
METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr")
TASK = "movielens_next_item"


def _sasrec():
    spec = importlib.util.spec_from_file_location("sasrec_benchmark", Path(__file__).resolve().parent / "sasrec.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def lumos_runs(seeds: list[int], overrides: list[str]) -> tuple[list[dict], dict, str]:
    """(runs, popularity metrics, data version) for the example's train.toml at each seed."""
    workspace = open_workspace(EXAMPLE)
    task = load_tasks([EXAMPLE / "tasks"])[TASK]
    runs, popularity, data = [], {}, ""
    for seed in seeds:
        config = load_config(TrainConfig, EXAMPLE / "train.toml", [*overrides, f"run.seed={seed}"])
        started = time.perf_counter()
        summary = train(config, workspace, report=lambda line: print(line, file=sys.stderr, flush=True))
        seconds = time.perf_counter() - started
        [result] = evaluate(workspace, [task], Subject(key=f"run:{summary.run_id}", label=f"seed {seed}",
                                                         run_id=summary.run_id))
        fit = summary.result
        runs.append({"seed": seed, "run_id": summary.run_id, "best_step": fit.best_step, "steps": fit.step,
                     "valid_ndcg@10": fit.best_value, "seconds": round(seconds, 1), "parameters": summary.parameters,
                     **{name: result.metrics[name] for name in METRICS}})
        popularity, data = result.baseline_metrics, result.data
        print(f"lumos seed {seed}: " + " ".join(f"{n} {runs[-1][n]:.4f}" for n in METRICS), file=sys.stderr)
    return runs, popularity, data


def sasrec_runs(seeds: list[int], data_version: str) -> list[dict]:
    sasrec = _sasrec()
    data = sasrec.read_table(str(EXAMPLE), data_version)
    return [sasrec.train_and_score(data, sasrec.SASRecConfig(seed=seed),
                                   report=lambda line: print(line, file=sys.stderr, flush=True)) for seed in seeds]


def id_order_check(data_version: str) -> dict[str, dict[str, float]]:
    """Test metrics of popularity, and of popularity with the items whose raw id sorts after the
    last history item's id put first: the trick the old tie order (by item id) rewarded. On a
    table whose ties carry no signal it gains nothing."""
    workspace = open_workspace(EXAMPLE)
    sequences = open_sequences(workspace, TableRef.parse(data_version))
    _, vocab_ref = ingest_lineage(workspace, sequences.ref)
    vocab = pq.read_table([f.path for f in open_snapshot(table_location(workspace, vocab_ref), vocab_ref.version).files])
    items = vocab.filter(pc.equal(vocab["feature"], sequences.spec.item_feature)).to_pydict()
    raw = np.full(sequences.spec.item_vocab_size, "", dtype=object)
    raw[items["id"]] = items["token"]
    sasrec = _sasrec()
    data = sasrec.read_table(str(EXAMPLE), str(sequences.ref))
    history = torch.from_numpy(sasrec.padded(data.test.histories, data.max_len))
    # The task's own baseline (eval/score.py): ids go by descending count, so -id ranks by popularity.
    popularity = M.popularity_scores(-np.arange(sequences.spec.item_vocab_size), len(data.test.targets)).clone()
    after_last = torch.from_numpy(np.stack([raw > raw[row[-1]] for row in data.test.histories]))  # (B, V)
    scored = {"popularity": popularity, "popularity, ids after the last first": popularity + 1e12 * after_last}
    return {name: M.retrieval_metrics(M.target_ranks(scores, torch.from_numpy(data.test.targets), history))
            for name, scores in scored.items()}


def mean_std(runs: list[dict]) -> dict[str, list[float]]:
    return {name: [float(np.mean([r[name] for r in runs])), float(np.std([r[name] for r in runs], ddof=1)) if len(runs) > 1 else 0.0]
            for name in METRICS}


def markdown(table: dict) -> str:
    lines = ["| model | " + " | ".join(name.upper() for name in METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]
    for model, row in table.items():
        cells = [f"{m:.4f} ± {s:.4f}" if s else f"{m:.4f}" for m, s in (row[name] for name in METRICS)]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--models", nargs="+", default=["lumos", "sasrec"], choices=["lumos", "sasrec"])
    parser.add_argument("--data", default="movielens.sequences", help="table version for SASRec without a Lumos run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="train.toml override, k=v")
    parser.add_argument("--out", type=Path, default=RESULTS / "movielens.json", help="JSON results file")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    out: dict = {"hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
                             f"{torch.__version__}, {torch.get_num_threads()} threads", "seeds": args.seeds}
    table: dict = {}
    data = args.data
    if "lumos" in args.models:
        out["lumos"], popularity, data = lumos_runs(args.seeds, args.overrides)
        table["Lumos"] = mean_std(out["lumos"])
        table["popularity"] = {name: [popularity[name], 0.0] for name in METRICS}
        out["popularity"] = popularity
    if "sasrec" in args.models:
        out["sasrec"] = sasrec_runs(args.seeds, data)
        table["SASRec"] = mean_std(out["sasrec"])
    out["data"], out["table"] = data, table
    out["id_order_check"] = id_order_check(data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"{data}, test split, mean ± std over seeds {args.seeds}\n\n{markdown(table)}")
    print("\nthe old tie order's trick on this table: " + ", ".join(
        f"{name} ndcg@10 {metrics['ndcg@10']:.4f}" for name, metrics in out["id_order_check"].items()))


if __name__ == "__main__":
    main()
