"""A tiny trained quickstart project, the starting point of the tests of every later verb."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from lumos.core.config import from_dict, load_config
from lumos.core.workspace import open_workspace
from lumos.data.ingest import run_ingest
from lumos.data.recipe import IngestRecipe
from lumos.data.synthetic import SyntheticSpec, generate_quickstart
from lumos.quickstart import RECIPES
from lumos.train.config import TrainConfig
from lumos.train.run import train


@pytest.fixture(scope="session")
def ingest_quickstart(spark) -> Callable[..., None]:
    """`ingest(folder, spec, max_len)`: synthetic quickstart data in folder/data and one ingest of
    the quickstart recipe over it, with histories of max_len, into the workspace at folder."""
    return lambda folder, spec, max_len: _ingest_quickstart(spark, folder, spec, max_len)


def _ingest_quickstart(spark, folder: Path, spec: SyntheticSpec, max_len: int) -> None:
    data = folder / "data"
    generate_quickstart(data, spec)
    recipe = load_config(IngestRecipe, RECIPES / "ingest.toml", [
        f"source.path={data / 'events'}", f"users.path={data / 'users.parquet'}",
        f"calendar.path={data / 'calendar.csv'}", f"tokens.max_len={max_len}",
    ])
    run_ingest(spark, open_workspace(folder), recipe, RECIPES)


@pytest.fixture(scope="session")
def trained_quickstart(spark) -> Callable[..., str]:
    """`make(folder, seed=, max_len=, steps=, experiment=)`: synthetic quickstart data in
    folder/data (200 users, 8,000 events), one ingest with histories of max_len, and one run of a
    d=8 model trained for `steps`; returns the run id."""

    def make(folder: Path, *, seed: int, max_len: int, steps: int, experiment: str) -> str:
        _ingest_quickstart(spark, folder, SyntheticSpec(users=200, events=8_000, seed=seed), max_len)
        config = from_dict(TrainConfig, {
            "data": {"loader_workers": 1},
            "model": {"d_model": 8, "n_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 16,
                      "dropout": 0.0, "max_len": max_len},
            "run": {"batch_size": 32, "max_steps": steps, "eval_every": 1000, "log_every": 10,
                    "checkpoint_every": 1000, "experiment": experiment},
        })
        with one_torch_thread():
            return train(config, open_workspace(folder)).run_id

    return make


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread: two cores, and the test process shares them with Spark's JVM, so more
    threads oversubscribe and run slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The test runs torch on one thread (`one_torch_thread`); a module turns it on for all its
    tests with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    with one_torch_thread():
        yield
