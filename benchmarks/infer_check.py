"""What `lumos infer`'s check costs: kept in Spark's cache (what infer does), or one uncached pass.

    python benchmarks/infer_check.py [--events 8000000] [--events-per-user 40] [--data DIR]
                                     [--rounds 4] [--out benchmarks/results/infer_check.json]

Infer reads the events once into a cache: the reject counts, the budget check, the rejects
written and the scored rows all read them from there. The alternative is one pass without a
cache, the counts observed in it (`DataFrame.observe`), and the rejects read from the source
again afterwards, only when the counts show some. This times, on synthetic events (no rejects,
fresh unless `--data` names a `lumos data synth` folder), each alone and in turns:

- cached: the check cached, its counts, and the tokens the scoring reads, into Spark's `noop`;
- single: the tokens from the uncached check, with the counts by rule observed in that pass;
- per_row_rejects: what reading the rejects again costs when no duplicate is among them: the
  per-row rules only (no shuffle, no duplicate window), rejected rows into `noop`;
- full_rejects: the same when duplicates are among them: the whole check again.

So a single pass costs `single` on a clean log, `single + per_row_rejects` on a log with bad
rows, and `single + full_rejects` on one with duplicates, against `cached` in every case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from lumos.core.config import load_config
from lumos.core.settings import SparkSettings
from lumos.core.spark import get_spark
from lumos.core.workspace import open_workspace
from lumos.data.ingest import count_rejects, count_rejects_and_tokens, read_checked_inputs
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import number_tokens, time_rows_input, vocab_frame
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.data.validation import valid_events
from lumos.quickstart import RECIPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=8_000_000)
    parser.add_argument("--events-per-user", type=int, default=40, help="as benchmarks/infer.py")
    parser.add_argument("--data", type=Path, help="a `lumos data synth` folder to read instead of fresh data")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "infer_check.json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="lumos-infer-check-"))
    try:
        run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, scratch: Path) -> None:
    data = args.data
    if data is None:
        data = scratch / "data"
        print(f"synthesizing {args.events:,} events", flush=True)
        generate_quickstart(data, SyntheticSpec(users=max(args.events // args.events_per_user, 1), events=args.events))
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={data / 'events'}", f"users.path={data / 'users.parquet'}", f"calendar.path={data / 'calendar.csv'}"])
    # As infer reads them: no training window (lumos.data.training_data.as_of_recipe).
    recipe = replace(recipe, cleaning=replace(recipe.cleaning, min_timestamp=None, max_timestamp=None))
    per_row = replace(recipe, cleaning=replace(recipe.cleaning, reject_duplicates=False))
    spark = get_spark(SparkSettings())
    workspace = open_workspace(scratch)  # only a base for table names; nothing is written

    def checked(of: IngestRecipe = recipe):
        return read_checked_inputs(spark, workspace, of, RECIPES)

    inputs = checked()
    first = inputs.checked.persist()
    vocab = vocab_frame(spark, number_tokens(count_rejects_and_tokens(first, inputs.users, recipe)[1]))
    first.unpersist(blocking=True)

    def tokens_into_noop(events, users) -> None:
        tokens, _ = time_rows_input(events, vocab, users, recipe, targets=False)
        tokens.write.format("noop").mode("overwrite").save()

    def cached() -> None:
        inputs = checked()
        kept = inputs.checked.persist()
        count_rejects(kept)
        tokens_into_noop(valid_events(kept), inputs.users)
        kept.unpersist(blocking=True)

    def single() -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        inputs = checked()
        counts = Observation("rules")
        observed = inputs.checked.observe(counts, F.count(F.lit(1)).alias("rows"),
                                          F.count(F.col("_rule")).alias("rejected"))
        tokens_into_noop(valid_events(observed), inputs.users)
        assert counts.get["rows"] > 0

    def rejects_into_noop(of: IngestRecipe) -> None:
        frame = checked(of).checked
        frame.where(frame["_rule"].isNotNull()).select("_rule", "_reason", "_row").write.format("noop").mode("overwrite").save()

    variants = {"cached": cached, "single": single, "per_row_rejects": lambda: rejects_into_noop(per_row),
                "full_rejects": lambda: rejects_into_noop(recipe)}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name in (list(variants) if round_ % 2 == 0 else list(variants)[::-1]):
            started = time.perf_counter()
            variants[name]()
            seconds[name].append(round(time.perf_counter() - started, 2))
            print(f"round {round_ + 1} {name:<16} {seconds[name][-1]:6.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"\nmedians at {args.events:,} events: " + ", ".join(f"{name} {value:.2f} s" for name, value in medians.items()))
    for log, extra in (("clean", 0.0), ("with bad rows", medians["per_row_rejects"]), ("with duplicates", medians["full_rejects"])):
        print(f"  one pass on a log {log}: {medians['single'] + extra:.2f} s against {medians['cached']:.2f} s cached")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"events": args.events, "seconds": seconds, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
