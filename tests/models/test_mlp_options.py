"""The MLP's strategy options: plain data parallelism is the one-device
step replicated (unchanged); every other option takes the generic path
(the ``megatron`` plan, LowerSPMD) and is applied, never ignored while
the summary's config claims it."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.ir.comm import is_communication
from distsim.models.mlp import MLPConfig, mlp_training_step
from distsim.transforms.data_parallel import DataParallel

SMALL = ["simulate", "--layers", "2", "--hidden", "64", "--batch", "64", "--dp", "2",
         "--no-plots"]
SIZES = dict(layers=2, hidden=64, batch=64, dp=2)


def test_plain_data_parallel_still_runs(tmp_path):
    assert main(SMALL + ["--optimizer", "sgd", "--symmetry", "--out", str(tmp_path)]) == 0


def test_plain_data_parallel_is_the_replicated_step():
    program, _, _ = distsim.build_program("mlp", **SIZES)
    expected = DataParallel(2)(mlp_training_step(MLPConfig(layers=2, hidden=64, batch=64)))
    assert program.structural_key() == expected.structural_key()


def _kinds(program):
    return {op.op_type for op in program.ops if is_communication(op)}


@pytest.mark.parametrize("options, applied", [
    (dict(zero=3), lambda p: "comm.allgather" in _kinds(p)),
    (dict(zero=1), lambda p: p.meta["strategy"]["zero"] == 1),
    (dict(bucket_mb=0), lambda p: p.meta["strategy"]["bucket_mb"] == 0),
    (dict(recompute="full"), lambda p: p.meta["recompute"] == "full"),
    (dict(microbatches=4), lambda p: p.meta["microbatches"] == 4),
    (dict(global_batch=64, micro_batch=8), lambda p: p.meta["microbatches"] == 4),
    (dict(prefetch=3, zero=3), lambda p: p.meta["strategy"]["prefetch"] == 3),
    (dict(partition="balanced"), lambda p: p.meta["strategy"]["partition"] == "balanced"),
    (dict(tp=2), lambda p: p.meta["tp"] == 2 and "comm.allreduce" in _kinds(p)),
    (dict(plan="megatron"), lambda p: p.meta["strategy"]["plan"] == "megatron"),
])
def test_other_options_take_the_generic_path_and_are_applied(options, applied):
    program, config, _ = distsim.build_program("mlp", **{**SIZES, **options})
    assert "io" in program.meta and applied(program)
    assert all(config[k] == v for k, v in options.items())
