"""Blocking launches (``launch: blocking``, ``CUDA_LAUNCH_BLOCKING=1``):
the host issues one launch and waits for it to finish, so a device's
streams never overlap and each launch pays the host's time in series.
Times by hand: compute ops timed by a profile (an add
1 ms), collectives from the alpha-beta ring formula on a star (100 GB/s a
link each way, 1 us a hop: a 2-rank ring all-reduce of S bytes is 2 steps
of 2 us + (S/2)/B), the analytical network."""
import pytest

from distsim.cost import CostModel
from distsim.errors import ConfigError, SimulationError
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.topology import topology_from_dict

F16 = DType.F16
MS = 1e-3
US = 1e-6
B = 100e9
S = 4e8                                   # the all-reduced tensor: 200 M f16 values
ALLREDUCE = 2 * (2 * US + S / 2 / B)      # 4.004 ms
SEND = 2 * US + 1e8 / B                   # 1.002 ms: 100 MB point to point


def star(host_launch_s=0.0, devices=2):
    device = {"name": "toy", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
              "memory_bytes": 1e10, "host_launch_s": host_launch_s}
    return topology_from_dict({"device": device, "builder": "star", "params": {
        "devices": devices, "link_GBps": B / 1e9, "latency_us": 1}}, "star.yaml")


def run(program, launch, host_launch_s=0.0, devices=2, **options):
    topo = star(host_launch_s, devices)
    cost = CostModel(topo.device_spec, profile={"matmul": 1 * MS, "add": 1 * MS})
    trace = simulate_function(program, topo, cost, SimulationOptions(
        network_mode="analytical", launch=launch, **options))
    return {(r.rank, r.name): r for r in trace.ops}, trace


