"""`lumos eval` on a real quickstart ingest, real trained runs and a real SQLite MLflow store."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.core.config import from_dict, load_config
from lumos.core.runs import download_checkpoint
from lumos.core.tables import TableRef
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.loader import SequenceLoader
from lumos.data.recipe import IngestRecipe
from lumos.data.sequences_version import open_sequences
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES
from lumos.train.checkpoint import load_model
from lumos.train.config import TrainConfig
from lumos.train.run import train

QUICKSTART = RECIPES
runner = CliRunner()


def tiny(steps: int, d_model: int) -> TrainConfig:
    return from_dict(TrainConfig, {
        "data": {"loader_workers": 1},
        "model": {"d_model": d_model, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 32,
                  "dropout": 0.0, "max_len": 20},
        "optim": {"lr": 3e-3, "warmup_steps": 5},
        "run": {"batch_size": 64, "max_steps": steps, "eval_every": 1000, "log_every": 10, "checkpoint_every": 1000,
                "experiment": "test-eval"},
    })


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory) -> Path:
    """Quickstart data, its tasks, one ingest and two differently configured trained runs."""
    folder = tmp_path_factory.mktemp("eval")
    generate_quickstart(folder / "examples" / "quickstart" / "data", SyntheticSpec(users=300, events=15_000, seed=2))
    shutil.copytree(QUICKSTART / "tasks", folder / "examples" / "quickstart" / "tasks")
    data = folder / "examples" / "quickstart" / "data"
    recipe = load_config(IngestRecipe, QUICKSTART / "ingest.toml", [
        f"source.path={data / 'events'}", f"users.path={data / 'users.parquet'}",
        f"calendar.path={data / 'calendar.csv'}", "tokens.max_len=20",
    ])
    run_ingest(spark, open_workspace(folder), recipe, QUICKSTART)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, config in (("short", tiny(5, 8)), ("longer", tiny(60, 16))):
            summary = train(config, open_workspace(folder))
            (folder / f"{name}.run").write_text(summary.run_id)
    finally:
        torch.set_num_threads(threads)
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def run_id(project: Path, name: str) -> str:
    return (project / f"{name}.run").read_text()


def test_eval_all_logs_every_task_with_baselines(project):
    result = lumos(project, "eval", "--all", "--run", run_id(project, "longer"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    by_task = {item["task"]: item for item in summary["results"]}
    assert set(by_task) == {"next_item", "will_purchase_7d", "spend_7d", "segment_probe", "churn_probe"}
    assert set(by_task["next_item"]["metrics"]) == {"hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr"}
    assert by_task["next_item"]["baseline"] == "popularity" and by_task["will_purchase_7d"]["baseline"] == "prior_rate"
    assert by_task["will_purchase_7d"]["baseline_metrics"]["auc_roc"] == pytest.approx(0.5)
    assert by_task["segment_probe"]["baseline"] is None and "accuracy" in by_task["segment_probe"]["metrics"]
    assert all(item["data"] == "quickstart.sequences@0" for item in summary["results"])

    # The values, recomputed from the model's raw outputs on the test split with numpy.
    test_rows = raw_test_outputs(project, run_id(project, "longer"))
    ranks = reference_ranks(test_rows["item_scores"], test_rows)
    assert by_task["next_item"]["rows"] == len(ranks) > 0
    assert by_task["next_item"]["metrics"] == pytest.approx(reference_retrieval_metrics(ranks), rel=1e-9, abs=1e-12)
    popularity = np.broadcast_to(-np.arange(test_rows["item_scores"].shape[1], dtype=float), test_rows["item_scores"].shape)
    assert by_task["next_item"]["baseline_metrics"] == pytest.approx(
        reference_retrieval_metrics(reference_ranks(popularity, test_rows)), rel=1e-9, abs=1e-12)
    purchase = by_task["will_purchase_7d"]["metrics"]
    assert by_task["will_purchase_7d"]["rows"] == len(test_rows["act_7d"])
    assert purchase["auc_roc"] == pytest.approx(pairwise_auc(test_rows["act_7d"], test_rows["p_act_7d"]), rel=1e-9)
    assert purchase["accuracy"] == pytest.approx(np.mean((test_rows["p_act_7d"] >= 0.5) == test_rows["act_7d"]), rel=1e-9)


def raw_test_outputs(project: Path, run: str) -> dict[str, np.ndarray | list]:
    """The test split's targets and labels, and the model's raw outputs on it: item scores as
    item_query · item table + item bias in float64, the 7-day purchase probability."""
    workspace = open_workspace(project)
    model, _ = load_model(download_checkpoint(workspace, run, "--run"))
    model.eval()
    data = open_sequences(workspace, TableRef.parse("quickstart.sequences"))
    table = model.token_embeddings["item"].weight.detach().double().numpy()  # (V, C)
    bias = model.item_bias.detach().double().numpy()  # (V,)
    horizon = data.spec.horizons_days.index(7)
    rows: dict[str, list] = {"item_scores": [], "next_item": [], "history": [], "act_7d": [], "p_act_7d": []}
    # In table order and batches of 37, where eval goes by history length in batches of 512.
    loader = SequenceLoader(data.snapshot, data.spec, 37, split="test", shuffle=False, num_workers=0)
    with torch.no_grad():
        for batch in loader:
            output = model(batch)
            rows["item_scores"].append(output.item_query.double().numpy() @ table.T + bias)
            rows["next_item"] += batch.next_item.tolist()
            rows["history"] += [set(items[real].tolist()) for items, real in zip(batch.tokens["item"], batch.mask, strict=True)]
            rows["act_7d"].append(batch.act[:, horizon].numpy())
            rows["p_act_7d"].append(1 / (1 + np.exp(-output.act_logits[:, horizon].double().numpy())))
    return {name: np.concatenate(values) if name in ("item_scores", "act_7d", "p_act_7d") else values
            for name, values in rows.items()}


def reference_ranks(item_scores: np.ndarray, rows: dict) -> np.ndarray:
    """The target's 1-based rank among items 2.. not in the history (a tie counts one half), for
    rows whose next item is a real item."""
    ranks = []
    for scores, target, history in zip(item_scores, rows["next_item"], rows["history"], strict=True):
        if target < 2:
            continue
        competitors = [item for item in range(2, len(scores)) if item != target and item not in history]
        higher = sum(scores[item] > scores[target] for item in competitors)
        tied = sum(scores[item] == scores[target] for item in competitors)
        ranks.append(1 + higher + tied / 2)
    return np.array(ranks)


def reference_retrieval_metrics(ranks: np.ndarray) -> dict[str, float]:
    metrics = {}
    for k in (10, 50):
        metrics[f"hr@{k}"] = float(np.mean(ranks <= k))
        metrics[f"ndcg@{k}"] = float(np.mean([1 / math.log2(rank + 1) if rank <= k else 0.0 for rank in ranks]))
    metrics["mrr"] = float(np.mean(1 / ranks))
    return metrics


def pairwise_auc(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """The share of (positive, negative) pairs the positive wins, a tie counting one half."""
    positives, negatives = probabilities[labels == 1], probabilities[labels == 0]
    wins = (positives[:, None] > negatives[None, :]).sum() + (positives[:, None] == negatives[None, :]).sum() / 2
    return float(wins / (len(positives) * len(negatives)))


def test_leaderboard_ranks_runs_and_baseline_and_reevaluation_replaces(project):
    for name in ("short", "longer", "longer"):  # the second "longer" replaces the first
        assert lumos(project, "eval", "--task", "next_item", "--run", run_id(project, name)).exit_code == 0
    board = json.loads(lumos(project, "eval", "leaderboard", "--task", "next_item", "--json").stdout)
    entries = board["entries"]
    assert len(entries) == 3  # two runs and the popularity baseline, none twice
    values = [entry["metrics"]["ndcg@10"] for entry in entries]
    assert values == sorted(values, reverse=True) and [entry["rank"] for entry in entries] == [1, 2, 3]
    assert {entry["run_id"] for entry in entries} == {run_id(project, "short"), run_id(project, "longer"), None}
    assert {entry["label"] for entry in entries if entry["run_id"] is None} == {"baseline: popularity"}

    table = list(csv.reader(io.StringIO(lumos(project, "eval", "leaderboard", "--task", "next_item", "--csv").stdout)))
    assert table[0][:2] == ["rank", "entry"] and len(table) == 4
    top = json.loads(lumos(project, "eval", "leaderboard", "--task", "next_item", "--top", "1", "--json").stdout)
    assert len(top["entries"]) == 1 and top["entries"][0] == entries[0]


def test_training_run_carries_its_eval_metrics(project):
    from lumos.core.tracking import tracking_client

    lumos(project, "eval", "--task", "will_purchase_7d", "--run", run_id(project, "longer"))
    run = tracking_client(open_workspace(project)).get_run(run_id(project, "longer"))
    assert "eval/will_purchase_7d/auc_roc" in run.data.metrics


def test_fail_below_exits_3_after_logging(project):
    result = lumos(project, "eval", "--task", "next_item", "--run", run_id(project, "short"), "--fail-below", "ndcg@10=0.99")
    assert result.exit_code == 3
    assert "ndcg@10" in result.stderr and "below --fail-below 0.99" in result.stderr


def test_bad_task_spec_names_file_and_key(project, tmp_path):
    (tmp_path / "broken.toml").write_text('name = "broken"\nkind = "ranking"\nprimary_metric = "hr@10"\nsplt = "test"\n')
    result = lumos(project, "eval", "list", "--tasks", str(tmp_path))
    assert result.exit_code == 2
    assert f"{tmp_path / 'broken.toml'}: kind" in result.stderr and "splt" in result.stderr


def test_eval_list_and_usage_errors(project):
    listed = json.loads(lumos(project, "eval", "list", "--json").stdout)
    assert {task["name"] for task in listed["tasks"]} >= {"next_item", "churn_probe"}
    assert lumos(project, "eval", "--task", "next_item").exit_code == 2  # neither --run nor --model
    assert lumos(project, "eval", "--task", "nope", "--run", run_id(project, "short")).exit_code == 2
    assert lumos(project, "eval", "--task", "next_item", "--run", "0" * 32).exit_code == 2


def test_registered_model_is_evaluated_through_its_alias(project):
    from lumos.core.tracking import tracking_client

    client = tracking_client(open_workspace(project))
    run = run_id(project, "longer")
    client.create_registered_model("quickstart_eval")
    version = client.create_model_version("quickstart_eval", source=f"runs:/{run}/checkpoints", run_id=run)
    client.set_registered_model_alias("quickstart_eval", "production", version.version)
    result = lumos(project, "eval", "--task", "will_purchase_7d", "--model", "quickstart_eval@production", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["model"] == f"quickstart_eval/{version.version}" and summary["run_id"] == run
    board = json.loads(lumos(project, "eval", "leaderboard", "--task", "will_purchase_7d", "--json").stdout)
    assert f"quickstart_eval/{version.version}" in {entry["model"] for entry in board["entries"]}
    assert lumos(project, "eval", "--task", "next_item", "--model", "quickstart_eval@staging").exit_code == 2


def test_generated_probe_tasks_score_in_one_pass_as_one_by_one(project, tmp_path):
    labels = project / "examples" / "quickstart" / "data" / "labels.parquet"
    generated = tmp_path / "generated"
    made = lumos(project, "eval", "tasks", "generate", "--labels", str(labels), "--columns", "segment,churned",
                 "--data", "quickstart.sequences", "--out", str(generated), "--prefix", "gen_")
    assert made.exit_code == 0, made.output
    run = run_id(project, "longer")

    together = lumos(project, "eval", "--all", "--tasks", str(generated), "--run", run, "--json")
    assert together.exit_code == 0, together.output
    shared = {item["task"]: item["metrics"] for item in json.loads(together.stdout)["results"]}
    assert set(shared) == {"gen_segment", "gen_churned"}
    for name in shared:  # embeddings shared across tasks give exactly what a task scored alone gets
        alone = lumos(project, "eval", "--task", name, "--tasks", str(generated), "--run", run, "--json")
        assert json.loads(alone.stdout)["results"][0]["metrics"] == shared[name]
    # The generated churn task is the hand-written churn_probe under another name.
    hand_written = json.loads(lumos(project, "eval", "--task", "churn_probe", "--run", run, "--json").stdout)
    assert hand_written["results"][0]["metrics"] == shared["gen_churned"]
