"""Matmul kernels of the benchmark models under the schedule search: GFLOP/s of the renderer's
default, of the best candidate without register blocking (what the search had before the
micro-kernel) and of the best register-blocked candidate, all measured in the same search rounds.

    python benchmarks/compile_matmul.py [--batch 256] [--search-budget 120] [--models quickstart sasrec]
                                        [--out benchmarks/results/compile_matmul.json]

Per distinct matmul kernel (identical layers are one group, their times summed): the candidates'
median ms per call at the full batch, each verified against the interpreter first. The machine's
load average is printed beside the numbers: on a shared machine they are only comparable with
others taken at the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from compile import QUICKSTART_FEATURES, SASREC_CONFIG, SASREC_FEATURES

from lumos.compile.engine import SEARCH_BUDGET_S, compile_model
from lumos.compile.program import Options
from lumos.compile.runtime.kernel_cache import KernelCache
from lumos.compile.search.climb import Candidate, Group, kernel_flops
from lumos.core.config import load_config
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.model import LumosModel

ROOT = Path(__file__).resolve().parent.parent
MIN_FLOPS = 10**7
"""Groups with fewer matmul FLOPs (layer norm's sums of squares, one-row decoder products) are left out."""


def _best(candidates: list[Candidate]) -> Candidate | None:
    measured = [c for c in candidates if c.verified and c.ms is not None]
    return min(measured, key=lambda c: c.ms) if measured else None


def group_row(group: Group) -> dict:
    """One matmul group: default, best unblocked and best blocked candidate, ms and GFLOP/s."""
    flops = sum(kernel_flops(kernel) for kernel in group.kernels)
    row = {"kernels": [k.name for k in group.kernels], "shape": list(group.kernels[0].node.shape),
           "origin": group.kernels[0].node.origin.split(" (")[0], "gflop": flops / 1e9}
    picks = {"default": group.candidates[0], "unblocked": _best([c for c in group.candidates if not c.schedule.rows]),
             "blocked": _best([c for c in group.candidates if c.schedule.rows]), "chosen": group.best}
    for name, candidate in picks.items():
        row[f"{name}_schedule"] = candidate.schedule.describe() if candidate else None
        row[f"{name}_ms"] = candidate.ms if candidate else None
        row[f"{name}_gflops"] = flops / (candidate.ms / 1000) / 1e9 if candidate and candidate.ms else None
    row["rejected"] = sum(bool(c.rejected) for c in group.candidates)
    row["untried"] = sum(c.ms is None and not c.rejected for c in group.candidates)
    return row


def bench(name: str, model: LumosModel, batch: int, budget: float) -> list[dict]:
    model.eval()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lumos-bench-matmul-") as folder:
        result = compile_model(model, batch, model.features.max_len, KernelCache(folder, "cpu"),
                               Options(search_budget_s=budget, search_cache=False))
    search = result.compilation.search
    rows = [group_row(group) for group in search.groups
            if sum(kernel_flops(k) for k in group.kernels) >= MIN_FLOPS]
    rows.sort(key=lambda row: -row["gflop"])
    print(f"== {name}: batch {batch}; search {search.seconds:.0f} s, {search.rounds} rounds; load average "
          f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
    print(f"  {'kernels':14} {'shape':18} {'GFLOP':>6} {'default':>8} {'unblocked':>10} {'blocked':>8}  GFLOP/s; "
          "best blocked schedule; origin")
    for row in rows:
        cells = [f"{row[f'{pick}_gflops']:.1f}" if row[f"{pick}_gflops"] else "-" for pick in ("default", "unblocked", "blocked")]
        print(f"  {','.join(row['kernels'])[:14]:14} {str(row['shape']):18} {row['gflop']:6.2f} {cells[0]:>8} {cells[1]:>10} {cells[2]:>8}  "
              f"{row['blocked_schedule'] or '-'}; {row['origin'][-40:]}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--search-budget", type=float, default=SEARCH_BUDGET_S)
    parser.add_argument("--models", nargs="+", default=["quickstart", "sasrec"], choices=["quickstart", "sasrec"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "compile_matmul.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    models = {"quickstart": lambda: LumosModel(load_config(TrainConfig, RECIPES / "train.toml").model, QUICKSTART_FEATURES),
              "sasrec": lambda: LumosModel(SASREC_CONFIG, SASREC_FEATURES)}
    report = {"threads": torch.get_num_threads(),
              "results": {name: bench(name, models[name](), args.batch, args.search_budget) for name in args.models}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
