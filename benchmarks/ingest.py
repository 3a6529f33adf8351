"""Ingest throughput: events per second for the quickstart recipe at growing sizes on local[*].

    python benchmarks/ingest.py [--sizes 1000000 4000000] [--out benchmarks/results/ingest.json]

Each size gets fresh synthetic data (100 events per user) and a fresh workspace; the time counted
is `run_ingest` alone (validation, vocabularies, sequences, three Delta commits), with the Spark
session already started, so the growth of cost with size shows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from lumos.core.config import load_config
from lumos.core.spark import workspace_spark
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES

RECIPE = RECIPES / "ingest.toml"


def measure(spark, events: int, scratch: Path) -> dict:
    data_dir = scratch / f"data-{events}"
    spec = SyntheticSpec(users=max(events // 100, 1), events=events, seed=0)
    started = time.perf_counter()
    generate_quickstart(data_dir, spec)
    synth_seconds = time.perf_counter() - started

    workspace = open_workspace(_project(scratch / f"ws-{events}"))
    recipe = load_config(IngestRecipe, RECIPE, [f"source.path={data_dir / 'events'}",
                                                  f"users.path={data_dir / 'users.parquet'}",
                                                  f"calendar.path={data_dir / 'calendar.csv'}"])
    started = time.perf_counter()
    result = run_ingest(spark, workspace, recipe, RECIPE.parent)
    seconds = time.perf_counter() - started
    return {
        "events": events,
        "users": spec.users,
        "synth_seconds": round(synth_seconds, 2),
        "ingest_seconds": round(seconds, 2),
        "events_per_second": round(events / seconds),
        "sequence_rows": sum(result.stats["rows_by_split"].values()),
        "tokens": result.stats["tokens"],
    }


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ingest.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lumos-bench-") as scratch:
        workspace = open_workspace(_project(Path(scratch) / "session"))
        spark = workspace_spark(workspace)
        results = []
        for events in args.sizes:
            result = measure(spark, events, Path(scratch))
            print(json.dumps(result), flush=True)
            results.append(result)
    report = {
        "benchmark": "ingest",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "spark_master": spark.sparkContext.master},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
