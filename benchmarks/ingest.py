"""Ingest throughput against a hand-written PySpark floor, at growing sizes, on local[*] or a master.

    python benchmarks/ingest.py [--sizes 1000000 2000000 4000000] [--events-per-user 100]
                                [--master spark://127.0.0.1:7077] [--profile] [--store-once] [--out FILE]

Each size gets fresh synthetic data (`lumos data synth` with --events N and N/100 users: the
issue's 2M events of 20,000 users) and a fresh workspace. Two jobs run on the same session, one
after the other, each timed alone:

- floor: the plainest PySpark job that does the core of ingest: read the events, drop exact
  duplicates, and write each user's time-sorted events to Parquet;
- lumos: `run_ingest` with the quickstart recipe (validation with reasons, vocabularies, 11 time
  cutoffs of sequences with targets and calendar context, three Delta commits with lineage).

- with `--store-once`, an experiment on the table's layout, not what Lumos writes: from the same
  checked events, vocabulary and token order (computed and cached once, untimed), two writes to
  plain Parquet, each timed alone: today's rows (`build_sequences`: one row per user and cutoff,
  each with its history arrays) and the store-once layout (one row per user: the tokens some
  row reads, each once, and the user's cuts as an array of (split, as_of, cut position, targets,
  static features, calendar context), from which a loader would slice each history and compute
  age_days). Their difference, taken from Lumos's time, projects what the layout change would
  bring against the floor.

The Spark session is started once before any timing, so both figures leave its start-up out,
and at the first size both jobs run once untimed first (a session's first run of a job pays the
JIT's warm-up).
`--profile` turns on Spark's event log and prints, per Lumos job, its duration, its stages, the
rows it scanned from the source files and the bytes it shuffled: where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from spark_profile import EVENT_LOG_CONF, last_job_id, print_profile

from lumos.core.config import load_config
from lumos.core.spark import workspace_spark
from lumos.core.workspace import open_workspace
from lumos.data.ingest import count_rejects, read_checked_inputs, run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import build_sequences, build_vocab, sequence_tokens
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.data.validation import valid_events
from lumos.quickstart import RECIPES

RECIPE = RECIPES / "ingest.toml"


def floor_job(spark, events_dir: Path, out: Path) -> None:
    """Read, drop duplicates, write each user's events sorted by time: what any ingest must do."""
    events = spark.read.parquet(str(events_dir)).dropDuplicates()
    events.repartition("user_id").sortWithinPartitions("user_id", "ts").write.mode("overwrite").parquet(str(out))


def store_once_experiment(spark, workspace, recipe: IngestRecipe, out: Path) -> dict:
    """Seconds and bytes of writing today's sequences rows and the store-once layout (see the
    module's docstring), each from the same cached inputs."""
    # The row parts of build_sequences, reused so that both layouts hold the same values.
    from pyspark.sql import functions as F

    from lumos.data.sequences import (
        _act_events,
        _user_tokens,
        _with_act_targets,
        _with_future_context,
        _with_static_features,
        cut_rows,
    )

    sources = read_checked_inputs(spark, workspace, recipe, RECIPE.parent)
    checked = sources.checked.persist()
    count_rejects(checked)
    events = valid_events(checked)
    vocab = build_vocab(events, sources.users, recipe).persist()
    vocab.count()
    tokens = sequence_tokens(events, recipe).persist()
    tokens.count()

    rows = build_sequences(events, vocab, sources.users, sources.calendar, recipe, tokens)
    cuts = _with_act_targets(cut_rows(tokens, recipe), _act_events(events, tokens, recipe), recipe)
    cuts = _with_future_context(_with_static_features(cuts, sources.users, vocab, recipe), sources.calendar, recipe)
    per_user = cuts.groupBy("user_id").agg(
        F.sort_array(F.collect_list(F.struct(*[name for name in cuts.columns if name != "user_id"]))).alias("cuts"))
    store_once = per_user.join(_user_tokens(tokens, vocab, recipe), F.col("user_id") == F.col("token_user_id")).drop(
        "token_user_id", "positions")
    result = {}
    for name, frame in (("rows", rows), ("store_once", store_once)):
        started = time.perf_counter()
        frame.write.mode("overwrite").parquet(str(out / name))
        result[f"{name}_write_seconds"] = round(time.perf_counter() - started, 2)
        result[f"{name}_bytes"] = sum(path.stat().st_size for path in (out / name).rglob("*.parquet"))
    for frame in (tokens, vocab, checked):
        frame.unpersist()
    return result


