"""Batch inference throughput: users/s of `lumos infer` end to end (features + model + Delta write)
and of the model alone, at two user counts, on local[*]; and what 100M users a day would cost.

    python benchmarks/infer.py [--users 5000 20000] [--events-per-user 40] [--engines torch compiled]
                               [--compile-seqs 16 32 48 64 100]
                               [--master spark://127.0.0.1:7077] [--out benchmarks/results/infer.json]
                               [--arrow-batch-sizes 2000 10000 40000] [--shuffle-partitions 2 8 32]
                               [--rounds 2] [--warmup] [--profile] [--threads 2 --spark-conf spark.task.cpus=2]
                               [--model-alone-threads 1] [--dirty 0 0.02]
    python benchmarks/infer.py --incremental --users 1000000 --history-days 30 60 120 [--events-per-user-day 1]

A quickstart-sized model (lumos/quickstart/train.toml's model, a few training steps: throughput
does not depend on how well it learned) is trained and promoted once on a small synthetic world.
Each measured world is a fresh synthetic log of the given number of users, read through
`--source` as a nightly job would read today's events. "Model only" scores the same users'
feature rows in one process with every core, from in-memory Arrow, no Spark. With `--engines
torch compiled` the model is also compiled once per length of `--compile-seqs` (`lumos compile
--seq N`, batch 512, a short search each; a batch runs on the shortest plan that holds it) and
each world is scored by both engines, one after the other. With `--master`, every Spark step (the
set-up's ingest included) runs on that cluster instead of local[*], e.g. one started by
`benchmarks/standalone_cluster.sh start`; the model-alone rate is still this process's.

Tuning: `--arrow-batch-sizes` (Spark's `spark.sql.execution.arrow.maxRecordsPerBatch`: the rows a
scoring task receives at a time, each batch sorted by history length before it is cut into
mini-batches of 512) and `--shuffle-partitions` (`spark.sql.shuffle.partitions`: the tasks that
build the feature rows and score them) run `lumos infer` end to end once per combination on each
world, set on the running session before each run; the model-alone rate is measured once, at
the session's batch size. `--rounds N` times every setting N times, every other round in reverse
order, and prints the medians; `--warmup` runs one untimed infer per world first (with
`--incremental`: an incremental rerun of the state's date, before the timed nights).

`--dirty 0 0.02`: each world is also scored with what a real log holds beside its events added,
0.02 of its rows (`add_dirt`): half exact duplicates of random events, half bad rows of five
kinds. Its valid events are the clean world's, so the model-alone rate is the same; the end to
end time shows what finding, counting and writing the rejects costs.

`--incremental`: the nightly shape instead (`lumos.data.user_state`). Per user count and each
`--history-days H`, a world of H + 1 days (`--events-per-user-day` events per user and day on
average): a full night at day H builds the user state from the first H days; the last day's
events then arrive as new files (one per part of the log), and the next night is timed twice:
incremental (the state carried forward, only the new files read) and a full rebuild of the same
date (--full). It prints and saves both times, their ratio, events read, both nights' users/s
against the model alone's, and the user state table's size and write time. A tiny check:
`--incremental --users 2000 --history-days 30 --warmup`. Every other mode above times full
nights (--full), as before the state.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from spark_profile import EVENT_LOG_CONF, last_job_id, print_profile

from lumos.core.config import load_config
from lumos.core.spark import workspace_spark
from lumos.core.tables import TableRef, table_location
from lumos.core.workspace import init_workspace, open_workspace
from lumos.data.loader import by_history_length, table_batches
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.data.training_data import training_data
from lumos.eval.promote import promote
from lumos.infer.features import inference_rows
from lumos.infer.run import InferOptions, infer
from lumos.infer.scoring import score_batch
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.run import train
from lumos.train.trained_model import load_registered_model

AS_OF = datetime.date(2026, 9, 29)
USERS_PER_DAY = 100_000_000
COMPILE_SEARCH_S = 30.0
"""Search budget per compiled length."""


def setup(folder: Path, compile_seqs: list[int], master: str | None, executor_memory: str,
          spark_conf: dict[str, str]) -> None:
    from lumos.data.ingest import run_ingest
    from lumos.data.recipe import IngestRecipe

    if master:
        # Executors run this Python (PySpark sends PYSPARK_PYTHON) and reach the driver on loopback.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark_conf = {**spark_conf, "spark.executor.memory": executor_memory}
    if master or spark_conf:
        settings = (f'[spark]\nmaster = "{master}"\n\n' if master else "") + "[spark.conf]\n"
        settings += "".join(f'"{key}" = "{value}"\n' for key, value in spark_conf.items())
        (folder / "lumos.toml").write_text(settings)
    else:
        init_workspace(folder)
    generate_quickstart(folder / "train-data", SyntheticSpec(users=1000, events=40_000))
    workspace = open_workspace(folder)
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={folder / 'train-data' / 'events'}", f"users.path={folder / 'train-data' / 'users.parquet'}",
        f"calendar.path={folder / 'train-data' / 'calendar.csv'}",
    ])
    run_ingest(workspace_spark(workspace), workspace, recipe, RECIPES)
    config = load_config(TrainConfig, RECIPES / "train.toml", ["run.max_steps=5", "run.eval_every=1000"])
    summary = train(config, workspace)
    promote(workspace, "bench", "production", run_id=summary.run_id)
    from lumos.compile.engine import compile_run

    for seq in compile_seqs:
        compile_run(workspace, summary.run_id, batch_size=512, seq_len=seq, search_budget_s=COMPILE_SEARCH_S)


def model_only(workspace, users_source: Path, engines: list[str], max_users: int | None = None,
               threads: int | None = None) -> dict:
    """Users/s of the model alone, per engine, over the same rows infer scores (features built
    once, in memory; the first `max_users` of them when given: the rate does not depend on how many
    there are, and a million users' rows, held here as Arrow, would take several GB (estimated, not
    tried)). Batched as a Spark task batches them: slices of Spark's Arrow batch size, each sorted
    by history length. `threads`: the model's threads (default: every core; 1 is a Spark task's)."""
    from lumos.compile.engine import load_compiled

    trained = load_registered_model(workspace, "bench@production")
    model = trained.model.eval()
    data = training_data(workspace, trained.training_data)
    spark = workspace_spark(workspace)
    features = inference_rows(spark, workspace, data, AS_OF, str(users_source))
    rows = features.rows if max_users is None else features.rows.limit(max_users)
    table = rows.toArrow()
    features.release()
    arrow_batch = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))
    batches = [batch for part in table.to_batches(max_chunksize=arrow_batch)
               for batch in table_batches(by_history_length(pa.Table.from_batches([part]), model.features),
                                          model.features, 512, "bench")]
    torch.set_num_threads(threads or os.cpu_count() or 1)
    rates = {}
    for engine in engines:
        compiled = load_compiled(workspace, trained.run_id, model) if engine == "compiled" else None
        # Warm-up: each compiled plan's first call takes 0.07 to 0.4 s more than later calls on one
        # thread (1.3 s for five plans, against about 4 s for a 20,000-user pass), which a Spark
        # worker pays once per plan: call every plan once before timing.
        first_of_each_plan = {}
        for batch in batches:
            first_of_each_plan.setdefault(compiled.plan_for(batch.mask.shape[1]).seq_len if compiled else 0, batch)
        for batch in first_of_each_plan.values():
            score_batch(model, compiled, batch, 10, True)
        started = time.perf_counter()
        for batch in batches:
            score_batch(model, compiled, batch, 10, True)
        seconds = time.perf_counter() - started
        rates[engine] = {"users": table.num_rows, "seconds": round(seconds, 3),
                         "users_per_s": round(table.num_rows / seconds, 1)}
    return rates


def add_dirt(clean: Path, dirty: Path, fraction: float, seed: int) -> int:
    """A copy of the events folder `clean` at `dirty` (hard links) with `fraction` of its rows
    added as one more Parquet file per file: half exact duplicates of random rows, half copies of
    random rows made bad in turn (a blank user id, a NaN value, a negative value, an unknown event
    type, no timestamp). Returns the rows added: every one a reject of a recipe rule."""
    rng = np.random.default_rng(seed)
    dirty.mkdir(parents=True)
    added = 0
    for path in sorted(clean.glob("*.parquet")):
        (dirty / path.name).hardlink_to(path)
        table = pq.read_table(path)
        count = int(table.num_rows * fraction / 2)
        copies = table.take(rng.choice(table.num_rows, count, replace=False))
        bad = table.take(rng.choice(table.num_rows, count, replace=False))
        kind = np.arange(count) % 5
        columns = {
            "user_id": pc.if_else(pa.array(kind == 0), pa.scalar(" "), bad["user_id"]),
            "value": pc.if_else(pa.array(kind == 1), pa.scalar(float("nan")),
                                pc.if_else(pa.array(kind == 2), pa.scalar(-5.0), bad["value"])),
            "event_type": pc.if_else(pa.array(kind == 3), pa.scalar("shared"), bad["event_type"]),
            "ts": pc.if_else(pa.array(kind == 4), pa.scalar(None, bad.schema.field("ts").type), bad["ts"]),
        }
        for name, column in columns.items():
            bad = bad.set_column(bad.schema.get_field_index(name), name, column)
        pq.write_table(pa.concat_tables([copies, bad.cast(table.schema)]), dirty / f"dirt-{path.name}")
        added += 2 * count
    return added


def _timed_infer(workspace, events: Path, users: int, engine: str, threads: int = 1):
    """Seconds and summary of one `lumos infer` of a world's events."""
    # --full: these worlds are read whole each time, as before the user state existed
    options = InferOptions(as_of=AS_OF, source=str(events), output=f"bench.predictions_{users}_{engine}",
                           engine=engine, torch_threads=threads, full=True)
    started = time.perf_counter()
    summary = infer(workspace, "bench@production", options)
    return time.perf_counter() - started, summary


