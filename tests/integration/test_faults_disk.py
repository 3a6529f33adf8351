"""A full disk under the workspace: ingest, train's checkpoint and infer's write each on a small
tmpfs filled to its last byte. What must hold: exit 1 naming the place and "no space", nothing of
the write visible (no table version, no checkpoint, the previous one in place), and the same
command, rerun once space is freed, completes.

Mounting needs root (a container's CI user has it; elsewhere the tests skip, saying so).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from test_faults_input import assert_every_sequences_version_has_its_vocab, committed_versions, ingest_project
from test_faults_run import PREDICTIONS, lumos, predictions_for, write_recipe

from lumos.core.disk import DiskFull, writing_to
from lumos.core.tracking import tracking_client
from lumos.core.workspace import open_workspace
from lumos.data.synthetic import SyntheticSpec
from lumos.train.checkpoint import load_model

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("one_thread")]


@contextlib.contextmanager
def full_disk(folder: Path, size: str = "4m") -> Iterator[Callable[[], None]]:
    """A tmpfs of `size` mounted on `folder` and filled to its last byte; yields `free()`, which
    deletes the filler. Unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is a tmpfs the test mounts, and mounting needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs on {folder}: {mounted.stderr.strip()}")
    filler = folder / "filler"
    try:
        descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(descriptor, b"\0" * 4096)
        except OSError as error:
            assert error.errno == 28, error  # ENOSPC: full
        finally:
            os.close(descriptor)
        assert os.statvfs(folder).f_bavail == 0
        yield filler.unlink
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def assert_no_space_error(output: str, location: Path) -> None:
    assert f"no space left on device writing {location}" in output, output[-3000:]
    assert "Free space there and rerun" in output and "Traceback" not in output


def test_a_torch_save_on_a_full_disk_is_named_a_full_disk(tmp_path):
    """torch.save reports ENOSPC as "unexpected pos 576 vs 534", errno dropped: writing_to asks the
    device for its free space."""
    full = tmp_path / "full"
    with full_disk(full, size="1m"), pytest.raises(DiskFull, match=f"no space left on device writing {full}/state.pt"):
        with writing_to(str(full / "state.pt")):
            torch.save({"weights": torch.zeros(1000)}, full / "state.pt")


def test_a_kernel_build_on_a_full_disk_leaves_no_cache_entry_and_builds_once_space_is_freed(tmp_path):
    from lumos.compile.compilation import Options
    from lumos.compile.runtime.kernel_cache import KernelCache
    from lumos.compile.target import CPU

    source = "float twice(float x) { return 2 * x; }\n"
    cache = KernelCache(tmp_path / "kernels", "cpu")
    with full_disk(tmp_path / "kernels", size="1m") as free:
        with pytest.raises(DiskFull, match=f"no space left on device writing {cache.root}"):
            cache.build(source, CPU.toolchain(Options()))
        assert cache.entries() == [] and not list(cache.root.glob(".build-*"))  # nothing half-built left
        free()
        built = cache.build(source, CPU.toolchain(Options()))
        assert not built.hit and cache.lookup(built.key) == built.library


@pytest.mark.slow  # two ingests: ~80 s
def test_an_ingest_on_a_full_disk_commits_nothing_and_reruns_once_space_is_freed(spark, tmp_path):
    project = ingest_project(tmp_path)
    tables = project / ".lumos" / "tables"
    with full_disk(tables) as free:
        result = lumos(project, "ingest", "--recipe", str(project / "ingest.toml"))
        assert result.exit_code == 1, result.output
        assert_no_space_error(result.output, tables / "shop" / "rejects")  # the first table written
        assert committed_versions(project) == {"rejects": [], "vocab": [], "sequences": []}
        assert not (project / ".lumos" / "locks" / "shop" / "ingest.lock").exists()

        free()
        rerun = lumos(project, "ingest", "--recipe", str(project / "ingest.toml"), "--json")
        assert rerun.exit_code == 0, rerun.output
        assert json.loads(rerun.stdout)["tables"] == {
            "sequences": "shop.sequences@0", "vocab": "shop.vocab@0", "rejects": "shop.rejects@0"}
        assert_every_sequences_version_has_its_vocab(spark, project)


@pytest.fixture(scope="module")
def project(ingest_quickstart, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("faults-disk")
    ingest_quickstart(folder, SyntheticSpec(users=200, events=8_000, seed=3), max_len=20)
    return folder


@pytest.mark.slow  # an ingest and two short trainings: ~60 s
def test_a_checkpoint_on_a_full_disk_fails_the_run_and_a_rerun_trains(project, tmp_path):
    runs = project / ".lumos" / "runs"
    recipe = write_recipe(tmp_path, max_steps=4, checkpoint_every=2, experiment="test-faults-disk")
    with full_disk(runs) as free:
        result = lumos(project, "train", "--config", str(recipe))
        assert result.exit_code == 1, result.output
        client = tracking_client(open_workspace(project))
        (run,) = client.search_runs([client.get_experiment_by_name("test-faults-disk").experiment_id])
        assert_no_space_error(result.output, runs / run.info.run_id / "checkpoints" / "step-00000002")
        assert run.info.status == "FAILED" and "lumos.checkpoint" not in run.data.tags
        assert not list((runs / run.info.run_id).rglob("*.safetensors"))  # no checkpoint, whole or half

        free()
        rerun = lumos(project, "train", "--config", str(recipe), "--json")
        assert rerun.exit_code == 0, rerun.output
        summary = json.loads(rerun.stdout)
        load_model(runs / summary["run_id"] / "checkpoints" / "step-00000004")


@pytest.fixture(scope="module")
def promoted(trained_quickstart, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("faults-disk-infer")
    run = trained_quickstart(folder, seed=7, max_len=20, steps=4, experiment="test-faults-disk-infer")
    assert lumos(folder, "promote", run, "--model", "quickstart").exit_code == 0
    return folder


@pytest.mark.slow  # an ingest, a training, two infers: ~100 s
def test_an_infer_on_a_full_disk_writes_no_predictions_and_reruns_once_space_is_freed(spark, promoted):
    day = "2026-09-14"
    predictions = promoted / ".lumos" / "tables" / PREDICTIONS.dataset / PREDICTIONS.table
    with full_disk(predictions) as free:
        result = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", day)
        assert result.exit_code == 1, result.output
        assert_no_space_error(result.output, predictions)
        assert not (predictions / "_delta_log").exists() or not list((predictions / "_delta_log").glob("*.json"))
        assert not (promoted / ".lumos" / "locks" / PREDICTIONS.name / f"{day}.lock").exists()

        free()
        rerun = lumos(promoted, "infer", "--model", "quickstart@production", "--as-of", day, "--json")
        assert rerun.exit_code == 0, rerun.output
        rows = predictions_for(spark, promoted, day)
        assert len(rows) == json.loads(rerun.stdout)["rows"] == len({row["user_id"] for row in rows}) > 100
