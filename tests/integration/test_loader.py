"""The Delta file listing (delta-rs) and the training loader against real Spark + Delta tables.

The loader's batches are checked against a row-by-row reference built from
`spark.read.format("delta").option("versionAsOf", v)`: every tensor of every row, exactly.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from pyspark.sql import functions as F

from lumos.core.config import load_config
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.contract import Batch, FeatureSpec
from lumos.data.delta_snapshot import open_snapshot
from lumos.data.ingest import run_ingest
from lumos.data.loader import SequenceLoader
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import feature_spec_for, open_sequences
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES

RECIPE = RECIPES / "ingest.toml"
SEQUENCES = TableRef("quickstart", "sequences", 0)


# ---------------------------------------------------------------------------------------------
# The Delta file listing against Spark's own


def spark_files(spark, path: str, version: int) -> list[str]:
    files = spark.read.format("delta").option("versionAsOf", version).load(path).inputFiles()
    return sorted(name.removeprefix("file:") for name in files)


@pytest.fixture
def small_delta_snapshots(spark):
    """Delta rebuilds snapshots with 50 partitions by default: seconds per commit on two cores."""
    key = "spark.databricks.delta.snapshotPartitions"
    saved = spark.conf.get(key, None)
    spark.conf.set(key, "2")
    yield
    spark.conf.unset(key) if saved is None else spark.conf.set(key, saved)


def test_snapshots_list_the_files_spark_reads_at_every_version(spark, tmp_path, small_delta_snapshots):
    from delta.tables import DeltaTable

    path = str(tmp_path / "numbers")
    # Overwrites, appends and deletes (which rewrite files), 13 commits: Spark checkpoints at 10.
    for version in range(13):
        rows = spark.range(version * 100, version * 100 + 40, numPartitions=2)
        if version % 4 == 3:
            DeltaTable.forPath(spark, path).delete(F.col("id") % 3 == 0)
        elif version % 3 == 1:
            rows.write.format("delta").mode("append").save(path)
        else:
            rows.write.format("delta").mode("overwrite").save(path)
    assert (tmp_path / "numbers" / "_delta_log" / f"{10:020d}.checkpoint.parquet").is_file()
    assert open_snapshot(path).version == 12
    for version in (0, 1, 3, 7, 9, 10, 11, 12):
        snapshot = open_snapshot(path, version)
        assert snapshot.version == version
        assert [data_file.path for data_file in snapshot.files] == spark_files(spark, path, version), version


def test_snapshots_decode_partition_paths_like_spark(spark, tmp_path):
    path = str(tmp_path / "partitioned")
    frame = spark.createDataFrame([(1, "a b"), (2, "x/y%z"), (3, "é=+&?#"), (4, None)], "id int, k string")
    frame.write.format("delta").partitionBy("k").save(path)
    snapshot = open_snapshot(path)
    assert snapshot.partition_columns == ("k",)
    assert [data_file.path for data_file in snapshot.files] == spark_files(spark, path, 0)
    assert all(Path(data_file.path).is_file() for data_file in snapshot.files)


# ---------------------------------------------------------------------------------------------
# A small ingested sequences table


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory) -> Path:
    project = tmp_path_factory.mktemp("loader")
    data = project / "data"
    generate_quickstart(data, SyntheticSpec(users=150, events=9_000, seed=5))
    recipe = load_config(IngestRecipe, RECIPE, [f"source.path={data / 'events'}", f"users.path={data / 'users.parquet'}",
                                                  f"calendar.path={data / 'calendar.csv'}"])
    run_ingest(spark, open_workspace(project), recipe, RECIPE.parent)
    return project


@pytest.fixture(scope="module")
def table(project):
    return open_sequences(open_workspace(project), SEQUENCES)


def reference_rows(spark, path: str, version: int, spec: FeatureSpec, split: str = "train") -> Counter:
    """Each row of the split, as the tuple `canonical` makes of a loader row, read by Spark."""
    frame = spark.read.format("delta").option("versionAsOf", version).load(path).where(F.col("split") == split)
    f32 = lambda value: float(np.float32(value))  # noqa: E731
    rows = Counter()
    for row in frame.collect():
        rows[(
            tuple(tuple(row[name]) for name in spec.token_categorical),
            tuple(tuple(f32(value) for value in row[name]) for name in spec.token_numeric),
            tuple(row[name] for name in spec.static_categorical),
            tuple(f32(row[name]) for name in spec.static_numeric),
            tuple(tuple(row[f"future_{flag}"]) for flag in spec.future_flags),
            row["next_item"] if row["next_item"] is not None else 0,
            tuple(f32(row[f"act_{days}d"]) for days in spec.horizons_days),
            tuple(f32(row[f"value_{days}d"]) for days in spec.horizons_days),
        )] += 1
    return rows


def canonical(batch: Batch, spec: FeatureSpec) -> list[tuple]:
    """The rows of a batch as tuples, after checking shapes, dtypes and padding."""
    size, longest = batch.mask.shape
    lengths = batch.mask.sum(dim=1)
    assert longest == max(int(lengths.max()), 1)
    assert torch.equal(batch.mask, torch.arange(longest) < lengths[:, None])  # right-padded
    assert batch.numeric.shape == (size, longest, len(spec.token_numeric)) and batch.numeric.dtype == torch.float32
    assert batch.future.shape == (size, spec.future_slots, len(spec.future_flags))
    assert batch.act.shape == batch.value.shape == (size, len(spec.horizons_days))
    for tokens in batch.tokens.values():
        assert tokens.dtype == torch.int64 and not tokens[~batch.mask].any()
    assert not batch.numeric[~batch.mask].any()
    rows = []
    for i in range(size):
        length = int(lengths[i])
        rows.append((
            tuple(tuple(batch.tokens[name][i, :length].tolist()) for name in spec.token_categorical),
            tuple(tuple(batch.numeric[i, :length, j].tolist()) for j in range(len(spec.token_numeric))),
            tuple(batch.static_categorical[name][i].item() for name in spec.static_categorical),
            tuple(batch.static_numeric[i].tolist()),
            tuple(tuple(int(flag) for flag in batch.future[i, :, k].tolist()) for k in range(len(spec.future_flags))),
            batch.next_item[i].item(),
            tuple(batch.act[i].tolist()),
            tuple(batch.value[i].tolist()),
        ))
    return rows


def loaded_rows(loader: SequenceLoader) -> Counter:
    return Counter(row for batch in loader for row in canonical(batch, loader.spec))


def assert_same_batches(left: list[Batch], right: list[Batch]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        for name in ("numeric", "mask", "static_numeric", "future", "next_item", "act", "value"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        for name in ("tokens", "static_categorical"):
            assert getattr(a, name).keys() == getattr(b, name).keys()
            assert all(torch.equal(getattr(a, name)[key], getattr(b, name)[key]) for key in getattr(a, name))


def test_feature_spec_comes_from_the_schema_and_the_vocab(spark, table, project):
    spec = table.spec
    assert list(spec.token_categorical) == ["item", "event_type", "cat_device", "cat_category", "hour", "weekday", "gap_bucket"]
    assert spec.token_numeric == ("value", "age_days")
    assert list(spec.static_categorical) == ["user_country", "user_age_bucket"]
    assert spec.static_numeric == ("user_tenure_days",)
    assert spec.future_flags == ("holiday", "sale") and spec.horizons_days == (7,) and spec.next_item
    assert spec.max_len == 100 and (spec.token_categorical["hour"], spec.token_categorical["gap_bucket"]) == (24, 16)
    vocab = spark.read.format("delta").load(str(project / ".lumos" / "tables" / "quickstart" / "vocab"))
    for row in vocab.groupBy("feature").agg(F.max("id").alias("top")).collect():
        sizes = spec.token_categorical if row["feature"] in spec.token_categorical else spec.static_categorical
        assert sizes[row["feature"]] == row["top"] + 1
    by_folder = feature_spec_for(table.snapshot.table_path, project / ".lumos" / "tables" / "quickstart" / "vocab", table.recipe)
    assert by_folder == spec


@pytest.mark.parametrize("shuffle, workers", [(False, 0), (True, 2)])
def test_loader_equals_a_row_by_row_spark_reference(spark, table, shuffle, workers):
    reference = reference_rows(spark, table.snapshot.table_path, 0, table.spec)
    loader = SequenceLoader(table.snapshot, table.spec, 17, shuffle=shuffle, num_workers=workers, chunk_rows=50)
    assert loader.rows == sum(reference.values()) and len(loader) == -(-loader.rows // 17)
    assert loaded_rows(loader) == reference


def test_other_splits_load_too(spark, table):
    loader = SequenceLoader(table.snapshot, table.spec, 64, split="valid", num_workers=0)
    assert loaded_rows(loader) == reference_rows(spark, table.snapshot.table_path, 0, table.spec, split="valid")
    with pytest.raises(Exception, match="no rows in split 'tset'"):
        SequenceLoader(table.snapshot, table.spec, 64, split="tset")


def test_shuffle_is_fixed_by_seed_and_epoch(table):
    def epoch_batches(seed: int, epoch: int, workers: int) -> list[Batch]:
        loader = SequenceLoader(table.snapshot, table.spec, 16, seed=seed, num_workers=workers, chunk_rows=48)
        loader.set_epoch(epoch)
        return list(loader)

    first = epoch_batches(3, 1, workers=2)
    assert_same_batches(first, epoch_batches(3, 1, workers=0))  # worker count does not matter
    second = epoch_batches(3, 2, workers=2)
    other_seed = epoch_batches(4, 1, workers=2)
    assert not torch.equal(first[0].next_item, second[0].next_item)
    assert not torch.equal(first[0].next_item, other_seed[0].next_item)
    rows = lambda batches: Counter(row for batch in batches for row in canonical(batch, table.spec))  # noqa: E731
    assert rows(first) == rows(second) == rows(other_seed)


@pytest.mark.parametrize("world_size, drop_last", [(2, False), (3, True)])
def test_ranks_see_disjoint_rows_and_the_same_number_of_batches(spark, table, world_size, drop_last):
    reference = reference_rows(spark, table.snapshot.table_path, 0, table.spec)
    loaders = [SequenceLoader(table.snapshot, table.spec, 10, seed=1, rank=rank, world_size=world_size,
                              drop_last=drop_last, chunk_rows=40, num_workers=1) for rank in range(world_size)]
    assert len({len(loader) for loader in loaders}) == 1
    per_rank = [loaded_rows(loader) for loader in loaders]
    total = sum(reference.values())
    rows_each = total // world_size if not drop_last else len(loaders[0]) * 10
    assert [sum(rows.values()) for rows in per_rank] == [rows_each] * world_size
    union = sum(per_rank, Counter())
    assert not union - reference  # every row comes from the split, and none twice
    assert sum(union.values()) == world_size * rows_each
    assert total - world_size * rows_each < world_size * (10 if drop_last else 1)  # only the remainder is left out


def test_ranks_split_each_step_of_the_single_process_order(table):
    """W ranks at batch B take, step for step, the rows one process takes at batch W·B (so DDP
    equals single-process training with the same global batch)."""
    single = SequenceLoader(table.snapshot, table.spec, 12, seed=3, chunk_rows=48, num_workers=0, drop_last=True)
    ranks = [SequenceLoader(table.snapshot, table.spec, 6, seed=3, chunk_rows=48, num_workers=0, drop_last=True,
                            rank=rank, world_size=2) for rank in range(2)]
    assert len(single) == len(ranks[0]) == len(ranks[1])
    for whole, first, second in zip(single, *ranks, strict=True):
        assert Counter(canonical(whole, table.spec)) == Counter(canonical(first, table.spec) + canonical(second, table.spec))


def test_resume_continues_with_the_same_batches(table):
    def make(workers: int) -> SequenceLoader:
        return SequenceLoader(table.snapshot, table.spec, 16, seed=7, num_workers=workers, chunk_rows=48)

    straight = make(2)
    uninterrupted = list(straight) + list(straight)  # two epochs: the loader moves to epoch 1 itself
    assert straight.state_dict()["epoch"] == 2 and straight.state_dict()["batches_yielded"] == 0
    batches_per_epoch = len(straight)

    interrupted = make(2)
    stop = batches_per_epoch // 2 + 1  # in the middle of a chunk
    seen = [batch for _, batch in zip(range(stop), interrupted, strict=False)]
    state = interrupted.state_dict()
    assert state["epoch"] == 0 and state["batches_yielded"] == stop

    resumed = make(0)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # a training loop's set_epoch for the epoch in progress keeps the position
    rest = list(resumed)
    resumed.set_epoch(1)
    rest += list(resumed)
    assert_same_batches(seen + rest, uninterrupted)

    with pytest.raises(ValueError, match="batch_size"):
        SequenceLoader(table.snapshot, table.spec, 8, seed=7, chunk_rows=48).load_state_dict(state)


def test_by_length_batches_every_row_once_in_length_bands_the_same_for_one_rank_or_two(spark, table):
    reference = reference_rows(spark, table.snapshot.table_path, 0, table.spec)
    loader = SequenceLoader(table.snapshot, table.spec, 16, seed=2, chunk_rows=64, num_workers=0, by_length=True)
    batches = list(loader)
    assert Counter(row for batch in batches for row in canonical(batch, table.spec)) == reference
    # Within a chunk, each batch's lengths are one band of the chunk's sorted lengths: bands do
    # not overlap, so padding is at most the spread of one band.
    per_chunk = loader.chunk_rows // 16
    for first in range(0, len(batches), per_chunk):
        bands = sorted((int(b.mask.sum(1).min()), int(b.mask.sum(1).max())) for b in batches[first:first + per_chunk])
        assert all(high <= next_low for (_, high), (next_low, _) in zip(bands, bands[1:], strict=False))
    plain = list(SequenceLoader(table.snapshot, table.spec, 16, seed=2, chunk_rows=64, num_workers=0))
    assert sum(b.mask.numel() for b in batches) < 0.8 * sum(b.mask.numel() for b in plain)  # less padding
    assert_same_batches(batches, list(SequenceLoader(table.snapshot, table.spec, 16, seed=2, chunk_rows=64,
                                                     num_workers=2, by_length=True)))
    ranks = [SequenceLoader(table.snapshot, table.spec, 8, seed=2, chunk_rows=64, num_workers=0, by_length=True,
                            rank=rank, world_size=2) for rank in range(2)]
    for whole, first, second in zip(batches, *ranks, strict=True):
        assert Counter(canonical(whole, table.spec)) == Counter(canonical(first, table.spec) + canonical(second, table.spec))
    with pytest.raises(ValueError, match="by_length"):
        SequenceLoader(table.snapshot, table.spec, 16, seed=2, chunk_rows=64).load_state_dict(loader.state_dict())


def test_an_old_version_reads_its_own_rows_after_an_overwrite(spark, table):
    path = table.snapshot.table_path
    newer = spark.read.format("delta").option("versionAsOf", 0).load(path).where(F.col("user_id") < "u0000050")
    newer.repartition(3).write.format("delta").mode("overwrite").save(path)
    latest = open_snapshot(path).version
    assert latest >= 1

    old = SequenceLoader(open_snapshot(path, 0), table.spec, 32, num_workers=2)
    new = SequenceLoader(open_snapshot(path, latest), table.spec, 32, num_workers=2)
    assert old.rows > new.rows
    assert loaded_rows(old) == reference_rows(spark, path, 0, table.spec)
    assert loaded_rows(new) == reference_rows(spark, path, latest, table.spec)