def incremental_nights(workspace, folder: Path, users: int, history_days: int, events_per_user_day: float,
                       warmup: bool = False) -> dict:
    """The full night that builds the state at day H, then day H + 1 timed incrementally and as a
    full rebuild (see the module docstring). `warmup`: an untimed incremental rerun of day H
    first (nothing new to read), so that the timed incremental night is not the process's first."""
    from lumos.data.delta_snapshot import open_snapshot

    days = max(history_days + 1, 60)  # the generator's shortest period; the days after H + 1 go unread
    spec = SyntheticSpec(users=users, events=max(users, int(users * events_per_user_day * days)), days=days,
                         seed=users + history_days)
    state_date = spec.start + datetime.timedelta(days=history_days)
    night = state_date + datetime.timedelta(days=1)
    world = folder / f"nights-{users}-{history_days}"
    generate_quickstart(world, spec)
    log, new_day = world / "log", world / "new-day"
    log.mkdir()
    new_day.mkdir()
    for path in sorted((world / "events").glob("*.parquet")):  # history before the state's date; the last day aside
        table = pq.read_table(path)
        micros = pc.cast(pc.cast(table["ts"], pa.timestamp("us")), pa.int64()).to_numpy()
        cut = (state_date - datetime.date(1970, 1, 1)).days * 86_400_000_000
        end = cut + 86_400_000_000
        pq.write_table(table.filter(pa.array(micros < cut)), log / path.name)
        pq.write_table(table.filter(pa.array((micros >= cut) & (micros < end))), new_day / path.name)
    output = f"bench.nights_{users}_{history_days}"

    def timed(as_of: datetime.date, full: bool, table: str):
        options = InferOptions(as_of=as_of, source=str(log), output=table, full=full)
        started = time.perf_counter()
        summary = infer(workspace, "bench@production", options)
        return time.perf_counter() - started, summary

    build_seconds, _ = timed(state_date, False, output)
    if warmup:
        timed(state_date, False, output)
    for path in sorted(new_day.glob("*.parquet")):
        path.rename(log / f"day-{path.name}")
    incremental_seconds, incremental = timed(night, False, output)
    # Into the same predictions table, as the incremental night: a partition written into a table
    # that exists costs Delta a few more jobs than a first write, the same for both modes.
    full_seconds, full = timed(night, True, output)
    written = TableRef.parse(incremental.state)  # <the training data's dataset>.user_state@N
    state = open_snapshot(table_location(workspace, written), written.version)
    result = {
        "users": users, "history_days": history_days, "state_build_seconds": round(build_seconds, 2),
        "incremental": {"mode": incremental.mode, "seconds": round(incremental_seconds, 2),
                        "events_read": incremental.events_read, "users_updated": incremental.users_updated,
                        "users_per_s": round(incremental.rows / incremental_seconds, 1),
                        "state_write_seconds": round(incremental.state_write_seconds, 2)},
        "full": {"mode": full.mode, "seconds": round(full_seconds, 2), "events_read": full.events_read,
                 "users_per_s": round(full.rows / full_seconds, 1),
                 "state_write_seconds": round(full.state_write_seconds, 2)},
        "incremental_over_full": round(incremental_seconds / full_seconds, 3),
        "state_bytes": state.size_bytes,
    }
    print(f"{users:>9,} users, {history_days:>3} days: incremental {incremental_seconds:.1f} s "
          f"({incremental.events_read:,} events, {incremental.mode}), full {full_seconds:.1f} s "
          f"({full.events_read:,} events): ratio {result['incremental_over_full']:.2f}; "
          f"state {state.size_bytes / 1e6:.1f} MB, written in {incremental.state_write_seconds:.1f} s "
          f"(incremental) and {full.state_write_seconds:.1f} s (full)", flush=True)
    return result


