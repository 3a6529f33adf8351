"""`lumos compile` on a real quickstart ingest and a real trained run; the plan served by load_compiled."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lumos.cli.app import app
from lumos.compile.engine import load_compiled
from lumos.core.runs import download_checkpoint
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.train.checkpoint import load_model
from lumos.train.memory import synthetic_batch

runner = CliRunner()


@pytest.fixture(scope="module")
def project(trained_quickstart, tmp_path_factory) -> Path:
    """Quickstart data, one ingest, one tiny trained run (its id in run.txt)."""
    folder = tmp_path_factory.mktemp("compile")
    (folder / "run.txt").write_text(trained_quickstart(folder, seed=3, max_len=12, steps=5, experiment="test-compile"))
    return folder


def lumos(project: Path, *args: str):
    return runner.invoke(app, ["--workspace", str(project), *args])


def test_compile_verifies_stores_and_serves_the_plan(project):
    workspace = open_workspace(project)
    run_id = (project / "run.txt").read_text()
    model, _ = load_model(download_checkpoint(workspace, run_id, "--run"))
    model.eval()
    assert load_compiled(workspace, run_id, model) is None  # no plan yet

    result = lumos(project, "compile", "--run", run_id, "--batch", "8", "--search-budget", "3", "--json")
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout)
    assert first["search"] and first["search_rounds"] >= 1 and not first["search_cache_hit"]
    assert first["attention"]["matches"] >= 1 and first["attention"]["verified"]  # online softmax found
    assert first["run_id"] == run_id and first["target"] == "cpu" and first["seq"] == 12 and first["batch"] == 8
    assert first["kernels"] > 0 and first["primitive_ops"] > first["kernels"] and first["fused_ops"] > 0
    assert 0 < first["planned_peak_bytes"] < first["per_node_bytes"]
    assert first["max_error"] < 1e-4 and first["eager_ms"] > 0 and first["compiled_ms"] > 0
    assert first["artifact"] == "compile/cpu/seq-12"  # (the search already built the final library: a cache hit is fine)
    artifacts = {a.path for a in tracking_client(workspace).list_artifacts(run_id, "compile/cpu/seq-12")}
    assert artifacts == {"compile/cpu/seq-12/plan.json", "compile/cpu/seq-12/library.c"}

    # The same model through the registry: the kernel cache makes the second build a hit.
    client = tracking_client(workspace)
    client.create_registered_model("quickstart_compile")
    version = client.create_model_version("quickstart_compile", source=f"runs:/{run_id}/checkpoints", run_id=run_id)
    client.set_registered_model_alias("quickstart_compile", "production", version.version)
    result = lumos(project, "compile", "--model", "quickstart_compile@production", "--batch", "8", "--search-budget", "3",
                   "--json")
    assert result.exit_code == 0, result.output
    second = json.loads(result.stdout)
    assert second["cache_hit"] and second["model"] == "quickstart_compile/1"
    # The search cache: no new search (counted, not timed: a loaded machine times anything).
    assert second["search_cache_hit"] and second["search_rounds"] == 0 and first["search_rounds"] > 0

    # A second plan, for shorter histories, beside the first.
    result = lumos(project, "compile", "--run", run_id, "--batch", "8", "--seq", "6", "--no-search", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["artifact"] == "compile/cpu/seq-6"
    assert client.get_run(run_id).data.tags["lumos.compile.cpu"] == "seq=6,12"

    # Served for inference: more rows than a plan (chunks), histories shorter than a plan (padding),
    # each batch on the shortest plan that holds it.
    compiled = load_compiled(workspace, run_id, model)
    assert compiled is not None and compiled.seq_lens == (6, 12)
    assert [(plan.batch_size, plan.seq_len) for plan in compiled.plans] == [(8, 6), (8, 12)]
    for length, plan_length in ((5, 6), (6, 6), (9, 12)):
        assert compiled.plan_for(length).seq_len == plan_length
        batch = synthetic_batch(model.features, 11, length, seed=7)
        with torch.no_grad():
            expected = model(batch)
        got = compiled(batch)
        for name in ("user_embedding", "item_query", "act_logits", "value_pred"):
            np.testing.assert_allclose(getattr(got, name).numpy(), getattr(expected, name).numpy(), atol=1e-4, rtol=1e-4)


def test_table_output_and_clear_cache(project):
    run_id = (project / "run.txt").read_text()
    result = lumos(project, "compile", "--run", run_id, "--batch", "4", "--seq", "6", "--search-budget", "2", "--explain")
    assert result.exit_code == 0, result.output
    for row in ("primitive ops in", "kernels out", "fused ops", "planned peak memory", "time per forward",
                "schedule search", "fused attention", "rules fired", "baseline", "e-graph", "e-nodes", "cost model",
                "alternatives tried"):
        assert row in result.stdout
    result = lumos(project, "compile", "--run", run_id, "--batch", "4", "--seq", "6", "--no-search")
    assert result.exit_code == 0, result.output
    assert "off (--no-search)" in result.stdout
    result = lumos(project, "compile", "--clear-cache", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cleared"] >= 1
    assert not any((project / ".lumos" / "kernels" / "cpu").glob("*/*"))


def test_usage_errors(project):
    assert lumos(project, "compile").exit_code == 2
    assert lumos(project, "compile", "--run", "nope", "--model", "a@b").exit_code == 2
    result = lumos(project, "compile", "--run", "0123456789abcdef")
    assert result.exit_code == 2 and "no such run" in result.output
    # A real run, so that only the target can be what is refused.
    result = lumos(project, "compile", "--run", (project / "run.txt").read_text(), "--target", "tpu")
    assert result.exit_code == 2 and "--target tpu: not available; choose from ['cpu', 'cuda']" in result.output



def test_cuda_target_builds_every_kernel_then_needs_a_gpu(project):
    """Without a GPU: every kernel rendered and compiled by NVRTC (into the kernel cache), then
    exit 1, since only a GPU can verify and time them, and no plan on the run. With one: verified."""
    pytest.importorskip("cuda.bindings.nvrtc")
    run_id = (project / "run.txt").read_text()
    result = lumos(project, "compile", "--run", run_id, "--target", "cuda", "--batch", "4", "--seq", "6")
    built = list((project / ".lumos" / "kernels" / "cuda").glob("*/*/kernels.ptx"))
    assert len(built) == 1 and b".entry k0(" in built[0].read_bytes()
    artifacts = {a.path for a in tracking_client(open_workspace(project)).list_artifacts(run_id, "compile/cuda")}
    if torch.cuda.is_available():
        assert result.exit_code == 0, result.output
        assert artifacts == {"compile/cuda/seq-6"}  # one plan store for every target: plan.json, kernels.cu
    else:
        assert result.exit_code == 1, result.output
        assert "no CUDA GPU" in result.output and "CUDA kernels for sm_80 with NVRTC" in result.output
        assert not artifacts
