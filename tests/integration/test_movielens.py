"""examples/movielens: the fetch (checksum, parsers), its configs, every-prefix and window train rows, early
stopping on a validation metric, and a tiny end to end (ingest → train → eval → SASRec baseline)
on a few hundred ratings in the MovieLens format. The real download is opt-in (`-m slow`)."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lumos.core.config import from_dict, load_config
from lumos.core.errors import ConfigError
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences import build_sequences, build_vocab
from lumos.eval.evaluate import evaluate
from lumos.eval.leaderboard import Subject
from lumos.eval.tasks import load_tasks
from lumos.train.config import TrainConfig
from lumos.train.run import train

ROOT = Path(__file__).resolve().parents[2]
MOVIELENS = ROOT / "examples" / "movielens"


def load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


fetch = load_script(MOVIELENS / "fetch.py", "movielens_fetch")
sasrec = load_script(ROOT / "benchmarks" / "sasrec.py", "sasrec_benchmark")


def ratings_recipe(overrides: list[str]) -> IngestRecipe:
    """The MovieLens recipe without its items table: for rows built from ratings frames alone."""
    return replace(load_config(IngestRecipe, MOVIELENS / "ingest.toml", overrides), items=None)


def synthetic_u_data(users: int = 24, per_user: int = 14, items: int = 40) -> bytes:
    """Ratings in u.data's layout: no repeated (user, item), and every third rating of a user
    shares its second with the one before (as about half of MovieLens' rows do)."""
    lines = []
    for user in range(1, users + 1):
        second = 880_000_000 + user * 10_000
        for index in range(per_user):
            item = (user * 7 + index * 3) % items + 1
            second += 0 if index % 3 == 2 else 60 + index
            lines.append(f"{user}\t{item}\t{1 + (user + index) % 5}\t{second}")
    return ("\n".join(lines) + "\n").encode()


def synthetic_item(items: int = 40) -> bytes:
    """Movies in ml-100k.item's layout: space-separated genres, and one year the file lacks."""
    genres = ["Action Comedy", "Drama", "Comedy Romance Drama", "unknown"]
    rows = [f"{item}\tMovie {item}\t{'unkonwn' if item == 7 else 1990 + item % 9}\t{genres[item % 4]}"
            for item in range(1, items + 1)]
    return ("\t".join(fetch.ITEM_HEADER) + "\n" + "\n".join(rows) + "\n").encode()


def synthetic_user(users: int = 24) -> bytes:
    rows = [f"{user}\t{18 + user}\t{'MF'[user % 2]}\t{['student', 'writer', 'other'][user % 3]}\t0{user:04d}"
            for user in range(1, users + 1)]
    return ("\t".join(fetch.USER_HEADER) + "\n" + "\n".join(rows) + "\n").encode()


def write_attributes(data: Path) -> None:
    """items.parquet and users.parquet from the synthetic files, as fetch writes them."""
    fetch.write_events(fetch.parse_item(synthetic_item()), data, fetch.ITEMS_FILE)
    fetch.write_events(fetch.parse_user(synthetic_user()), data, fetch.USERS_FILE)


@pytest.fixture
def trusted(monkeypatch):
    """Make the synthetic files the ones the fetch expects: their checksums and their counts."""
    content = synthetic_u_data()
    monkeypatch.setattr(fetch, "INTER_SHA256", hashlib.sha256(fetch.inter_from_u_data(content)).hexdigest())
    monkeypatch.setattr(fetch, "ITEM_SHA256", hashlib.sha256(synthetic_item()).hexdigest())
    monkeypatch.setattr(fetch, "USER_SHA256", hashlib.sha256(synthetic_user()).hexdigest())
    monkeypatch.setattr(fetch, "EXPECTED", {"rows": 24 * 14, "users": 24, "items": 40})
    monkeypatch.setattr(fetch, "EXPECTED_ROWS", {"items": 40, "users": 24})
    return content


# ---------------------------------------------------------------------------------------------
# Fetch: checksum and parsers


def test_wrong_or_truncated_file_is_refused_with_a_clear_error(tmp_path, trusted):
    good = fetch.inter_from_u_data(trusted)
    fetch.verify_inter(good, "ml-100k.inter")
    for broken in (good[: len(good) // 2], good.replace(b"\t3\t", b"\t4\t", 1), b""):
        with pytest.raises(fetch.FetchError, match="checksum mismatch.*truncated, altered or not MovieLens-100K"):
            fetch.verify_inter(broken, "ml-100k.inter")
    (tmp_path / "u.data").write_bytes(trusted[:-40])
    assert fetch.main(["--u-data", str(tmp_path / "u.data"), "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out" / fetch.EVENTS_FILE).exists()


def test_the_real_checksum_rejects_a_lookalike(tmp_path):
    (tmp_path / "ml-100k.inter").write_bytes(fetch.INTER_HEADER + b"196\t242\t3\t881250949\n")
    with pytest.raises(fetch.FetchError, match="checksum mismatch"):
        fetch.load_ratings(inter=tmp_path / "ml-100k.inter")
    with pytest.raises(fetch.FetchError, match="does not exist"):
        fetch.load_ratings(u_data=tmp_path / "missing")
    (tmp_path / "not.whl").write_bytes(b"not a zip")
    with pytest.raises(fetch.FetchError, match="cannot read recbole/dataset_example"):
        fetch.load_ratings(wheel=tmp_path / "not.whl")


def test_inter_and_u_data_parse_to_the_same_events():
    content = b"196\t242\t3\t881250949\n22\t377\t1\t878887116\n"
    from_u_data = fetch.parse_u_data(content)
    from_inter = fetch.parse_inter(fetch.INTER_HEADER + content.replace(b"\t881250949", b"\t881250949.0"))
    assert from_u_data.equals(from_inter)
    assert from_u_data.to_pylist()[0] == {
        "user_id": "196", "item_id": "242", "rating": 3.0, "event_type": "rating",
        "ts": __import__("datetime").datetime(1997, 12, 4, 15, 55, 49),
    }  # fmt: skip
    with pytest.raises(fetch.FetchError, match="line 2: expected 4 tab-separated fields"):
        fetch.parse_u_data(b"1\t2\t3\t4\n1 2 3 4\n")
    with pytest.raises(fetch.FetchError, match="line 1: rating and timestamp must be numbers"):
        fetch.parse_u_data(b"1\t2\tgood\t4\n")
    with pytest.raises(fetch.FetchError, match="unexpected header"):
        fetch.parse_inter(b"user\titem\n1\t2\n")


def test_fetch_from_u_data_writes_checked_events_items_and_users_once(tmp_path, trusted):
    (tmp_path / "u.data").write_bytes(trusted)
    (tmp_path / "ml-100k.item").write_bytes(synthetic_item())
    (tmp_path / "ml-100k.user").write_bytes(synthetic_user())
    files = {"u_data": tmp_path / "u.data", "item": tmp_path / "ml-100k.item", "user": tmp_path / "ml-100k.user"}
    target = fetch.fetch(tmp_path / "data", **files)
    events = pq.read_table(target)
    assert events.num_rows == 24 * 14 and events.schema == fetch.EVENTS_SCHEMA
    items = pq.read_table(tmp_path / "data" / fetch.ITEMS_FILE)
    assert items.schema == fetch.ITEMS_SCHEMA and items.num_rows == 40
    assert items.slice(0, 2).to_pylist() == [{"item_id": "1", "genres": "Drama", "release_year": 1991},
                                             {"item_id": "2", "genres": "Comedy Romance Drama", "release_year": 1992}]
    assert items.column("release_year")[6].as_py() is None  # "unkonwn"
    users = pq.read_table(tmp_path / "data" / fetch.USERS_FILE)
    assert users.column_names == ["user_id", "age", "gender", "occupation"] and users.schema == fetch.USERS_SCHEMA
    assert users.slice(0, 1).to_pylist() == [{"user_id": "1", "age": 19, "gender": "F", "occupation": "writer"}]
    (tmp_path / "u.data").write_bytes(b"changed")
    assert fetch.fetch(tmp_path / "data", **files) == target  # kept, not refetched
    with pytest.raises(fetch.FetchError, match="checksum mismatch"):
        fetch.fetch(tmp_path / "data", **files, force=True)
    (tmp_path / "u.data").write_bytes(trusted)
    (tmp_path / "ml-100k.item").write_bytes(synthetic_item().replace(b"Drama", b"Drama ", 1))
    with pytest.raises(fetch.FetchError, match="ml-100k.item: checksum mismatch"):
        fetch.fetch(tmp_path / "data", **files, force=True)


@pytest.mark.slow
def test_real_fetch_from_pypi(tmp_path):
    events = pq.read_table(fetch.fetch(tmp_path))
    assert events.num_rows == 100_000
    assert len(set(events["user_id"].to_pylist())) == 943 and len(set(events["item_id"].to_pylist())) == 1_682
    items, users = pq.read_table(tmp_path / fetch.ITEMS_FILE), pq.read_table(tmp_path / fetch.USERS_FILE)
    assert set(items["item_id"].to_pylist()) == set(events["item_id"].to_pylist())
    assert set(users["user_id"].to_pylist()) == set(events["user_id"].to_pylist())


# ---------------------------------------------------------------------------------------------
# Configs


def test_movielens_configs_load():
    recipe = load_config(IngestRecipe, MOVIELENS / "ingest.toml")
    assert recipe.splits.mode == "leave_last_out" and recipe.splits.train_targets == "windows"
    assert recipe.targets.horizons_days == () and recipe.columns.value == "rating"
    config = load_config(TrainConfig, MOVIELENS / "train.toml")
    assert config.data.table == "movielens.sequences" and config.model.heads == ("retrieval",)
    assert config.run.valid_metric == "ndcg@10" and config.run.patience > 0
    assert config.model.encoder_attention == "causal" and config.model.position_targets
    assert config.model.max_len >= recipe.tokens.max_len
    tasks = load_tasks([MOVIELENS / "tasks"])
    task = tasks["movielens_next_item"].spec
    assert (task.kind, task.data, task.split, task.exclude_history) == ("retrieval", "movielens.sequences", "test", True)
    assert task.metric_names == ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr")


def test_early_stopping_settings_are_checked():
    base = {"model": {"heads": ["retrieval"]}}
    with pytest.raises(ConfigError) as error:
        from_dict(TrainConfig, base | {"run": {"valid_metric": "auc_roc", "patience": -1}})
    assert {p.key for p in error.value.problems} == {"run.valid_metric", "run.patience"}
    with pytest.raises(ConfigError, match="needs run.valid_metric"):
        from_dict(TrainConfig, base | {"run": {"patience": 3}})
    with pytest.raises(ConfigError, match="needs data.valid_split"):
        from_dict(TrainConfig, base | {"data": {"valid_split": None}, "run": {"valid_metric": "mrr"}})
    with pytest.raises(ConfigError, match="needs the retrieval head"):
        from_dict(TrainConfig, {"model": {"heads": ["binary"]}, "run": {"valid_metric": "hr@5"}})
    with pytest.raises(ConfigError, match="only used with mode = 'leave_last_out'"):
        from_dict(IngestRecipe, {
            "dataset": "d", "source": {"path": "x"}, "cleaning": {"event_types": ["e"]},
            "columns": {"user_id": "u", "timestamp": "t", "event_type": "e", "item_id": "i"},
            "splits": {"mode": "time", "train_targets": "every", "cutoffs": [{"split": "train", "as_of": "2026-01-01"}]},
        })  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Every prefix a train row; the stated tie-break


def test_every_train_target_and_ties_by_the_seeded_hash(spark):
    from pyspark.sql import functions as F

    recipe = ratings_recipe(["tokens.max_len=2", "splits.train_targets=every"])
    rows = [("u", 100, "9", 5.0), ("u", 100, "10", 4.0), ("u", 200, "3", 1.0), ("u", 300, "7", 2.0),
            ("u", 300, "2", 3.0), ("v", 50, "3", 4.0)]  # fmt: skip
    events = spark.createDataFrame(
        [(user, __import__("datetime").datetime.fromtimestamp(ts, __import__("datetime").UTC), "rating", item, value)
         for user, ts, item, value in rows],
        "user_id string, ts timestamp, event_type string, item_id string, value double",
    )
    vocab = build_vocab(events, None, recipe)
    ids = {row.token: row.id for row in vocab.where("feature = 'item'").collect()}
    sequences = {(row.split, row.next_item): row for row in build_sequences(events, vocab, None, None, recipe).collect()}
    # u's order: by time, ties (t=100 and t=300) by the hash of (tie_seed, user, item, ts).
    key = F.xxhash64(F.lit(recipe.tokens.tie_seed), "user_id", "item_id", "ts")
    in_order = events.where("user_id = 'u'").orderBy("ts", key).collect()
    order = [ids[row.item_id] for row in in_order]
    assert sorted(sequences) == sorted([("test", order[4]), ("valid", order[3]), ("train", order[2]), ("train", order[1])])
    assert sequences["test", order[4]].item == order[2:4]  # max_len = 2: the two most recent
    assert sequences["train", order[1]].item == order[:1] and sequences["train", order[2]].item == order[:2]
    assert sequences["train", order[1]].value == [in_order[0].value]  # the history token's rating, never the target's
    assert in_order[0].value != in_order[1].value


def test_windows_of_train_rows_tile_the_train_tokens(spark):
    recipe = ratings_recipe(["tokens.max_len=2"])
    start = __import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").UTC)
    items = [f"i{index}" for index in range(9)]  # one user, 9 ratings a minute apart
    events = spark.createDataFrame(
        [("u", start + __import__("datetime").timedelta(minutes=index), "rating", item, 3.0) for index, item in enumerate(items)],
        "user_id string, ts timestamp, event_type string, item_id string, value double",
    )
    vocab = build_vocab(events, None, recipe)
    ids = {row.token: row.id for row in vocab.where("feature = 'item'").collect()}
    sequences = build_sequences(events, vocab, None, None, recipe)
    assert "age_days" not in sequences.columns  # as_of is the target's time: no ages in this protocol
    rows = sorted((row.split, row.item, row.next_item) for row in sequences.collect())
    token = [ids[item] for item in items]
    # test cuts at 8, valid at 7, train every max_len + 1 = 3 back from 6: 6 and 3 (0 has no history).
    assert rows == sorted([
        ("test", token[6:8], token[8]), ("valid", token[5:7], token[7]),
        ("train", token[4:6], token[6]), ("train", token[1:3], token[3]),
    ])  # fmt: skip


def test_held_out_users_keep_one_row_where_test_sits_and_nothing_that_trains(spark):
    recipe = ratings_recipe(["tokens.max_len=3", "splits.holdout_users=0.4"])
    start = __import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").UTC)
    events = spark.createDataFrame(
        [(f"u{user}", start + __import__("datetime").timedelta(minutes=index), "rating", f"i{(user + index) % 11}", 3.0)
         for user in range(30) for index in range(8)],
        "user_id string, ts timestamp, event_type string, item_id string, value double",
    )
    vocab = build_vocab(events, None, recipe)
    ids = {row.token: row.id for row in vocab.where("feature = 'item'").collect()}
    rows = build_sequences(events, vocab, None, None, recipe).collect()
    plain = ratings_recipe(["tokens.max_len=3"])
    every_row = {(row.user_id, row.split, row.next_item, tuple(row.item)) for row in build_sequences(events, vocab, None, None, plain).collect()}
    held = {row.user_id for row in rows if row.split == "holdout"}
    assert 6 <= len(held) <= 18  # about 40% of 30 users
    for user in held:
        (row,) = [row for row in rows if row.user_id == user]  # nothing of theirs trains or validates
        sequence = [ids[f"i{(int(user[1:]) + index) % 11}"] for index in range(8)]
        assert row.next_item == sequence[-1] and row.item == sequence[-4:-1]  # the test row's target and history
    others = {(row.user_id, row.split, row.next_item, tuple(row.item)) for row in rows if row.user_id not in held}
    assert others == {row for row in every_row if row[0] not in held}  # everyone else as without a holdout
    again = ratings_recipe(["tokens.max_len=3", "splits.holdout_users=0.4",
                                                                  "splits.holdout_seed=1"])
    reseeded = {row.user_id for row in build_sequences(events, vocab, None, None, again).collect() if row.split == "holdout"}
    assert reseeded != held  # the seed picks the users


# ---------------------------------------------------------------------------------------------
# A tiny end to end: fetch → ingest → train with early stopping → eval → SASRec


TINY = {
    "data": {"table": "movielens.sequences", "loader_workers": 1},
    "model": {"d_model": 8, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16, "max_len": 200,
              "heads": ["retrieval"], "dropout": 0.0, "encoder_attention": "causal", "position_targets": True},
    "optim": {"lr": 1e-2, "warmup_steps": 0},
    "run": {"batch_size": 8, "max_steps": 12, "eval_every": 3, "eval_batches": 0, "log_every": 3,
            "checkpoint_every": 100, "valid_metric": "ndcg@10", "seed": 0, "experiment": "test-movielens"},
}  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the test process shares two cores with Spark's JVM
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("movielens")
    data = folder / "data"
    data.mkdir()
    content = synthetic_u_data()
    fetch.write_events(fetch.parse_u_data(content), data)
    write_attributes(data)
    recipe = load_config(IngestRecipe, MOVIELENS / "ingest.toml", [f"source.path={data / fetch.EVENTS_FILE}",
                                                                   f"items.path={data / fetch.ITEMS_FILE}"])
    result = run_ingest(spark, open_workspace(folder), recipe, MOVIELENS)
    assert result.stats["rows_by_split"] == {"test": 24, "train": 24, "valid": 24}  # 12 train tokens: one window
    return folder


def test_early_stopping_keeps_the_best_checkpoint(project):
    workspace = open_workspace(project)
    # A learning rate too small to change the ranking: no evaluation beats the first one.
    config = from_dict(TrainConfig, TINY, overrides=["optim.lr=1e-12", "run.patience=2", "run.max_steps=60"])
    summary = train(config, workspace)
    result = summary.result
    assert result.early_stopped and result.step == 9 and result.best_step == 3
    tags = tracking_client(workspace).get_run(summary.run_id).data.tags
    assert tags["lumos.checkpoint"] == "checkpoints/best-step-00000003" and tags["lumos.step"] == "3"
    history = tracking_client(workspace).get_metric_history(summary.run_id, "valid/ndcg_at_10")
    assert [m.step for m in history] == [3, 6, 9] and len({m.value for m in history}) == 1


def test_tiny_end_to_end_and_sasrec_on_the_same_rows(project, monkeypatch):
    workspace = open_workspace(project)
    summary = train(from_dict(TrainConfig, TINY), workspace)
    result = summary.result
    assert not result.early_stopped and result.step == 12 and result.best_step in (3, 6, 9, 12)
    assert result.best_value == max(m.value for m in tracking_client(workspace).get_metric_history(
        summary.run_id, "valid/ndcg_at_10"))

    task = load_tasks([MOVIELENS / "tasks"])["movielens_next_item"]
    [scored] = evaluate(workspace, [task], Subject(key=f"run:{summary.run_id}", label="tiny", run_id=summary.run_id))
    assert scored.rows == 24 and scored.baseline == "popularity"
    assert set(scored.metrics) == set(scored.baseline_metrics) == {"hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr"}

    data = sasrec.read_table(str(project), "movielens.sequences@0")
    assert [len(sequence) for sequence in data.train_sequences] == [12] * 24  # 14 ratings less valid and test
    assert data.valid.histories[0] == data.train_sequences[0][-50:]
    # train_and_score returns metrics only: a wrapper around its real rank_rows keeps what each
    # ranking scored, (a copy of the model, the rows, max_len): one per epoch (valid), then test.
    ranked = []
    real_rank_rows = sasrec.rank_rows

    def rank_rows(model, rows, table_max_len, max_len, batch_size=512):
        ranked.append((copy.deepcopy(model), rows, max_len))
        return real_rank_rows(model, rows, table_max_len, max_len, batch_size)

    monkeypatch.setattr(sasrec, "rank_rows", rank_rows)
    run = sasrec.train_and_score(data, sasrec.SASRecConfig(d_model=8, max_epochs=2, patience=5, batch_size=8,
                                                           exclude_seen=True), report=lambda _: None)
    monkeypatch.undo()
    assert run["test_rows"] == 24 and len(ranked) == 3 and ranked[-1][1] is data.test
    # The metrics, recomputed with numpy from the scored model's raw outputs on the test rows, and
    # the best valid NDCG@10 from the model its epoch validated.
    test_model, _, max_len = ranked[-1]
    assert {name: run[name] for name in sasrec.METRICS} == pytest.approx(
        sasrec_reference_metrics(test_model, data.test, max_len), rel=1e-9, abs=1e-12)
    best_model, valid_rows, _ = ranked[run["best_epoch"] - 1]
    assert valid_rows is data.valid
    assert run["valid_ndcg@10"] == pytest.approx(sasrec_reference_metrics(best_model, data.valid, max_len)["ndcg@10"])
    shorter = sasrec.train_and_score(data, sasrec.SASRecConfig(d_model=8, max_epochs=1, batch_size=8, max_len=5,
                                                               attention_dropout=0.0), report=lambda _: None)
    assert shorter["test_rows"] == 24 and shorter["parameters"] < run["parameters"]  # a 6-row position table


def sasrec_reference_metrics(model, rows, max_len: int) -> dict[str, float]:
    """HR@k, NDCG@k and MRR of each row's target among items 2.. not in its history (a tie counts
    one half), from the scores hidden · item table of the model's last position, in float64."""
    model.eval()
    table = model.items.weight.detach().double().numpy()  # (V, C)
    ranks = []
    for history, target in zip(rows.histories, rows.targets, strict=True):
        recent = history[-max_len:]
        with torch.no_grad():
            hidden = model(torch.tensor([[0] * (max_len - len(recent)) + recent]))[0, -1].double().numpy()  # (C,)
        scores = table @ hidden  # (V,)
        competitors = [item for item in range(2, len(scores)) if item != target and item not in set(history)]
        ranks.append(1 + sum(scores[item] > scores[target] for item in competitors)
                     + sum(scores[item] == scores[target] for item in competitors) / 2)
    ranks = np.array(ranks)
    metrics = {}
    for k in (10, 50):
        metrics[f"hr@{k}"] = float(np.mean(ranks <= k))
        metrics[f"ndcg@{k}"] = float(np.mean(np.where(ranks <= k, 1 / np.log2(ranks + 1), 0.0)))
    metrics["mrr"] = float(np.mean(1 / ranks))
    return metrics


def test_sasrec_reads_its_max_len_but_excludes_the_whole_history():
    """With max_len below the table's, SASRec reads the most recent items, and ranking still leaves
    out every item of the row's history, as the protocol (and Lumos) does."""
    model = sasrec.SASRec(sasrec.SASRecConfig(d_model=8), item_vocab_size=12, max_len=3).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([[5, 6]]))[0, -1]
        model.items.weight[7] = 0.0  # the target scores 0: below item 2, above items 3 and 4
        model.items.weight[2], model.items.weight[3], model.items.weight[4] = 100 * hidden, -100 * hidden, -100 * hidden
    whole = sasrec.SplitRows(users=["u"], histories=[[2, 3, 4, 5, 6]], targets=np.array([7]), as_of=[None])
    recent = sasrec.SplitRows(users=["u"], histories=[[5, 6]], targets=np.array([7]), as_of=[None])
    assert sasrec.rank_rows(model, whole, table_max_len=5, max_len=2).item() == \
        sasrec.rank_rows(model, recent, table_max_len=2, max_len=2).item() - 1  # item 2 is left out


def test_sasrec_rebuilds_the_same_sequences_from_either_layout(spark, project):
    raw = spark.read.parquet(str(project / "data" / fetch.EVENTS_FILE))
    events = raw.select("user_id", "item_id", "event_type", raw.rating.alias("value"), raw.ts.cast("timestamp").alias("ts"))
    rebuilt = {}
    for layout, rebuild in (("every", sasrec._chained_sequences), ("windows", sasrec._tiled_sequences)):
        recipe = ratings_recipe([f"splits.train_targets={layout}", "tokens.max_len=5"])
        rows = build_sequences(events, build_vocab(events, None, recipe), None, None, recipe)
        table = pa.Table.from_pandas(rows.select("user_id", "split", "as_of", "item", "next_item").toPandas())
        rebuilt[layout] = rebuild(sasrec._split_rows([table], "train"))
    assert len(rebuilt["every"]) == 24 and all(len(sequence) == 12 for sequence in rebuilt["every"].values())
    assert rebuilt["windows"] == rebuilt["every"]  # max_len 5: windows of 6 (history + target), two per user


def test_sasrec_windows_cover_every_target_once():
    windows = sasrec.training_windows([[5, 6, 7, 8, 9, 10, 11], [3, 4]], max_len=3)
    assert windows.tolist() == [[8, 9, 10, 11], [5, 6, 7, 8], [0, 0, 3, 4]]
    targets = [w[i + 1] for w in windows.tolist() for i in range(len(w) - 1) if w[i]]  # inputs that are items
    assert sorted(targets) == [4, 6, 7, 8, 9, 10, 11]


def test_sasrec_seen_items_in_left_padded_windows():
    seen = sasrec.seen_items(torch.tensor([[0, 5, 7]]))
    assert seen[0].tolist() == [[0, 0, 0], [0, 5, 0], [0, 5, 7]]