def _print_medians(results: list[dict]) -> None:
    """Median end-to-end users/s per engine and setting over the rounds."""
    by_setting: dict[tuple, list[float]] = {}
    for r in results:
        by_setting.setdefault((r["dirty"], r["engine"], r["arrow_batch"], r["shuffle_partitions"]), []).append(
            r["end_to_end_users_per_s"])
    for (dirt, engine, arrow_batch, partitions), rates in by_setting.items():
        print(f"  median of {len(rates)}: dirty {dirt}, {engine:>8}, arrow batch {arrow_batch:>6,}, {partitions:>3} partitions: "
              f"{statistics.median(rates):>8,.0f} users/s (runs: {', '.join(f'{rate:,.0f}' for rate in rates)})")


def _tune(workspace, arrow_batch: int | None, partitions: int | None) -> dict[str, int]:
    """Set the given Arrow batch size and shuffle partitions on the session infer will reuse
    (None keeps what it has) and return both as they now stand."""

    spark = workspace_spark(workspace)
    if arrow_batch is not None:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch))
    if partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return {"arrow_batch": int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")),
            "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--events-per-user", type=int, default=40)
    parser.add_argument("--model-only-max-users", type=int, default=200_000,
                        help="score at most this many users' rows for the model-alone rate (default 200000)")
    parser.add_argument("--engines", nargs="+", default=["torch"], choices=["torch", "compiled"])
    parser.add_argument("--compile-seqs", type=int, nargs="+", default=[16, 32, 48, 64, 100],
                        help="history lengths to compile plans for with --engines compiled (default 16 32 48 64 100)")
    parser.add_argument("--master", help="a Spark master to run on instead of local[*], e.g. spark://127.0.0.1:7077")
    parser.add_argument("--executor-memory", default="3g", help="spark.executor.memory with --master (default 3g)")
    parser.add_argument("--arrow-batch-sizes", type=int, nargs="+",
                        help="run infer once per spark.sql.execution.arrow.maxRecordsPerBatch (default: Spark's)")
    parser.add_argument("--shuffle-partitions", type=int, nargs="+",
                        help="run infer once per spark.sql.shuffle.partitions (default: the workspace's)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every setting this many times, every other round in reverse order (default 1)")
    parser.add_argument("--warmup", action="store_true",
                        help="one untimed lumos infer per world first (the first runs of a session are slower)")
    parser.add_argument("--profile", action="store_true",
                        help="print where each timed infer's time goes, per step (from Spark's event log)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the workspace's [spark.conf] (repeatable), e.g. "
                             "spark.sql.inMemoryColumnarStorage.compressed=true")
    parser.add_argument("--threads", type=int, default=1,
                        help="the model's threads per Spark task (lumos infer --threads; default 1); with more than "
                             "one, give Spark as many cores per task too (--spark-conf spark.task.cpus=N)")
    parser.add_argument("--model-alone-threads", type=int,
                        help="the model-alone rate on this many threads (default: every core); 1 is what each "
                             "Spark task gives the model")
    parser.add_argument("--dirty", type=float, nargs="+", default=[0.0], metavar="FRACTION",
                        help="score each world with this fraction of its rows added as duplicates and bad rows "
                             "(add_dirt; default 0: the clean world only)")
    parser.add_argument("--incremental", action="store_true",
                        help="time an incremental night against a full rebuild of the same date, per --history-days")
    parser.add_argument("--history-days", type=int, nargs="+", default=[30, 60, 120],
                        help="with --incremental: days of history before the timed night (default 30 60 120)")
    parser.add_argument("--events-per-user-day", type=float, default=1.0,
                        help="with --incremental: events per user and day, on average (default 1)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "infer.json")
    args = parser.parse_args()
    if any("=" not in setting for setting in args.spark_conf):
        parser.error("--spark-conf takes KEY=VALUE")

    folder = Path(tempfile.mkdtemp(prefix="lumos-bench-infer-"))
    print(f"workspace {folder}: training and promoting a quickstart-sized model", flush=True)
    events_log = folder / "events-log"
    if args.profile:
        events_log.mkdir(parents=True)
    spark_conf = dict(setting.split("=", 1) for setting in args.spark_conf)
    if args.profile:
        spark_conf |= {**EVENT_LOG_CONF, "spark.eventLog.dir": str(events_log)}
    setup(folder, args.compile_seqs if "compiled" in args.engines else [], args.master, args.executor_memory, spark_conf)
    workspace = open_workspace(folder)
    results = []
    if args.incremental:
        for users in args.users:
            for days in args.history_days:
                world = incremental_nights(workspace, folder, users, days, args.events_per_user_day, args.warmup)
                alone = model_only(workspace, folder / f"nights-{users}-{days}" / "log", ["torch"],
                                   args.model_only_max_users, args.model_alone_threads)["torch"]["users_per_s"]
                world["model_alone_users_per_s"] = alone
                world["incremental_over_model_alone"] = round(world["incremental"]["users_per_s"] / alone, 3)
                world["full_over_model_alone"] = round(world["full"]["users_per_s"] / alone, 3)
                print(f"  model alone {alone:,.0f} users/s: the incremental night runs at "
                      f"{world['incremental_over_model_alone']:.0%} of it, the full night at "
                      f"{world['full_over_model_alone']:.0%}", flush=True)
                results.append(world)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "infer-incremental", "machine": {"cpus": os.cpu_count()},
                                        "results": results}, indent=2))
        print(f"saved {args.out}")
        return
    for users in args.users:
        source = folder / f"world-{users}"
        generate_quickstart(source, SyntheticSpec(users=users, events=users * args.events_per_user, seed=users))
        alone = model_only(workspace, source / "events", args.engines, args.model_only_max_users,
                           args.model_alone_threads)
        events = {dirt: source / "events" if dirt == 0 else source / f"events-dirty-{dirt}" for dirt in args.dirty}
        for dirt, folder_with_dirt in events.items():
            if dirt > 0:
                added = add_dirt(source / "events", folder_with_dirt, dirt, seed=users)
                print(f"{users:>7,} users: {added:,} duplicates and bad rows added for --dirty {dirt}", flush=True)
        combinations = list(itertools.product(args.dirty, args.engines, args.arrow_batch_sizes or [None],
                                              args.shuffle_partitions or [None]))
        if args.warmup:
            seconds, _ = _timed_infer(workspace, events[args.dirty[0]], users, args.engines[0], args.threads)
            print(f"{users:>7,} users: warm-up run, not counted ({seconds:.1f} s)", flush=True)
        for round_number in range(args.rounds):
            # Every other round in reverse, so that no setting always runs first (the JVM and the
            # page cache warm up over a session's first runs).
            for dirt, engine, arrow_batch, partitions in combinations[::-1] if round_number % 2 else combinations:
                tuning = _tune(workspace, arrow_batch, partitions)
                jobs_before = last_job_id(workspace_spark(workspace))
                end_to_end, summary = _timed_infer(workspace, events[dirt], users, engine, args.threads)
                jobs = (jobs_before + 1, last_job_id(workspace_spark(workspace)))
                result = {
                    "users": users, "events": users * args.events_per_user, "dirty": dirt,
                    "rows_rejected": summary.rows_rejected, "engine": engine, **tuning,
                    "threads_per_task": args.threads,
                    "round": round_number, "rows_written": summary.rows,
                    "end_to_end_seconds": round(end_to_end, 2),
                    "end_to_end_users_per_s": round(summary.rows / end_to_end, 1),
                    "model_only": alone[engine],
                }
                cores = os.cpu_count() or 1
                hours = USERS_PER_DAY / result["end_to_end_users_per_s"] / 3600
                result["machine_hours_for_100M_users"] = round(hours, 1)
                result["core_hours_for_100M_users"] = round(hours * cores, 1)
                results.append(result)
                print(f"{users:>7,} users{f' (dirty {dirt})' if dirt else ''}, {engine:>8}, arrow batch {tuning['arrow_batch']:>6,}, "
                      f"{tuning['shuffle_partitions']:>3} partitions: end to end {result['end_to_end_users_per_s']:>8,.0f} users/s "
                      f"({end_to_end:.1f} s), model only {alone[engine]['users_per_s']:>8,.0f} users/s; "
                      f"100M users/day ≈ {hours:.1f} h on this {cores}-core machine", flush=True)
                if args.profile:
                    print_profile(events_log, jobs)
        if args.rounds > 1:
            _print_medians([r for r in results if r["users"] == users])
    report = {"benchmark": "infer", "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                "torch": torch.__version__},
              "spark_master": args.master or "local[*]", "spark_conf": args.spark_conf,
              "driver_memory": workspace_spark(workspace).conf.get("spark.driver.memory"),
              "compile_seqs": args.compile_seqs if "compiled" in args.engines else None,
              "model_alone_threads": args.model_alone_threads,
              "as_of": AS_OF.isoformat(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
