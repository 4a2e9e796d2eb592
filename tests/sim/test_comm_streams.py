"""One communication stream per process group (``comm_streams: per-group``,
sim/comm_queues.py) against one for every collective (``shared``), on
hand-built programs. Times by hand from the alpha-beta ring formula on a
star: 100 GB/s a link each way, 1 us a hop (2 us a path gpu -> switch ->
gpu); a 2-rank ring all-reduce of S bytes is 2 steps of 2 us + (S/2)/B."""
import numpy as np
import pytest

from distsim.cost import CostModel
from distsim.errors import ConfigError
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.sim.comm_queues import comm_queues, group_stream
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.topology import topology_from_dict

F16 = DType.F16
B = 100e9
ALPHA = 2e-6
S_DP = 1e9     # the gradient: 500 M f16 values
S_TP = 1e8     # the activation: 50 M f16 values
DP_ALONE = 2 * (ALPHA + S_DP / 2 / B)    # 10.004 ms
TP_ALONE = 2 * (ALPHA + S_TP / 2 / B)    # 1.004 ms


@pytest.fixture(scope="module")
def star():
    device = {"name": "toy", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
              "memory_bytes": 1e10}
    return topology_from_dict({"device": device, "builder": "star", "params": {
        "devices": 4, "link_GBps": B / 1e9, "latency_us": 1}}, "star.yaml")


def _records(star, program, mode, network="analytical"):
    """The records by (rank, name of the op's first result), and the trace."""
    trace = simulate_function(program, star, CostModel(star.device_spec), SimulationOptions(
        network_mode=network, comm_streams=mode))
    return {(r.rank, r.name): r for r in trace.ops}, trace


