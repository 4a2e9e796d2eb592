"""The estimator (distsim.estimate) against the full simulation.

Every configuration of the grid is simulated in full (analytical network
mode) and estimated; the step time and the peak memory per GPU must agree
within the estimator's error bound (:data:`AGREEMENT_TOLERANCE`).
"""
from __future__ import annotations

import pytest

import distsim
from distsim.errors import ConfigError
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est
from distsim.models import load_model_config

GPT2 = {"model": "gpt2", "layers": 4, "global_batch": 32, "network_mode": "analytical"}
ONE_NODE = [
    dict(dp=8),
    dict(dp=8, zero=1, bucket_mb=10),
    dict(dp=8, zero=2),
    dict(dp=8, zero=3),
    dict(dp=8, bucket_mb=0),
    dict(dp=2, tp=4),
    dict(dp=4, tp=2, recompute="full"),
    dict(dp=4, tp=2, recompute="selective", sp=True),
    dict(dp=2, tp=2, pp=2, zero=1),
    dict(dp=2, pp=4),
    dict(dp=2, pp=4, schedule="gpipe"),
    dict(dp=2, pp=2, tp=2, schedule="interleaved"),
    dict(dp=4, pp=2, zero=3),
    dict(dp=2, tp=2, pp=2, optimizer="sgd"),
]
TWO_NODES = [
    dict(dp=16, micro_batch=1),
    dict(dp=4, tp=2, pp=2),
    dict(dp=4, pp=4, schedule="interleaved", zero=2, layers=8, micro_batch=2),
    dict(dp=8, pp=2, zero=3, recompute="full"),
    dict(dp=2, tp=2, pp=4, partition="balanced"),
    dict(dp=8, pp=2, zero=2, bucket_mb=0),
]
CASES = [("dgx-a100", c) for c in ONE_NODE] + [("dgx-a100-x2", c) for c in TWO_NODES]


@pytest.mark.parametrize("topology, strategy", CASES,
                         ids=[f"{t}:" + ",".join(f"{k}={v}" for k, v in s.items())
                              for t, s in CASES])
def test_estimate_agrees_with_the_simulation(topology, strategy):
    options = {**GPT2, "topology": topology, **strategy}
    sim = distsim.simulate(**options).summary()
    row = est.estimate(options)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=AGREEMENT_TOLERANCE)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"],
                                                         rel=AGREEMENT_TOLERANCE)
    assert row["oom"] is bool(sim["oom"])
    # the breakdown adds up to the step, as the summary's does
    parts = row["compute_s"] + row["exposed_communication_s"] + row["idle_s"]
    assert parts == pytest.approx(row["step_time_s"], rel=1e-9)
    assert row["num_devices"] == sim["num_devices"]
    assert row["tokens_per_s"] == pytest.approx(32 * 1024 / row["step_time_s"])


def test_the_resolved_batch_is_reported():
    row = est.estimate({**GPT2, "topology": "dgx-a100", "dp": 2, "tp": 2, "pp": 2,
                        "microbatches": 4})
    # 32 sequences = 2 data-parallel ranks x 4 micro-batches x 4 sequences
    assert (row["dp"], row["global_batch"], row["micro_batch"], row["microbatches"]) == \
        (2, 32, 4, 4)


@pytest.mark.parametrize("strategy", [dict(dp=2, tp=2, pp=2), dict(dp=2, pp=4, zero=1),
                                      dict(dp=2, pp=2, tp=2, schedule="interleaved"),
                                      # the loss in float32: a pipeline transfer under
                                      # a tensor-parallel collective first in the third
                                      # round (communication 1e-2 off from two rounds)
                                      dict(dp=2, pp=2, tp=2, schedule="interleaved",
                                           model={**load_model_config("gpt2"),
                                                  "loss_dtype": "fp32"}),
                                      dict(dp=4, pp=2, zero=3),
                                      # no pipeline: from 2 and 3 micro-batches
                                      dict(dp=4, tp=2), dict(dp=4, tp=2, zero=2),
                                      dict(dp=4, tp=2, zero=3),
                                      dict(dp=2, tp=4, zero=1, recompute="full")])
