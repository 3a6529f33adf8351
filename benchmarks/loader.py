"""Training-loader throughput: samples per second over one epoch of the train split, three ways.

    python benchmarks/loader.py [--workspace DIR] [--users 20000] [--events 2000000]
                                [--batch-size 256] [--spark-rows 20000] [--out benchmarks/results/loader.json]

On one sequences table version (the quickstart recipe over synthetic data; made in DIR, by default
<tmp>/lumos-bench-loader, unless it already holds quickstart.sequences, so a second run reuses it):

(a) `SequenceLoader`: Delta log → pyarrow row groups → padded Batches, shuffled, no model.
(b) the ceiling: a raw pyarrow scan of the same files and columns, filtered to the split and
    decoded to numpy (offsets + flat values), with no batching or padding at all. Also reported:
    the same scan without the filter (Parquet decoding alone, the hard floor for any reader).
(c) the naive baseline: Spark `versionAsOf` → `toPandas()` → a Python loop over rows building
    padded lists → tensors, on the first `--spark-rows` rows of the split (a per-sample rate).

Targets: a/c ≥ 10 and a/b ≥ 0.5. (a) and (b) take the best of two passes after a warm-up read,
so the page cache holds the files for both.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from lumos.core.config import load_config
from lumos.core.spark import workspace_spark
from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import open_workspace
from lumos.data.contract import FeatureSpec
from lumos.data.ingest import run_ingest
from lumos.data.loader import SequenceLoader, default_workers
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import SequencesVersion, open_sequences
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES

RECIPE = RECIPES / "ingest.toml"
SEQUENCES = TableRef("quickstart", "sequences")
SPLIT = "train"


def ensure_table(project: Path, users: int, events: int) -> None:
    """Generate and ingest the quickstart data in `project` unless its table already exists."""
    workspace = open_workspace(project)
    if Path(table_location(workspace, SEQUENCES), "_delta_log").is_dir():
        return
    data = project / "data"
    print(f"generating {events:,} events of {users:,} users in {data}", flush=True)
    generate_quickstart(data, SyntheticSpec(users=users, events=events, seed=0))
    recipe = load_config(IngestRecipe, RECIPE, [f"source.path={data / 'events'}", f"users.path={data / 'users.parquet'}",
                                                  f"calendar.path={data / 'calendar.csv'}"])
    started = time.perf_counter()
    result = run_ingest(workspace_spark(workspace), workspace, recipe, RECIPE.parent, report=lambda line: print(line, flush=True))
    print(f"ingested {result.tables['sequences']} in {time.perf_counter() - started:.0f}s", flush=True)


def measure_loader(table: SequencesVersion, batch_size: int, workers: int) -> dict:
    started = time.perf_counter()
    loader = SequenceLoader(table.snapshot, table.spec, batch_size, split=SPLIT, seed=0, num_workers=workers)
    setup = time.perf_counter() - started
    best = float("inf")
    for epoch in range(2):
        loader.set_epoch(epoch)
        started = time.perf_counter()
        samples = sum(batch.size for batch in loader)
        best = min(best, time.perf_counter() - started)
    return {"samples": samples, "batches": len(loader), "batch_size": batch_size, "workers": workers,
            "setup_seconds": round(setup, 3), "epoch_seconds": round(best, 3), "samples_per_second": round(samples / best)}


def raw_scan(paths: list[str], columns: list[str], filter_split: bool = True) -> int:
    """Read the files' columns, keep the split's rows, and decode every column to numpy; returns
    the split's rows (also without `filter_split`, which decodes every row)."""
    samples = 0
    for path in paths:
        table = pq.read_table(path, columns=[*columns, "split"])
        matches = pc.equal(table.column("split"), SPLIT)
        if filter_split:
            table = table.filter(matches)
        for name in columns:
            array = table.column(name).combine_chunks()
            if hasattr(array, "offsets"):
                np.asarray(array.offsets)
                array.values.to_numpy()
            else:
                array.to_numpy(zero_copy_only=False)
        samples += pc.sum(matches).as_py() or 0
    return samples


def measure_raw(table: SequencesVersion, columns: list[str], filter_split: bool = True) -> dict:
    paths = [data_file.path for data_file in table.snapshot.files]
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        samples = raw_scan(paths, columns, filter_split)
        best = min(best, time.perf_counter() - started)
    return {"samples": samples, "seconds": round(best, 3), "samples_per_second": round(samples / best)}


