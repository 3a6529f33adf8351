"""MLflow's own UI on a finished quickstart-sized store, as a user opens it in a real browser.

A tiny quickstart is ingested, trained, promoted to quickstart@production and evaluated on the
next-item task; `mlflow server` serves the store on 127.0.0.1 and Debian's chromium (installed
when missing, else the test is skipped) renders three pages: the training run, the next-item
leaderboard and the model version. Each page is checked twice: the facts through MLflow's REST
API, and what the rendered page shows through the DOM chromium dumps. Screenshots go to the test's
temporary folder, or to $LUMOS_UI_SCREENSHOTS when set (docs/ holds the committed ones).

Opt-in (`pytest -m browser`): the store, the server and the browser take a few minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from lumos.core.runs import MODEL_URI_TAG
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.eval.evaluate import evaluate, resolve_subject
from lumos.eval.leaderboard import experiment_name
from lumos.eval.promote import promote
from lumos.eval.tasks import load_tasks
from lumos.quickstart import RECIPES

pytestmark = pytest.mark.browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The UI is a React app that fetches after load: give it virtual time to render.
RENDER_BUDGET_MS = 20_000
SERVER_START_S = 300


def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (as root); else the test is skipped."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=900)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is not installed and could not be (needs Debian's apt-get as root): "
                    "apt-get update && apt-get install -y chromium")
    return found


@pytest.fixture(scope="module")
def store(trained_quickstart, tmp_path_factory) -> tuple[Path, str]:
    """A trained quickstart run promoted to quickstart@production and evaluated on next_item."""
    folder = tmp_path_factory.mktemp("mlflow-ui")
    run_id = trained_quickstart(folder, seed=0, max_len=20, steps=20, experiment="lumos-train")
    workspace = open_workspace(folder)
    promote(workspace, "quickstart", "production", run_id=run_id)
    task = load_tasks([RECIPES / "tasks"])["next_item"]
    evaluate(workspace, [task], resolve_subject(workspace, None, "quickstart@production"))
    return folder, run_id


@pytest.fixture(scope="module")
def server(store):
    """`mlflow server` on the store, on a free port of 127.0.0.1; yields its base URL."""
    folder, _ = store
    workspace = open_workspace(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(folder / "mlflow-server.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", workspace.mlflow_tracking_uri,
         "--default-artifact-root", workspace.mlflow_artifact_root, "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"mlflow server did not start: {(folder / 'mlflow-server.log').read_text()[-2000:]}") from None
                time.sleep(1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def api(url: str, path: str, **query) -> dict:
    from urllib.parse import urlencode

    with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{path}?{urlencode(query)}", timeout=30) as response:
        return json.loads(response.read())


def api_post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def render(page: str, screenshot: Path) -> str:
    """The DOM of `page` once rendered, and a screenshot of it."""
    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="lumos-chromium-") as profile:
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={RENDER_BUDGET_MS}",
                 "--window-size=1400,900"]
        subprocess.run([browser, *flags, f"--screenshot={screenshot}", page], capture_output=True, timeout=180)
    with tempfile.TemporaryDirectory(prefix="lumos-chromium-") as profile:
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={RENDER_BUDGET_MS}"]
        dom = subprocess.run([browser, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=180).stdout
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000, f"no screenshot of {page}"
    return dom


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("LUMOS_UI_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_training_run_page_shows_dataset_source_and_logged_model(store, server, screenshots):
    folder, run_id = store
    run = api(server, "runs/get", run_id=run_id)["run"]
    tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
    assert run["info"]["run_name"].startswith("train-d8-L1-s0-")
    assert tags["mlflow.source.name"] == "lumos train" and tags["mlflow.user"]
    assert "quickstart.sequences@0" in tags["mlflow.note.content"] and tags["lumos.config_hash"] in tags["mlflow.note.content"]
    datasets = run["inputs"]["dataset_inputs"]
    assert [(item["dataset"]["name"], item["dataset"]["digest"]) for item in datasets] == [("quickstart.sequences", "0")]
    assert {tag["key"]: tag["value"] for tag in datasets[0]["tags"]}["mlflow.data.context"] == "train"
    metrics = {metric["key"] for metric in run["data"]["metrics"]}
    assert {"train/loss", "train/retrieval"} <= metrics and any(key.startswith("system/") for key in metrics)
    model_id = tags[MODEL_URI_TAG].removeprefix("models:/")

    dom = render(f"{server}/#/experiments/{run['info']['experiment_id']}/runs/{run_id}", screenshots / "mlflow-training-run.png")
    assert run["info"]["run_name"] in dom
    assert "quickstart.sequences" in dom, "the Datasets box names the training data"
    assert "lumos train" in dom, "Source shows the command"
    assert model_id in dom or "model" in dom.split("Logged models")[-1], "the logged model is listed"


def test_leaderboard_page_shows_model_and_baseline_with_primary_metric(store, server, screenshots):
    experiment = api(server, "experiments/get-by-name", experiment_name=experiment_name("next_item"))["experiment"]
    runs = api_post(server, "runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    by_name = {run["info"]["run_name"]: run for run in runs}
    assert set(by_name) == {"model/quickstart-v1", "baseline/popularity"}
    for run in runs:
        tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
        metrics = {metric["key"] for metric in run["data"]["metrics"]}
        assert tags["lumos.eval.primary_metric"] == "ndcg_at_10" and "ndcg_at_10" in metrics
        assert {param["key"] for param in run["data"]["params"]} >= {"task", "data", "primary_metric"}
    description = {tag["key"]: tag["value"] for tag in experiment["tags"]}["mlflow.note.content"]
    assert "ndcg_at_10" in description and "quickstart/1" in description and "baseline: popularity" in description

    dom = render(f"{server}/#/experiments/{experiment['experiment_id']}", screenshots / "mlflow-leaderboard.png")
    assert "model/quickstart-v1" in dom and "baseline/popularity" in dom
    assert "ndcg_at_10" in dom, "the primary metric is on the page"


def test_model_version_page_shows_alias_signature_and_lineage(store, server, screenshots):
    folder, run_id = store
    version = api(server, "model-versions/get", name="quickstart", version="1")["model_version"]
    assert version["aliases"] == ["production"] and version["run_id"] == run_id
    assert version["source"].startswith("models:/")
    tags = {tag["key"]: tag["value"] for tag in version["tags"]}
    assert tags["lumos.data"] == "quickstart.sequences@0" and tags["lumos.config_hash"] in version["description"]

    import mlflow.models
    import mlflow.pyfunc

    tracking_client(open_workspace(folder))
    loaded = mlflow.pyfunc.load_model("models:/quickstart@production")
    inputs = [column.name for column in loaded.metadata.get_input_schema().inputs]
    assert "item" in inputs
    local = mlflow.artifacts.download_artifacts("models:/quickstart@production")
    example = mlflow.models.Model.load(local).load_input_example(local)
    predictions = loaded.predict(example)
    assert len(predictions) == len(example) and len(predictions["top_item_ids"][0]) == 10
    assert not list(Path(local).rglob("*.pkl")), "the logged model holds no pickle"

    dom = render(f"{server}/#/models/quickstart/versions/1", screenshots / "mlflow-model-version.png")
    assert "production" in dom, "the alias is shown"
    assert "item" in dom and "user_embedding" in dom, "the signature's inputs and outputs are shown"
    assert "quickstart.sequences@0" in dom, "the lineage is shown"
