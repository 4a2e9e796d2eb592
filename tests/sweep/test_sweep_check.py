"""fidelity: estimate in a sweep, and ``check``: the best estimates
simulated in full afterwards, as extra rows."""
from __future__ import annotations

import json

import pandas as pd
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.sweep import load_spec

BASE = {"model": "tiny", "topology": "dgx-a100", "global_batch": 16,
        "network_mode": "analytical", "fidelity": "estimate"}
GRID = {"tp": [1, 2], "pp": [1, 2, 4]}


def test_estimated_grid_and_a_simulated_check(tmp_path):
    df = distsim.sweep(BASE, GRID, workers=1, progress=False, out_dir=tmp_path, check=2)
    assert len(df) == 8 and list(df["index"]) == list(range(8))
    grid, checks = df[df["index"] < 6], df[df["index"] >= 6]
    assert set(grid["fidelity"]) == {"estimate"} and set(checks["fidelity"]) == {"simulate"}
    assert (df["status"] == "ok").all(), df["reason"].tolist()
    # the checks are the two fastest estimates (every point trains 16 sequences)
    assert set(df["resolved_global_batch"]) == {16}
    best = grid.sort_values(["step_time_s", "index"]).head(2)
    assert [(r.tp, r.pp) for r in checks.itertuples()] == [(r.tp, r.pp)
                                                           for r in best.itertuples()]
    for (_, e), (_, s) in zip(best.iterrows(), checks.iterrows()):
        assert s["step_time_s"] == pytest.approx(e["step_time_s"], rel=0.03)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["total"] == manifest["done"] == 8 and manifest["complete"] is True
    # a rerun resumes: nothing is estimated or simulated again
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    again = distsim.sweep(BASE, GRID, workers=1, progress=False, out_dir=tmp_path, check=2)
    pd.testing.assert_frame_equal(again, df)
    assert (tmp_path / "results.jsonl").read_text().splitlines() == lines


def test_the_check_on_worker_processes_gives_the_same_rows():
    # the check's simulations run on a runner of their own (opened, so its
    # workers fork where that is safe): the rows do not depend on it
    one = distsim.sweep(BASE, GRID, workers=1, progress=False, check=2)
    two = distsim.sweep(BASE, GRID, workers=2, progress=False, check=2)
    pd.testing.assert_frame_equal(two, one)


def test_a_yaml_check_needs_estimates(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: tiny, topology: dgx-a100, fidelity: estimate}\n"
                    "grid: {tp: [1, 2]}\ncheck: 1\n")
    assert load_spec(spec).check == 1
    spec.write_text("base: {model: tiny, topology: dgx-a100}\ngrid: {tp: [1, 2]}\ncheck: 1\n")
    with pytest.raises(ConfigError, match=r"check: 1 needs estimated points"):
        load_spec(spec)
    spec.write_text("base: {model: tiny, fidelity: estimate}\ngrid: {tp: [1, 2]}\n"
                    "check: -1\n")
    with pytest.raises(ConfigError, match=r"s.yaml: check: must be an integer >= 0"):
        load_spec(spec)
    spec.write_text("base: {model: tiny}\ngrid: {fidelity: [estimate, fast]}\n")
    with pytest.raises(ConfigError, match=r"fidelity must be one of simulate, estimate"):
        load_spec(spec)


def test_estimate_rows_of_models_the_estimator_does_not_cover_are_invalid():
    df = distsim.sweep({"model": "mlp", "network_mode": "analytical", "layers": 2,
                        "batch": 64}, {"fidelity": ["simulate", "estimate"]}, workers=1,
                       progress=False)
    assert list(df["status"]) == ["ok", "invalid"]
    assert "estimator covers GPT models" in df.loc[1, "reason"]
    # dp fills dgx-a100's 8 GPUs: 64 samples = 8 ranks x 1 micro-batch of 8
    assert (df.loc[0, "resolved_dp"], df.loc[0, "resolved_global_batch"],
            df.loc[0, "resolved_micro_batch"], df.loc[0, "resolved_microbatches"]) == (8, 64, 8, 1)
