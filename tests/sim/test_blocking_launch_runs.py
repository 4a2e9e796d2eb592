"""``launch: blocking`` on whole training steps: the option through
:func:`distsim.simulate` and ``distsim simulate``, symmetry and
coarsening keeping the step, the estimator's refusal and a sweep's skip."""
from pathlib import Path

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError, NotModelledError
from distsim.estimate import estimate
from distsim.topology import load_topology

#: a pipeline with tensor and data parallelism on 8 GPUs: every stream kind
RUN = dict(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2, microbatches=4,
           network_mode="analytical")


@pytest.fixture(scope="module")
def steps():
    return {(launch, symmetry, coarsen): distsim.simulate(
        **RUN, launch=launch, symmetry=symmetry, coarsen=coarsen)
        for launch in ("async", "blocking") for symmetry, coarsen in
        ((False, False), (True, True))}


def test_blocking_launches_never_overlap_a_devices_ops(steps):
    # but the transfers of one launch (a group of point-to-point transfers:
    # a stage's send to the next stage and its receive from it, one NCCL
    # kernel, move at once)
    result = steps[("blocking", False, False)]
    by_rank = {}
    for r in result.trace.ops:
        by_rank.setdefault(r.rank, []).append((r.start_s, r.end_s, r.stream))
    grouped = 0
    for spans in by_rank.values():
        spans.sort()
        end, stream = spans[0][1], spans[0][2]
        for start, e, s in spans[1:]:
            if start < end - 1e-12:
                assert s == stream == "p2p"
                grouped += 1
            if e > end:
                end, stream = e, s
    assert grouped
    # async overlaps some communication with compute on this run
    overlapped = steps[("async", False, False)].trace.ops
    assert any(a.rank == b.rank and a.stream != b.stream and a.start_s < b.end_s - 1e-9
               and b.start_s < a.end_s - 1e-9 for a in overlapped for b in overlapped)
    assert result.step_time_s > steps[("async", False, False)].step_time_s


def test_symmetry_and_coarsening_keep_the_blocking_step(steps):
    assert steps[("blocking", True, True)].step_time_s == pytest.approx(
        steps[("blocking", False, False)].step_time_s, rel=1e-9)


def test_the_setting_is_in_the_runs_configuration(steps):
    assert steps[("blocking", False, False)].config["launch"] == "blocking"
    assert steps[("async", False, False)].config["launch"] == "async"


@pytest.mark.parametrize("option, message", [
    ("launch", "must be 'async' or 'blocking', got 'sync'"),
    ("p2p", "must be one of 'async', 'synchronous', 'separate', got 'sync'"),
])
def test_a_bad_launch_or_p2p_setting_is_one_line_in_the_api_and_exit_2_in_the_cli(
        option, message, tmp_path, capsys):
    flag = f"--{option}"
    with pytest.raises(ConfigError, match=f"^{flag}: {message}$"):
        distsim.simulate(**RUN, **{option: "sync"})
    with pytest.raises(SystemExit) as info:   # argparse's choices, one line (cli.Parser)
        main(["simulate", flag, "sync", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"{flag}: invalid choice: 'sync'" in err


def test_the_cli_runs_blocking_launches(tmp_path):
    assert main(["simulate", "--model", "tiny", "--dp", "8", "--launch", "blocking",
                 "--no-plots", "--out", str(tmp_path / "o")]) == 0


def test_the_estimator_refuses_blocking_launches_and_a_sweep_skips_them():
    from distsim.sweep.point import run_point
    options = dict(RUN, launch="blocking")
    with pytest.raises(NotModelledError, match="launch 'blocking'.*fidelity: simulate"):
        estimate(options)
    with pytest.raises(ConfigError, match="--launch: must be 'async' or 'blocking'"):
        estimate(dict(RUN, launch="sync"))
    assert estimate(dict(RUN, launch="async")) == estimate(RUN)
    row = run_point({**options, "fidelity": "estimate"})
    assert row["status"] == "skipped" and "launch 'blocking'" in row["reason"]


@pytest.mark.parametrize("strategy", [
    dict(pp=4, dp=2, microbatches=4),
    dict(pp=2, tp=2, dp=2, microbatches=4, schedule="interleaved", virtual_stages=2),
    dict(dp=4, tp=2, zero=3),
    dict(pp=2, dp=2, tp=2, zero=1, microbatches=4, sp=True),
    dict(pp=4, dp=2, microbatches=4, schedule="zb-h1"),
])
@pytest.mark.parametrize("host_launch_s", [0.0, 20e-6])
def test_blocking_steps_finish_and_symmetry_with_coarsening_keeps_them(strategy, host_launch_s,
                                                                      tmp_path):
    # every schedule and ZeRO stage runs to the end (one program order for
    # all ranks cannot deadlock), is slower than with async launches, and
    # symmetry + coarsening (a coarsened segment pays its kernels' k H)
    # give the whole program's step
    text = (Path(distsim.__file__).parents[1] / "topologies" / "dgx-a100.yaml").read_text()
    path = tmp_path / "queued.yaml"      # the loaded topologies are cached: a file of its own
    path.write_text(text.replace("\ndevice:\n", f"\ndevice:\n  host_launch_s: {host_launch_s}\n",
                                 1))
    topo = load_topology(str(path))
    assert topo.device_spec.host_launch_s == host_launch_s
    step = {(launch, reduced): distsim.simulate(
        model="tiny", topology=topo, launch=launch, symmetry=reduced, coarsen=reduced,
        network_mode="analytical", **strategy).step_time_s
        for launch in ("async", "blocking") for reduced in (False, True)}
    assert step[("blocking", True)] == pytest.approx(step[("blocking", False)], rel=1e-9)
    assert step[("blocking", False)] > step[("async", False)]


def test_a_sweep_takes_launch_as_a_run_option_with_its_choices():
    from distsim.sweep import simulate_parameters
    param = simulate_parameters()["launch"]
    assert param.group == "run" and param.choices == ("async", "blocking")
    assert param.default == "async"