def tp_after_dp():
    """Rank 0 issues a data-parallel all-reduce with rank 2, then a
    tensor-parallel one with rank 1; every operand is ready at 0."""
    b = FunctionBuilder("tp-after-dp")
    g = [b.input(f"g{r}", TensorType((int(S_DP) // 2,), F16, r)) for r in (0, 2)]
    x = [b.input(f"x{r}", TensorType((int(S_TP) // 2,), F16, r)) for r in (0, 1)]
    dp = b.op("comm.allreduce", g, {"ranks": (0, 2), "algorithm": "ring"}, name=["dp0", "dp2"])
    tp = b.op("comm.allreduce", x, {"ranks": (0, 1), "algorithm": "ring"}, name=["tp0", "tp1"])
    return b.finish(list(dp) + list(tp))


def test_a_tp_allreduce_does_not_wait_for_a_dp_allreduce_of_another_group(star):
    got, trace = _records(star, tp_after_dp(), "per-group")
    assert got[(0, "dp0")].start_s == 0.0
    assert got[(0, "dp0")].end_s == pytest.approx(10.004e-3, rel=1e-12)
    assert DP_ALONE == pytest.approx(10.004e-3, rel=1e-12)
    # the TP all-reduce starts at 0 on rank 0, beside the DP one
    assert got[(0, "tp0")].start_s == got[(1, "tp0")].start_s == 0.0
    assert got[(0, "tp0")].end_s == pytest.approx(1.004e-3, rel=1e-12)
    assert TP_ALONE == pytest.approx(1.004e-3, rel=1e-12)
    assert trace.step_time_s == pytest.approx(10.004e-3, rel=1e-12)
    # each on the stream of its group: 2 ranks 2 apart, 2 adjacent ranks
    assert got[(0, "dp0")].stream == got[(2, "dp0")].stream == "comm-2x2"
    assert got[(0, "tp0")].stream == got[(1, "tp0")].stream == "comm-2x1"


def test_on_one_shared_stream_the_tp_allreduce_waits_for_the_dp_one(star):
    got, trace = _records(star, tp_after_dp(), "shared")
    assert got[(0, "tp0")].start_s == pytest.approx(10.004e-3, rel=1e-12)
    assert got[(0, "tp0")].end_s == pytest.approx(10.004e-3 + 1.004e-3, rel=1e-12)
    # rank 1 reaches it at 0 but the collective starts with its last member
    assert got[(1, "tp0")].start_s == got[(0, "tp0")].start_s
    assert {r.stream for r in trace.ops} == {"comm"}


def test_groups_share_the_links_of_their_common_rank(star):
    # flow network: both rings cross rank 0's links (gpu0 <-> switch) at
    # once, each at B/2 while both send. TP: 2 steps of 2 us + 0.5e8 / 50e9.
    # DP: its first step's flow starts at 2 us and the link is never idle
    # until it ends (during TP's 2 us between steps DP has it alone), so it
    # carries DP's 5e8 and TP's 1e8 bytes: ends at 2 us + 6e8 / B; its
    # second step alone: 2 us + 5e8 / B.
    got, trace = _records(star, tp_after_dp(), "per-group", network="flow")
    assert got[(0, "tp0")].start_s == 0.0
    assert got[(0, "tp0")].end_s == pytest.approx(2 * (2e-6 + 0.5e8 / 50e9), rel=1e-9)
    assert got[(0, "dp0")].end_s == pytest.approx((2e-6 + 6e8 / B) + (2e-6 + 5e8 / B),
                                                  rel=1e-9)
    assert trace.step_time_s == pytest.approx(11.004e-3, rel=1e-9)


def test_two_collectives_of_one_group_still_queue_in_program_order(star):
    # two DP all-reduces of rank 0 and rank 2 and a TP one between them in
    # program order: the second DP one starts when the first ends (one
    # communicator runs its collectives one after another), the TP one at 0
    b = FunctionBuilder("two-dp")
    g = [b.input(f"g{r}", TensorType((int(S_DP) // 2,), F16, r)) for r in (0, 2)]
    h = [b.input(f"h{r}", TensorType((int(S_TP) // 2,), F16, r)) for r in (0, 2)]
    x = [b.input(f"x{r}", TensorType((int(S_TP) // 2,), F16, r)) for r in (0, 1)]
    first = b.op("comm.allreduce", g, {"ranks": (0, 2), "algorithm": "ring"}, name=["a0", "a2"])
    tp = b.op("comm.allreduce", x, {"ranks": (0, 1), "algorithm": "ring"}, name=["tp0", "tp1"])
    second = b.op("comm.allreduce", h[::-1], {"ranks": (2, 0), "algorithm": "ring"},
                  name=["b0", "b2"])
    got, trace = _records(star, b.finish(list(first) + list(tp) + list(second)), "per-group")
    assert got[(0, "tp0")].start_s == 0.0
    assert got[(0, "b0")].start_s == got[(2, "b0")].start_s == pytest.approx(10.004e-3,
                                                                               rel=1e-12)
    assert got[(0, "b0")].end_s == pytest.approx(10.004e-3 + 1.004e-3, rel=1e-12)
    # the team (2, 0) is the group of (0, 2): one stream
    assert got[(0, "b0")].stream == got[(0, "a0")].stream == "comm-2x2"


def test_group_stream_names():
    assert group_stream((0, 1, 2, 3, 4, 5, 6, 7)) == "comm-8x1"
    assert group_stream((56, 0, 8, 16, 24, 32, 40, 48)) == "comm-8x8"
    assert group_stream((8, 9, 11)) == "comm-0+1+3"
    # a rank in two groups of one shape: the second is named by its ranks
    program = FunctionBuilder("p")
    xs = {r: program.input(f"x{r}", TensorType((4,), F16, r)) for r in (0, 1, 2)}
    a = program.op("comm.allreduce", [xs[0], xs[1]], {"ranks": (0, 1)})
    c = program.op("comm.allreduce", [xs[1], xs[2]], {"ranks": (1, 2)})
    f = program.finish(list(a) + list(c))
    kinds = np.array([0, 1, 0])     # rank 1's collectives: (0, 1), (1, 2), (0, 1)
    assert comm_queues(1, kinds, f.ops, "per-group") == [("comm-2x1", [0, 2]),
                                                          ("comm-1,2", [1])]
    assert comm_queues(1, kinds, f.ops, "shared") == [("comm", None)]


def test_a_bad_setting_is_one_clear_error(star):
    with pytest.raises(ConfigError, match="--comm-streams: must be 'per-group' or 'shared'"):
        _records(star, tp_after_dp(), "per-team")


@pytest.mark.parametrize("mode", ["per-group", "shared"])
def test_symmetry_gives_the_full_runs_records_under_either_setting(mode):
    # a representative's records copied to its peers name the peers'
    # streams too: a group's stream is named for its shape
    from distsim.api import build_program
    program, _, topo = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, microbatches=4,
                                     global_batch=8, bucket_mb=0.001)
    runs = [simulate_function(program, topo, options=SimulationOptions(
        network_mode="analytical", comm_streams=mode, symmetry=symmetry))
        for symmetry in (False, True)]
    # (the copies keep the representative's op names)
    key = lambda r: (r.rank, r.stream, r.op_type, r.start_s, r.end_s)  # noqa: E731
    full, reduced = (sorted(t.ops, key=key) for t in runs)
    assert [key(r)[:3] for r in full] == [key(r)[:3] for r in reduced]
    assert [r.end_s for r in reduced] == pytest.approx([r.end_s for r in full], rel=1e-12)
    assert runs[1].step_time_s == pytest.approx(runs[0].step_time_s, rel=1e-12)
    streams = {r.stream for r in full if r.category == "communication"}
    # tp-dp-pp order: TP groups adjacent, DP 2 apart, the tied embedding's
    # all-reduce between the first and last stage 4 apart
    assert streams == ({"comm-2x1", "comm-2x2", "comm-2x4", "p2p"} if mode == "per-group"
                       else {"comm", "p2p"})


def test_a_deadlock_report_names_the_groups_stream(star):
    # rank 1's operand of the first all-reduce is made from the result of
    # the second, of the same group: its stream waits in the first, which
    # rank 1 never reaches (the same program deadlocks on one shared stream)
    from distsim.errors import SimulationError
    from distsim.ir import Function, Op, Value
    a0, a1 = Value("a0", TensorType((4,), F16, 0)), Value("a1", TensorType((4,), F16, 1))
    o0, o1 = Value("o0", TensorType((4,), F16, 0)), Value("o1", TensorType((4,), F16, 1))
    p1 = Value("p1", TensorType((4,), F16, 1))
    q0, q1 = Value("q0", TensorType((4,), F16, 0)), Value("q1", TensorType((4,), F16, 1))
    ops = [Op("comm.allreduce", [a0, p1], [o0, o1], {"ranks": (0, 1), "reduce_op": "sum"}),
           Op("relu", [q1], [p1]),
           Op("comm.allreduce", [a0, a1], [q0, q1], {"ranks": (0, 1), "reduce_op": "sum"})]
    with pytest.raises(SimulationError) as info:
        _records(star, Function("deadlock", [a0, a1], ops, [o0, o1]), "per-group")
    assert "device 0 comm-2x1: %o0 (comm.allreduce)" in str(info.value)
