"""Ingest throughput against a hand-written PySpark floor, at growing sizes, on local[*] or a master.

    python benchmarks/ingest.py [--sizes 1000000 2000000 4000000] [--events-per-user 100] [--rounds 1]
                                [--processes] [--master spark://127.0.0.1:7077] [--profile] [--store-once]
                                [--out FILE]

Each size gets fresh synthetic data (`lumos data synth` with --events N and N/100 users: the
issue's 2M events of 20,000 users). Two jobs are timed, one after the other, each alone, and
alternated `--rounds` times (floor, Lumos, floor, Lumos, ...; every Lumos run in a fresh
workspace), so that the ratio of each pair is taken on the machine as it was then:

- floor: the plainest PySpark job that does the core of ingest (`benchmarks/ingest_floor.py`):
  read the events, drop exact duplicates, and write each user's time-sorted events to Parquet;
- lumos: `run_ingest` with the quickstart recipe (validation with reasons, vocabularies, 11 time
  cutoffs of sequences with targets and calendar context, three Delta commits with lineage).

By default both run in one Spark session, started before any timing, so both figures leave out
its start-up; at the first size both jobs run once untimed first (a session's first run of a job
pays the JIT's warm-up). With `--processes` each is instead a whole command in a new process, as
the issue measured them by hand and as cron runs them: `python benchmarks/ingest_floor.py` (its
own plain session) against `lumos ingest`, Spark's start and a cold JVM included in both (one
untimed run of each first, so that neither reads its jars from disk).

- with `--store-once`, an experiment on the table's layout, not what Lumos writes: from the same
  checked events, vocabulary and token order (computed and cached once, untimed), two writes to
  plain Parquet, each timed alone: today's rows (`build_sequences`: one row per user and cutoff,
  each with its history arrays) and the store-once layout (one row per user: the tokens some
  row reads, each once, and the user's cuts as an array of (split, as_of, cut position, targets,
  static features, calendar context), from which a loader would slice each history and compute
  age_days). Their difference, taken from Lumos's time, projects what the layout change would
  bring against the floor.

`--profile` turns on Spark's event log and prints, per Lumos job of the last round, its
duration, its stages, the rows it scanned from the source files and the bytes it shuffled: where
the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ingest_floor import floor_job
from spark_profile import EVENT_LOG_CONF, last_job_id, print_profile

from lumos.core.config import load_config
from lumos.core.spark import driver_memory, workspace_spark
from lumos.core.workspace import open_workspace
from lumos.data.ingest import count_rejects, read_checked_inputs, run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import build_sequences, build_vocab, sequence_tokens
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.data.validation import valid_events
from lumos.quickstart import RECIPES

RECIPE = RECIPES / "ingest.toml"


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


def synthesize(events: int, events_per_user: int, scratch: Path) -> tuple[Path, SyntheticSpec]:
    data_dir = scratch / f"data-{events}"
    spec = SyntheticSpec(users=max(events // events_per_user, 1), events=events, seed=0)
    generate_quickstart(data_dir, spec)
    return data_dir, spec


def recipe_overrides(data_dir: Path) -> list[str]:
    return [f"source.path={data_dir / 'events'}", f"users.path={data_dir / 'users.parquet'}",
            f"calendar.path={data_dir / 'calendar.csv'}"]


def measure(spark, events: int, events_per_user: int, scratch: Path, rounds: int = 1, store_once: bool = False,
            warm_up: bool = False) -> dict:
    """Floor and Lumos in this process's session, alternated `rounds` times."""
    data_dir, spec = synthesize(events, events_per_user, scratch)
    recipe = load_config(IngestRecipe, RECIPE, recipe_overrides(data_dir))
    events_dir, floor_out = str(data_dir / "events"), str(scratch / f"floor-{events}")
    if warm_up:
        # Untimed: a session's first run of a job pays the JIT's warm-up and a cold page cache
        # (the floor at 1M took 10.8 s first, 2.8 s after). Both jobs are warmed, so that
        # neither is compared cold against the other warm; the ingest in a workspace of its own,
        # since a second ingest of the same work writes nothing.
        floor_job(spark, events_dir, floor_out)
        run_ingest(spark, open_workspace(_folder(scratch / f"ws-{events}-warm-up")), recipe, RECIPE.parent)
    floor_seconds, ingest_seconds = [], []
    for round_number in range(rounds):
        started = time.perf_counter()
        floor_job(spark, events_dir, floor_out)
        floor_seconds.append(time.perf_counter() - started)

        workspace = open_workspace(_folder(scratch / f"ws-{events}-{round_number}"))
        jobs_before = last_job_id(spark)
        started = time.perf_counter()
        result = run_ingest(spark, workspace, recipe, RECIPE.parent)
        ingest_seconds.append(time.perf_counter() - started)
    measured = {
        "events": events,
        "users": spec.users,
        **_paired(floor_seconds, ingest_seconds, events),
        "spark_jobs": last_job_id(spark) - jobs_before,
        "spark_job_ids": [jobs_before + 1, last_job_id(spark)],  # the last ingest's, for --profile
        "sequence_rows": sum(result.stats["rows_by_split"].values()),
        "tokens": result.stats["tokens"],
    }
    if store_once:
        experiment = store_once_experiment(spark, workspace, recipe, scratch / f"layouts-{events}")
        projected = statistics.median(ingest_seconds) - experiment["rows_write_seconds"] \
            + experiment["store_once_write_seconds"]
        measured |= {**experiment, "store_once_projected_seconds": round(projected, 2),
                     "store_once_projected_ratio_to_floor": round(projected / statistics.median(floor_seconds), 2)}
    return measured


