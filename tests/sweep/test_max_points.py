"""A grid that expands past max_points is refused before any work."""
from __future__ import annotations

import pytest

from distsim.errors import ConfigError
from distsim.sweep import SweepSpec, sweep
from distsim.sweep.spec import DEFAULT_MAX_POINTS, check_grid_size

BASE = {"model": "mlp", "layers": 1, "hidden": 64, "batch": 64, "network_mode": "analytical"}


def test_default_and_boundary():
    assert DEFAULT_MAX_POINTS == 100_000
    assert check_grid_size([10, 10], 100, "s") == 100
    with pytest.raises(ConfigError, match=r"^s: grid: expands to 101 points \(101\), more than "
                                          r"max_points 100 "):
        check_grid_size([101], 100, "s")
    assert check_grid_size([1000, 1000], 0, "s") == 10**6          # 0: no limit


def test_create_refuses_a_big_grid_and_zero_lifts_the_cap():
    grid = {"layers": list(range(1, 401)), "hidden": list(range(64, 64 + 400))}  # 160,000
    with pytest.raises(ConfigError, match="grid: expands to 160,000 points"):
        SweepSpec.create({"model": "mlp"}, grid)
    assert SweepSpec.create({"model": "mlp"}, grid, max_points=0).size == 160_000


def test_sweep_checks_a_given_spec_and_writes_nothing(tmp_path):
    spec = SweepSpec.create(BASE, {"dp": [1, 2, 4]})
    with pytest.raises(ConfigError, match="expands to 3 points"):
        sweep(spec=spec, max_points=2, out_dir=tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="expands to 3 points"):
        sweep(BASE, {"dp": [1, 2, 4]}, max_points=2, workers=1, progress=False)