def compute_collective_compute():
    """On ranks 0 and 1: g = add(x); all-reduce g; y = add(w) (which
    does not read the all-reduce's result)."""
    b = FunctionBuilder("ccc")
    x = [b.input(f"x{r}", TensorType((int(S) // 2,), F16, r)) for r in (0, 1)]
    w = [b.input(f"w{r}", TensorType((100,), F16, r)) for r in (0, 1)]
    g = [b.op("add", [x[r], x[r]], name=f"g{r}") for r in (0, 1)]
    s = b.op("comm.allreduce", g, {"ranks": (0, 1), "algorithm": "ring"}, name=["s0", "s1"])
    y = [b.op("add", [w[r], w[r]], name=f"y{r}") for r in (0, 1)]
    return b.finish(list(s) + y)


def test_async_launches_overlap_the_collective_with_the_compute_after_it():
    got, trace = run(compute_collective_compute(), "async")
    assert got[(0, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert got[(0, "y0")].start_s == pytest.approx(1 * MS, rel=1e-12)   # beside it
    assert trace.step_time_s == pytest.approx(1 * MS + ALLREDUCE, rel=1e-12)
    assert ALLREDUCE == pytest.approx(4.004 * MS, rel=1e-12)


def test_blocking_launches_run_compute_collective_compute_one_after_another():
    got, trace = run(compute_collective_compute(), "blocking")
    for r in (0, 1):
        assert got[(r, f"g{r}")].start_s == 0.0
        assert got[(r, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
        assert got[(r, "s0")].end_s == pytest.approx(5.004 * MS, rel=1e-12)
        assert got[(r, f"y{r}")].start_s == pytest.approx(5.004 * MS, rel=1e-12)
    # the sum: 1 ms + 4.004 ms + 1 ms
    assert trace.step_time_s == pytest.approx(6.004 * MS, rel=1e-12)


def test_each_blocking_launch_pays_the_hosts_time_in_series():
    # H = 10 us before each launch: the add 10-1010 us, the all-reduce
    # from 1020 us (both ranks) to 5024 us, the add 5034-6034 us
    got, trace = run(compute_collective_compute(), "blocking", host_launch_s=10 * US)
    assert got[(0, "g0")].start_s == pytest.approx(10 * US, rel=1e-12)
    assert got[(0, "g0")].end_s == pytest.approx(1010 * US, rel=1e-12)
    assert got[(0, "s0")].start_s == pytest.approx(1020 * US, rel=1e-12)
    assert got[(0, "y0")].start_s == pytest.approx(5034 * US, rel=1e-12)
    assert trace.step_time_s == pytest.approx(6034 * US, rel=1e-12)
    # async with the same H: the host's launches hide behind the kernels
    # (the first add issued at 10 us, the second at 20 us beside the all-reduce)
    _, trace = run(compute_collective_compute(), "async", host_launch_s=10 * US)
    assert trace.step_time_s == pytest.approx(1010 * US + ALLREDUCE, rel=1e-12)


def test_a_collective_waits_for_the_compute_op_launched_before_it_on_its_rank():
    # rank 0's all-reduce of x (ready at 0) comes after an unrelated 1 ms add
    # in program order: async starts it at 0, blocking at 1 ms
    b = FunctionBuilder("late")
    x = [b.input(f"x{r}", TensorType((int(S) // 2,), F16, r)) for r in (0, 1)]
    w = b.input("w", TensorType((100,), F16, 0))
    m = b.op("add", [w, w], name="m")
    s = b.op("comm.allreduce", x, {"ranks": (0, 1), "algorithm": "ring"}, name=["s0", "s1"])
    program = b.finish([m] + list(s))
    got, trace = run(program, "async", comm_order="inputs")
    assert got[(1, "s0")].start_s == 0.0
    assert trace.step_time_s == pytest.approx(ALLREDUCE, rel=1e-12)
    got, trace = run(program, "blocking")
    assert got[(1, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)   # rank 0 is late
    assert trace.step_time_s == pytest.approx(1 * MS + ALLREDUCE, rel=1e-12)


def test_two_collectives_of_different_groups_are_serialised_on_a_device():
    # per-group streams would run both all-reduces of rank 0 at once
    # (sharing its link); blocking runs them one after the other
    b = FunctionBuilder("two")
    x = [b.input(f"x{r}", TensorType((int(S) // 2,), F16, r)) for r in (0, 1)]
    y = [b.input(f"y{r}", TensorType((int(S) // 2,), F16, r)) for r in (0, 1)]
    s = b.op("comm.allreduce", x, {"ranks": (0, 1), "algorithm": "ring"}, name=["a0", "a1"])
    t = b.op("comm.allgather", y, {"ranks": (0, 1), "algorithm": "ring"}, name=["b0", "b1"])
    program = b.finish(list(s) + list(t))
    got, trace = run(program, "blocking", comm_streams="per-group")
    assert got[(0, "b0")].start_s == pytest.approx(got[(0, "a0")].end_s, rel=1e-12)


def test_consecutive_point_to_point_transfers_are_one_launch():
    # rank 1 receives 100 MB from rank 0 and sends 100 MB to rank 2, the two
    # transfers one after the other in its program: one group, so they run
    # at once (on different queues, different links), and the adds after
    # them wait for the group: SEND + 1 ms, not 2 SEND + 1 ms
    b = FunctionBuilder("relay")
    a = b.input("a", TensorType((int(5e7),), F16, 0))
    c = b.input("c", TensorType((int(5e7),), F16, 1))
    ab = b.op("comm.sendrecv", [a], {"ranks": (0, 1)}, name="ab")
    bc = b.op("comm.sendrecv", [c], {"ranks": (1, 2)}, name="bc")
    y = b.op("add", [ab, ab], name="y")
    z = b.op("add", [bc, bc], name="z")
    program = b.finish([y, z])
    got, trace = run(program, "blocking", devices=3)
    assert got[(1, "ab")].start_s == got[(1, "bc")].start_s == 0.0
    assert got[(1, "y")].start_s == pytest.approx(SEND, rel=1e-12)
    assert got[(2, "z")].start_s == pytest.approx(SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(SEND + 1 * MS, rel=1e-12)
    assert SEND == pytest.approx(1.002 * MS, rel=1e-12)


def test_a_bad_launch_setting_is_one_line():
    with pytest.raises(ConfigError, match=r"--launch: must be 'async' or 'blocking', got 'sync'"):
        run(compute_collective_compute(), "sync")


def test_a_run_stopped_under_blocking_launches_names_the_launch_an_op_waits_for():
    # stopped after its first events: the add after the all-reduce waits
    # for the all-reduce's launch to end
    with pytest.raises(SimulationError, match="waiting for the launch before it to finish"):
        run(compute_collective_compute(), "blocking", max_events=2)


@pytest.mark.parametrize("launch, exposed", [("async", ALLREDUCE - 1 * MS),
                                             ("blocking", ALLREDUCE)])
def test_communication_by_kind_reads_busy_and_exposed_time(launch, exposed):
    # the all-reduce (no role: a tensor-parallel one) is busy its whole time;
    # async, the second add covers its first millisecond
    from distsim.report.comm_kinds import communication_by_kind
    program = compute_collective_compute()
    _, trace = run(program, launch)
    split = communication_by_kind(trace, program, rank=0)
    assert set(split) == {"TP"}
    assert split["TP"]["busy_s"] == pytest.approx(ALLREDUCE, rel=1e-12)
    assert split["TP"]["exposed_s"] == pytest.approx(exposed, rel=1e-12)
