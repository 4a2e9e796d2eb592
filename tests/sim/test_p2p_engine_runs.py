"""``p2p`` on whole training steps: the option through
:func:`distsim.simulate` and ``distsim simulate``, symmetry and
coarsening keeping the step, and a sweep's choices (a bad value: with
``launch``'s, ``test_blocking_launch_runs``)."""
import pytest

import distsim
from distsim.cli import main

#: a pipeline with tensor and data parallelism on 8 GPUs: every stream kind
RUN = dict(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2, microbatches=4,
           network_mode="analytical")


@pytest.mark.parametrize("strategy", [
    dict(dp=2, tp=2, pp=2, microbatches=4),
    dict(pp=2, tp=2, dp=2, microbatches=4, schedule="interleaved", virtual_stages=2),
    dict(pp=4, dp=2, microbatches=4, schedule="zb-h1"),
])
@pytest.mark.parametrize("launch", ["async", "blocking"])
def test_each_engine_finishes_no_faster_and_symmetry_with_coarsening_keeps_it(strategy, launch):
    # each setting only adds waits (the analytical network: no contention
    # that an added wait could relieve), and one program order for all
    # ranks cannot deadlock
    step = {(p2p, reduced): distsim.simulate(
        model="tiny", topology="dgx-a100", network_mode="analytical", launch=launch, p2p=p2p,
        symmetry=reduced, coarsen=reduced, **strategy).step_time_s
        for p2p in ("async", "synchronous", "separate") for reduced in (False, True)}
    for p2p in ("async", "synchronous", "separate"):
        assert step[(p2p, True)] == pytest.approx(step[(p2p, False)], rel=1e-9)
    assert step[("async", False)] <= step[("synchronous", False)] * (1 + 1e-12)
    assert step[("synchronous", False)] <= step[("separate", False)] * (1 + 1e-12)
    if launch == "async":
        assert step[("async", False)] < step[("separate", False)]


def test_the_setting_is_in_the_runs_configuration():
    assert distsim.simulate(**RUN, p2p="synchronous").config["p2p"] == "synchronous"
    assert distsim.simulate(**RUN).config["p2p"] == "async"


def test_the_cli_runs_a_synchronous_engine(tmp_path):
    assert main(["simulate", "--model", "tiny", "--pp", "2", "--dp", "4", "--p2p",
                 "synchronous", "--no-plots", "--out", str(tmp_path / "o")]) == 0


def test_a_sweep_takes_p2p_as_a_run_option_with_its_choices():
    from distsim.sweep import simulate_parameters
    param = simulate_parameters()["p2p"]
    assert param.group == "run" and param.choices == ("async", "synchronous", "separate")
    assert param.default == "async"
