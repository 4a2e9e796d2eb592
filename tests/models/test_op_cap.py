"""build_program refuses a program estimated past max_ops before building it."""
from __future__ import annotations

import pytest

import distsim
from distsim.api import DEFAULT_MAX_OPS, estimate_ops
from distsim.errors import ConfigError
from distsim.transforms.strategy import Strategy


def test_estimate_is_close_to_the_built_size():
    program, config, _ = distsim.build_program(layers=8, dp=8)
    est = estimate_ops(config, Strategy.from_mapping({"dp": 8}).resolved(8))
    assert est["devices"] == 8 and est["layers"] == 8
    assert est["ops"] / 3 <= len(program.ops) <= est["ops"] * 3


def test_gpt_with_symmetry_counts_one_device_per_stage():
    config = distsim.models.load_model_config("gpt3-175b")
    s = Strategy.from_mapping({"tp": 8, "pp": 16, "dp": 8, "micro_batch": 1,
                               "global_batch": 1536, "symmetry": True}).resolved(1024)
    est = estimate_ops(config, s)
    assert est["devices"] == 1 and est["microbatches"] == 192
    assert est["ops"] < DEFAULT_MAX_OPS
    full = estimate_ops(config, Strategy.from_mapping({**s.to_dict(), "symmetry": False}))
    assert full["devices"] == 64


def test_limit_refuses_early_and_zero_lifts_it():
    with pytest.raises(ConfigError, match=r"about 192 ops to build \(3 layers x 1 micro-batches "
                                          r"x 8 devices per stage\), more than --max-ops 100"):
        distsim.build_program(layers=3, max_ops=100)
    program, _, _ = distsim.build_program(layers=3, hidden=64, batch=64, max_ops=0)
    assert len(program.ops) > 0
    with pytest.raises(ConfigError, match="--max-ops: must be an integer >= 0"):
        distsim.build_program(layers=3, max_ops="lots")


def test_onnx_models_have_no_estimate():
    assert estimate_ops({"family": "onnx", "path": "x.onnx"}, Strategy()) is None