def naive_batch(rows: list, spec: FeatureSpec) -> dict[str, torch.Tensor]:
    """What a first attempt looks like: Python lists padded row by row, then torch.tensor."""
    longest = max(max(len(row["item"]) for row in rows), 1)
    batch = {}
    for name in spec.token_categorical:
        batch[name] = torch.tensor([list(row[name]) + [0] * (longest - len(row[name])) for row in rows], dtype=torch.int64)
    batch["numeric"] = torch.tensor(
        [[[float(row[name][t]) if t < len(row[name]) else 0.0 for name in spec.token_numeric] for t in range(longest)] for row in rows],
        dtype=torch.float32,
    )
    batch["mask"] = torch.tensor([[t < len(row["item"]) for t in range(longest)] for row in rows])
    for name in spec.static_categorical:
        batch[name] = torch.tensor([row[name] for row in rows], dtype=torch.int64)
    batch["static_numeric"] = torch.tensor([[row[name] for name in spec.static_numeric] for row in rows], dtype=torch.float32)
    batch["future"] = torch.tensor([[[row[f"future_{flag}"][d] for flag in spec.future_flags] for d in range(spec.future_slots)]
                                    for row in rows], dtype=torch.float32)
    batch["next_item"] = torch.tensor([0 if row["next_item"] is None or row["next_item"] != row["next_item"] else int(row["next_item"])
                                       for row in rows], dtype=torch.int64)
    batch["act"] = torch.tensor([[row[f"act_{days}d"] for days in spec.horizons_days] for row in rows], dtype=torch.float32)
    batch["value"] = torch.tensor([[row[f"value_{days}d"] for days in spec.horizons_days] for row in rows], dtype=torch.float32)
    return batch


def measure_spark(spark, table: SequencesVersion, columns: list[str], rows: int, batch_size: int) -> dict:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    frame = (spark.read.format("delta").option("versionAsOf", table.snapshot.version).load(table.snapshot.table_path)
             .where(F.col("split") == SPLIT).select(*columns).limit(rows))
    pandas = frame.toPandas()
    collected = time.perf_counter() - started
    records = [row._asdict() for row in pandas.itertuples(index=False)]
    for first in range(0, len(records), batch_size):
        naive_batch(records[first:first + batch_size], table.spec)
    seconds = time.perf_counter() - started
    return {"samples": len(records), "seconds": round(seconds, 3), "to_pandas_seconds": round(collected, 3),
            "samples_per_second": round(len(records) / seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=Path, default=Path(tempfile.gettempdir()) / "lumos-bench-loader",
                        help="project folder holding (or to hold) quickstart.sequences")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--spark-rows", type=int, default=20_000, help="rows of the split the Spark baseline converts")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "loader.json"))
    args = parser.parse_args()

    args.workspace.mkdir(parents=True, exist_ok=True)
    ensure_table(args.workspace, args.users, args.events)
    workspace = open_workspace(args.workspace)
    table = open_sequences(workspace, SEQUENCES)
    columns = [name for name in pq.read_schema(table.snapshot.files[0].path).names
               if name not in ("user_id", "split", "as_of", "length")]
    raw_scan([data_file.path for data_file in table.snapshot.files], columns)  # warm the page cache

    loader = measure_loader(table, args.batch_size, args.workers)
    print("loader", json.dumps(loader), flush=True)
    raw = measure_raw(table, columns)
    print("raw pyarrow", json.dumps(raw), flush=True)
    decode_only = measure_raw(table, columns, filter_split=False)
    print("raw pyarrow, no split filter", json.dumps(decode_only), flush=True)
    spark = workspace_spark(workspace)
    naive = measure_spark(spark, table, columns, args.spark_rows, args.batch_size)
    print("spark naive", json.dumps(naive), flush=True)

    report = {
        "benchmark": "loader",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch.get_num_threads()},
        "table": {"ref": str(table.ref), "files": len(table.snapshot.files), "bytes": table.snapshot.size_bytes,
                  "split": SPLIT, "max_len": table.spec.max_len},
        "loader": loader,
        "raw_pyarrow": raw,
        "raw_pyarrow_decode_only": decode_only,
        "spark_naive": naive,
        "ratios": {"loader_over_spark": round(loader["samples_per_second"] / naive["samples_per_second"], 2),
                   "loader_over_raw": round(loader["samples_per_second"] / raw["samples_per_second"], 3),
                   "loader_over_decode_only": round(loader["samples_per_second"] / decode_only["samples_per_second"], 3)},
        "targets": {"loader_over_spark": 10, "loader_over_raw": 0.5},
    }
    print(json.dumps(report["ratios"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