def test_long_schedules_are_extrapolated_exactly(strategy):
    # past a full pipeline the estimate runs two short timelines and
    # extrapolates; it must give what the full timeline gives
    case = est.resolve({**GPT2, "topology": "dgx-a100", "global_batch": 64,
                        "micro_batch": 1, **strategy})
    profile = est._profile_for(case)
    assert case.microbatches >= 16 > 3 * case.strategy.pp
    direct = est._run_timeline(case, profile)
    fast = est.timeline_figures(case, profile)
    for key, value in direct.items():
        assert fast[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_what_the_estimator_cannot_do_is_a_config_error():
    with pytest.raises(ConfigError, match="estimator covers GPT models"):
        est.estimate({"model": "mlp", "topology": "dgx-a100", "dp": 8})
    with pytest.raises(ConfigError, match="does not divide the 12 attention heads"):
        est.estimate({**GPT2, "topology": "dgx-a100", "tp": 8})
    with pytest.raises(ConfigError, match="does not match the 8 devices"):
        est.estimate({**GPT2, "topology": "dgx-a100", "dp": 2})


def test_the_estimator_refuses_a_batch_and_global_batch_that_differ():
    # both set the global batch: one would win unsaid (simulate refuses it too)
    with pytest.raises(ConfigError, match="--batch 32 and --global-batch 64 differ"):
        est.estimate({**GPT2, "topology": "dgx-a100", "dp": 8, "batch": 32, "global_batch": 64})
    # agreeing, they are one global batch
    figures = est.estimate({**GPT2, "topology": "dgx-a100", "dp": 8, "batch": 32,
                            "global_batch": 32})
    assert figures["global_batch"] == 32


@pytest.mark.parametrize("option, message", [
    ({"network_mode": "bogus"}, "--network-mode: must be 'flow' or 'analytical'"),
    ({"max_ops": -1}, "--max-ops: must be an integer >= 0"),
    ({"coarsen": "yes"}, "--coarsen"),
    ({"max_trace_records": -5}, "max-trace-records"),
])
def test_options_the_estimator_ignores_are_still_checked_as_simulate_checks_them(option, message):
    options = {**GPT2, "topology": "dgx-a100", "dp": 8, **option}
    with pytest.raises(ConfigError, match=message):
        est.estimate(options)


def test_the_comm_streams_setting_is_checked_as_simulate_checks_it():
    # a stream per process group frees the tensor-parallel collectives from
    # the data-parallel ones: with tp 1 there is one group, the same step
    options = {**GPT2, "topology": "dgx-a100", "dp": 8}
    with pytest.raises(ConfigError, match="--comm-streams: must be 'per-group' or 'shared'"):
        est.estimate({**options, "comm_streams": "bogus"})
    assert est.estimate({**options, "comm_streams": "shared"}) == est.estimate(options)
    assert est.estimate({**options, "comm_streams": "per-group"})["step_time_s"] == \
        est.estimate(options)["step_time_s"]


def test_an_estimate_leaves_no_reference_cycles():
    """estimate() pauses the cyclic garbage collector (its passes walk the
    per-layer profiles kept between a sweep's points): that is only safe
    if an estimate leaves no cycles of its own for it to find (a cache
    evicting an older entry may; not the estimate's work). A walk's parts
    share its context and none refers back to another (the sync policy
    holds its sink, the sink not the policy), so none of the estimate's
    objects is left to the collector."""
    import gc
    from distsim.estimate.backward import OpByOpBackward
    from distsim.estimate.context import StepContext
    from distsim.estimate.engine import Timeline
    from distsim.estimate.sync import StepSync
    from distsim.estimate.timeline import Builder, Memo
    from distsim.transforms.sync_policy import SyncPolicy
    options = {**GPT2, "topology": "dgx-a100", "dp": 2, "tp": 2, "pp": 2, "zero": 3,
               "global_batch": 64, "micro_batch": 1}
    est.estimate(options)                 # profiles and caches made once
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        est.estimate(options)
        gc.collect()
        left = [type(x).__name__ for x in gc.garbage
                if isinstance(x, (Builder, StepContext, StepSync, SyncPolicy,
                                  OpByOpBackward, Timeline, Memo))]
        assert left == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