def measure(spark, events: int, events_per_user: int, scratch: Path, store_once: bool = False,
            warm_up: bool = False) -> dict:
    data_dir = scratch / f"data-{events}"
    spec = SyntheticSpec(users=max(events // events_per_user, 1), events=events, seed=0)
    generate_quickstart(data_dir, spec)

    recipe = load_config(IngestRecipe, RECIPE, [f"source.path={data_dir / 'events'}",
                                                  f"users.path={data_dir / 'users.parquet'}",
                                                  f"calendar.path={data_dir / 'calendar.csv'}"])
    if warm_up:
        # Untimed: a session's first run of a job pays the JIT's warm-up and a cold page cache
        # (the floor at 1M took 10.8 s first, 2.8 s after). Both jobs are warmed, so that
        # neither is compared cold against the other warm; the ingest in a workspace of its own,
        # since a second ingest of the same work writes nothing.
        floor_job(spark, data_dir / "events", scratch / f"floor-{events}")
        run_ingest(spark, open_workspace(_folder(scratch / f"ws-{events}-warm-up")), recipe, RECIPE.parent)
    started = time.perf_counter()
    floor_job(spark, data_dir / "events", scratch / f"floor-{events}")
    floor_seconds = time.perf_counter() - started

    workspace = open_workspace(_folder(scratch / f"ws-{events}"))
    jobs_before = last_job_id(spark)
    started = time.perf_counter()
    result = run_ingest(spark, workspace, recipe, RECIPE.parent)
    seconds = time.perf_counter() - started
    measured = {
        "events": events,
        "users": spec.users,
        "floor_seconds": round(floor_seconds, 2),
        "ingest_seconds": round(seconds, 2),
        "ratio_to_floor": round(seconds / floor_seconds, 2),
        "events_per_second": round(events / seconds),
        "floor_events_per_second": round(events / floor_seconds),
        "spark_jobs": last_job_id(spark) - jobs_before,
        "spark_job_ids": [jobs_before + 1, last_job_id(spark)],  # the timed ingest's, for --profile
        "sequence_rows": sum(result.stats["rows_by_split"].values()),
        "tokens": result.stats["tokens"],
    }
    if store_once:
        experiment = store_once_experiment(spark, workspace, recipe, scratch / f"layouts-{events}")
        projected = seconds - experiment["rows_write_seconds"] + experiment["store_once_write_seconds"]
        measured |= {**experiment, "store_once_projected_seconds": round(projected, 2),
                     "store_once_projected_ratio_to_floor": round(projected / floor_seconds, 2)}
    return measured


def _folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 2_000_000, 4_000_000])
    parser.add_argument("--events-per-user", type=int, default=100)
    parser.add_argument("--master", help="Spark master (default: the workspace default, local[*])")
    parser.add_argument("--shuffle-partitions", type=int,
                        help="[spark] shuffle_partitions for the session, floor and ingest alike (default: the workspace's, 8)")
    parser.add_argument("--profile", action="store_true", help="print where Lumos's time goes, per Spark job")
    parser.add_argument("--store-once", action="store_true",
                        help="also time today's sequences rows against a store-once layout (an experiment)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ingest.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lumos-bench-") as scratch:
        scratch = Path(scratch)
        workspace = open_workspace(_folder(scratch / "session"))
        conf = dict(workspace.settings.spark.conf)
        spark_settings = workspace.settings.spark
        if args.shuffle_partitions:
            spark_settings = replace(spark_settings, shuffle_partitions=args.shuffle_partitions)
        if args.profile:
            conf |= {**EVENT_LOG_CONF, "spark.eventLog.dir": str(_folder(scratch / "events-log"))}
        spark_settings = replace(spark_settings, conf=conf, master=args.master or spark_settings.master)
        workspace = replace(workspace, settings=replace(workspace.settings, spark=spark_settings))
        spark = workspace_spark(workspace)
        spark.range(1).count()  # the session and its JVM are up before any timing
        results = []
        for events in args.sizes:
            result = measure(spark, events, args.events_per_user, scratch, args.store_once,
                             warm_up=events == args.sizes[0])
            print(json.dumps(result), flush=True)
            results.append(result)
        master = spark.sparkContext.master
        spark.stop()
        if args.profile:
            for result in results:
                print(f"profile of the timed ingest of {result['events']:,} events")
                print_profile(scratch / "events-log", tuple(result["spark_job_ids"]))
    report = {
        "benchmark": "ingest",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "spark_master": master,
                    "shuffle_partitions": args.shuffle_partitions or workspace.settings.spark.shuffle_partitions},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