def measure_processes(events: int, events_per_user: int, scratch: Path, rounds: int, shuffle_partitions: int,
                      master: str, driver_memory: str) -> dict:
    """Floor and Lumos as whole commands, each in a new process, alternated `rounds` times after
    one untimed run of each; the floor's driver gets the memory Lumos's gets."""
    data_dir, spec = synthesize(events, events_per_user, scratch)
    floor = [sys.executable, str(Path(__file__).with_name("ingest_floor.py")), str(data_dir / "events"),
             str(scratch / f"floor-{events}"), "--master", master, "--shuffle-partitions", str(shuffle_partitions),
             "--driver-memory", driver_memory]
    sets = [item for override in recipe_overrides(data_dir) for item in ("--set", override)]

    def lumos(workspace: Path) -> list[str]:
        _folder(workspace)  # a fresh workspace: a second ingest of the same work writes nothing
        (workspace / "lumos.toml").write_text(f'[spark]\nmaster = "{master}"\nshuffle_partitions = {shuffle_partitions}\n')
        return [sys.executable, "-m", "lumos", "--workspace", str(workspace), "ingest", "--recipe", str(RECIPE), *sets]

    def timed(command: list[str]) -> float:
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - started

    timed(floor)
    timed(lumos(scratch / f"ws-{events}-warm-up"))
    floor_seconds, ingest_seconds = [], []
    for round_number in range(rounds):
        floor_seconds.append(timed(floor))
        ingest_seconds.append(timed(lumos(scratch / f"ws-{events}-{round_number}")))
    return {"events": events, "users": spec.users, **_paired(floor_seconds, ingest_seconds, events)}


def _paired(floor_seconds: list[float], ingest_seconds: list[float], events: int) -> dict:
    """Medians of each job's rounds, and the ratio of each round's pair (min, median, max)."""
    floor, ingest = statistics.median(floor_seconds), statistics.median(ingest_seconds)
    ratios = [lumos / plain for plain, lumos in zip(floor_seconds, ingest_seconds, strict=True)]
    return {
        "floor_seconds": round(floor, 2),
        "ingest_seconds": round(ingest, 2),
        "ratio_to_floor": round(statistics.median(ratios), 2),
        "ratio_min_max": [round(min(ratios), 2), round(max(ratios), 2)],
        "rounds": {"floor_seconds": [round(x, 2) for x in floor_seconds],
                   "ingest_seconds": [round(x, 2) for x in ingest_seconds]},
        "events_per_second": round(events / ingest),
        "floor_events_per_second": round(events / floor),
    }


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
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each pair runs, alternated; the ratio is reported per pair (min, median, max)")
    parser.add_argument("--processes", action="store_true",
                        help="time whole commands in new processes (Spark start and a cold JVM included), "
                             "as the issue measured by hand")
    parser.add_argument("--profile", action="store_true", help="print where Lumos's time goes, per Spark job")
    parser.add_argument("--store-once", action="store_true",
                        help="also time today's sequences rows against a store-once layout (an experiment)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "ingest.json"))
    args = parser.parse_args()
    if args.processes and (args.profile or args.store_once):
        parser.error("--profile and --store-once need the one-session mode; leave out --processes")

    with tempfile.TemporaryDirectory(prefix="lumos-bench-") as scratch:
        scratch = Path(scratch)
        workspace = open_workspace(_folder(scratch / "session"))
        spark_settings = workspace.settings.spark
        if args.shuffle_partitions:
            spark_settings = replace(spark_settings, shuffle_partitions=args.shuffle_partitions)
        spark_settings = replace(spark_settings, master=args.master or spark_settings.master)
        if args.processes:
            results = []
            for events in args.sizes:
                results.append(measure_processes(events, args.events_per_user, scratch, args.rounds,
                                                 spark_settings.shuffle_partitions, spark_settings.master,
                                                 driver_memory(spark_settings.driver_memory)))
                print(json.dumps(results[-1]), flush=True)
            master = spark_settings.master
        else:
            if args.profile:
                conf = {**spark_settings.conf, **EVENT_LOG_CONF, "spark.eventLog.dir": str(_folder(scratch / "events-log"))}
                spark_settings = replace(spark_settings, conf=conf)
            workspace = replace(workspace, settings=replace(workspace.settings, spark=spark_settings))
            spark = workspace_spark(workspace)
            spark.range(1).count()  # the session and its JVM are up before any timing
            results = []
            for events in args.sizes:
                results.append(measure(spark, events, args.events_per_user, scratch, args.rounds, args.store_once,
                                       warm_up=events == args.sizes[0]))
                print(json.dumps(results[-1]), flush=True)
            master = spark.sparkContext.master
            spark.stop()
            if args.profile:
                for result in results:
                    print(f"profile of the last timed ingest of {result['events']:,} events")
                    print_profile(scratch / "events-log", tuple(result["spark_job_ids"]))
    report = {
        "benchmark": "ingest",
        "mode": "processes" if args.processes else "one session",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "spark_master": master,
                    "shuffle_partitions": spark_settings.shuffle_partitions,
                    "driver_memory": driver_memory(spark_settings.driver_memory)},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
