"""The global batch is fixed: ``microbatches`` sets the micro-batch size,
never the number of sequences a step trains (so sweep rows compare)."""
from __future__ import annotations

import pytest

from distsim.errors import ConfigError
from distsim.models import load_model_config
from distsim.models.gpt_family import gpt_config, resolve_batch
from distsim.transforms.strategy import Strategy


def resolved(model: str = "gpt3-1.3b", **strategy):
    c, m = resolve_batch(gpt_config(load_model_config(model)), Strategy(**strategy))
    return c.global_batch, c.micro_batch, m


def test_microbatches_divide_the_models_global_batch():
    # gpt3-1.3b trains 512 sequences per step, micro-batch 1 by default
    assert resolved(dp=8) == (512, 1, 64)                   # 512 / (8 x 1)
    assert resolved(dp=8, microbatches=16) == (512, 4, 16)  # 512 / (8 x 16) = 4
    assert resolved(dp=1, tp=4, pp=2, microbatches=8) == (512, 64, 8)
    assert resolved(dp=2, microbatches=4, global_batch=64) == (64, 8, 4)
    assert resolved(dp=2, micro_batch=2, global_batch=64) == (64, 2, 16)
    # both counts given and consistent with the global batch
    assert resolved(dp=2, microbatches=4, micro_batch=64) == (512, 64, 4)


def test_sizes_that_do_not_fit_are_one_clear_error():
    with pytest.raises(ConfigError, match=r"--global-batch 512 is not a multiple of dp x "
                                          r"microbatches = 8 x 48"):
        resolved(dp=8, microbatches=48)
    with pytest.raises(ConfigError, match=r"--global-batch 512 differs from dp x microbatches x "
                                          r"micro-batch = 8 x 8 x 2 = 128"):
        resolved(dp=8, microbatches=8, micro_batch=2)
    with pytest.raises(ConfigError, match=r"--global-batch 512 is not a multiple of dp x "
                                          r"micro-batch = 8 x 3"):
        resolved(dp=8, micro_batch=3)


def test_a_simulated_step_trains_the_global_batch():
    import distsim
    a = distsim.simulate(model="tiny", topology="dgx-a100", dp=8, network_mode="analytical")
    b = distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2, microbatches=4,
                         network_mode="analytical")
    assert a.config["global_batch"] == b.config["global_batch"] == 8
    assert (b.config["micro_batch"], b.config["microbatches"]) == (1, 4)
    assert a.summary()["tokens_per_s"] == pytest.approx(8 * 16 / a.step_time_s)
