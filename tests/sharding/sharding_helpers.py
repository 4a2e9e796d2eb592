"""Helpers of the sharding tests."""
import numpy as np
import pytest

from distsim.interp import NumpyExecutor, random_inputs
from distsim.ir import verify
from distsim.text import parse_module
from distsim.transforms.sharding import check_lowering, shard_program


def run_sharded(text_or_module, seed=0):
    """Propagate, lower, verify and check a module; returns (sharded, local)."""
    module = parse_module(text_or_module) if isinstance(text_or_module, str) else text_or_module
    sharded, local = shard_program(module)
    verify(local)
    result = check_lowering(module, local, seed=seed)
    assert result.ok, str(result)
    return sharded, local


def comm_ops(function, kind=None):
    return [op for op in function.ops if op.op_type.startswith("comm.")
            and (kind is None or op.op_type == "comm." + kind)]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


__all__ = ["run_sharded", "comm_ops", "NumpyExecutor", "random_inputs"]
