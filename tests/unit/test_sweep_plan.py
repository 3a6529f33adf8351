"""The sweep's plan: grids into points × seeds, every child config checked before anything trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from lumos.core.errors import ConfigError, UsageError
from lumos.experiments.sweep import parse_grid, plan_configs

RECIPE = Path(__file__).resolve().parents[2] / "lumos" / "quickstart" / "train.toml"


def test_points_are_the_product_of_the_grids_and_each_trains_once_per_seed():
    grids = parse_grid(["optim.lr=1e-3,2e-3", "model.dropout=0.1, 0.3"])
    plan = plan_configs(RECIPE, grids, [0, 1, 2])
    assert [point.label for point in plan] == [
        "optim.lr=1e-3 model.dropout=0.1", "optim.lr=1e-3 model.dropout=0.3",
        "optim.lr=2e-3 model.dropout=0.1", "optim.lr=2e-3 model.dropout=0.3"]
    configs = [config for by_seed in plan.values() for config in by_seed.values()]
    assert len(configs) == 12
    assert sorted({(c.optim.lr, c.model.dropout, c.run.seed) for c in configs}) == sorted(
        (lr, dropout, seed) for lr in (1e-3, 2e-3) for dropout in (0.1, 0.3) for seed in (0, 1, 2))


def test_bad_grids_and_seeds_are_refused_before_training():
    with pytest.raises(UsageError, match="KEY=V1,V2"):
        parse_grid(["optim.lr"])
    with pytest.raises(UsageError, match="twice"):
        parse_grid(["optim.lr=1", "optim.lr=2"])
    with pytest.raises(ConfigError) as raised:
        plan_configs(RECIPE, parse_grid(["optim.lrr=1e-3", "optim.lr=-1,1e-3"]), [0])
    assert "optim.lrr" in str(raised.value) and "optim.lr: must be a finite positive number" in str(raised.value)
    with pytest.raises(UsageError, match="twice"):
        plan_configs(RECIPE, [], [1, 1])
