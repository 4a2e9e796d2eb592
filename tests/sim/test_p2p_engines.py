"""How the training engine issues its pipeline transfers (``p2p``,
:mod:`distsim.sim.launch_queue`, *Pipeline transfers*).

* ``async``: a group of transfers, and compute issued after a send runs
  while it is in flight (Megatron-core with ``overlap_p2p_comm``);
* ``synchronous``: what a device issues after a group (compute, a
  collective) waits for every transfer of it, sends included
  (Megatron-LM's ``_communicate``: ``req.wait()`` then
  ``torch.cuda.synchronize()``);
* ``separate``: each transfer its own call (DeepSpeed's ``p2p.send`` /
  ``p2p.recv``), a group of its own: one launch each under blocking
  launches, and a device's transfers one after another.

Times by hand on the toy star of ``test_blocking_launch`` (an add 1 ms, a
100 MB point-to-point SEND = 2 us + 1 ms = 1.002 ms, analytical network),
in stream order (``comm_order: stream``, the default)."""
import pytest
from test_blocking_launch import MS, SEND, US, run
from test_pipeline_transfers import exchange_of_a_1f1b_step, two_stage_tasks

from distsim.errors import ConfigError, SimulationError
from distsim.ir import DType, FunctionBuilder, TensorType

F16 = DType.F16
N = int(5e7)                     # 100 MB of f16: one transfer takes SEND
SMALL = 2 * US + 1e6 / 100e9     # 1 MB point to point: 12 us


def send_then_compute():
    """Stage 0: its forward f0 (1 ms), sent to stage 1 (``act``), then two
    adds of its own (n0, m0: 2 ms) that read nothing sent; stage 1 reads
    the activation (c1)."""
    b = FunctionBuilder("send_then_compute")
    x = b.input("x", TensorType((N,), F16, 0))
    w = b.input("w", TensorType((100,), F16, 0))
    f0 = b.op("add", [x, x], name="f0")
    act = b.op("comm.sendrecv", [f0], {"ranks": (0, 1)}, name="act")
    n0 = b.op("add", [w, w], name="n0")
    m0 = b.op("add", [n0, n0], name="m0")
    c1 = b.op("add", [act, act], name="c1")
    return b.finish([m0, c1])


def test_async_compute_after_a_send_runs_while_it_is_in_flight():
    # act 1 - 2.002 ms; n0, m0 beside it 1 - 3 ms; c1 2.002 - 3.002 ms
    got, trace = run(send_then_compute(), "async", p2p="async")
    assert got[(0, "act")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert got[(0, "n0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert got[(0, "m0")].end_s == pytest.approx(3 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(2 * MS + SEND, rel=1e-12)     # 3.002 ms
    # the default
    assert run(send_then_compute(), "async")[1].step_time_s == trace.step_time_s


@pytest.mark.parametrize("p2p", ["synchronous", "separate"])
def test_compute_after_a_send_waits_for_it_when_the_engine_synchronises(p2p):
    # n0 from the send's end (2.002 ms), m0 to 4.002 ms
    got, trace = run(send_then_compute(), "async", p2p=p2p)
    assert got[(0, "act")].end_s == pytest.approx(1 * MS + SEND, rel=1e-12)
    assert got[(0, "n0")].start_s == pytest.approx(1 * MS + SEND, rel=1e-12)
    assert got[(0, "m0")].end_s == pytest.approx(3 * MS + SEND, rel=1e-12)
    assert got[(1, "c1")].start_s == pytest.approx(1 * MS + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)     # 4.002 ms


def relay(collective: bool = False):
    """Three stages. Rank 1 ends a task of two adds (2 ms), then receives
    1 MB from rank 0 (``t01``, its forward f0 of 1 ms) and sends 100 MB to
    rank 2 (``t12``), one group; then an add of its own (u1, reading
    nothing sent) and one reading the receive (c1); rank 2 reads the send
    (c2). ``collective``: after the group, in place of the adds, an
    all-reduce of 100 f16 values of ranks 1 and 2 (s1, s2)."""
    b = FunctionBuilder("relay")
    f0, g1 = two_stage_tasks(b, sent0=N // 100)
    w = b.input("w", TensorType((100,), F16, 1))
    t01 = b.op("comm.sendrecv", [f0], {"ranks": (0, 1)}, name="t01")
    t12 = b.op("comm.sendrecv", [g1], {"ranks": (1, 2)}, name="t12")
    if collective:
        v = [w, b.input("v2", TensorType((100,), F16, 2))]
        s = b.op("comm.allreduce", v, {"ranks": (1, 2), "algorithm": "ring"}, name=["s1", "s2"])
        return b.finish([t01, t12, *s])
    u1 = b.op("add", [w, w], name="u1")
    c1 = b.op("add", [t01, t01], name="c1")
    c2 = b.op("add", [t12, t12], name="c2")
    return b.finish([u1, c1, c2])


def test_synchronous_compute_waits_for_the_whole_group_sends_included():
    # both transfers from 2 ms (the end of rank 1's task), side by side:
    # the receive ends at 2.012 ms, the send at 3.002 ms
    got, trace = run(relay(), "async", devices=3, p2p="async")
    assert got[(1, "t01")].start_s == got[(1, "t12")].start_s == pytest.approx(2 * MS,
                                                                                 rel=1e-12)
    assert got[(1, "t01")].end_s == pytest.approx(2 * MS + SMALL, rel=1e-12)
    assert got[(1, "t12")].end_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    # async: u1 2 - 3 ms, c1 3 - 4 ms (after u1 on its stream), c2 3.002 - 4.002 ms
    assert got[(1, "u1")].start_s == pytest.approx(2 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)
    # synchronous: u1 waits for the send too, 3.002 - 4.002 ms; c1 to 5.002 ms
    got, trace = run(relay(), "async", devices=3, p2p="synchronous")
    assert got[(1, "u1")].start_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert got[(1, "c1")].end_s == pytest.approx(4 * MS + SEND, rel=1e-12)
    assert got[(2, "c2")].start_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(4 * MS + SEND, rel=1e-12)     # 5.002 ms


def test_synchronous_a_collective_after_a_group_waits_for_it_too():
    # the host waits before it issues anything: an all-reduce of rank 1's
    # own (tiny) issued after the group starts at the send's end, 3.002 ms,
    # not at 2 ms with the transfers
    program = relay(collective=True)
    got, _ = run(program, "async", devices=3, p2p="synchronous")
    assert got[(1, "s1")].start_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    got, _ = run(program, "async", devices=3, p2p="async")
    assert got[(1, "s1")].start_s == pytest.approx(2 * MS, rel=1e-12)


def test_separate_transfers_of_a_device_run_one_after_the_other():
    # the relay, async launches: the send 1 -> 2 waits for the receive
    # before it (2.012 ms), though its peer and queue differ
    got, trace = run(relay(), "async", devices=3, p2p="separate")
    assert got[(1, "t12")].start_s == pytest.approx(2 * MS + SMALL, rel=1e-12)
    assert trace.step_time_s == pytest.approx(4 * MS + SMALL + SEND, rel=1e-12)


@pytest.mark.parametrize("launch", ["async", "blocking"])
def test_separate_transfers_of_a_pair_run_one_after_the_other(launch):
    # the 1F1B exchange: the activation 0 -> 1 from 2 ms (stage 1's
    # backward) to 3.002 ms, then the gradient 1 -> 0 to 4.004 ms (each
    # its own group; under blocking launches also one launch each);
    # each stage's next task waits for both: 4.004 - 5.004 ms
    got, trace = run(exchange_of_a_1f1b_step(), launch, p2p="separate")
    assert got[(0, "act")].start_s == pytest.approx(2 * MS, rel=1e-12)
    assert got[(0, "grad")].start_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert got[(0, "grad")].end_s == pytest.approx(2 * MS + 2 * SEND, rel=1e-12)
    for r, name in ((0, "c0"), (1, "c1")):
        assert got[(r, name)].start_s == pytest.approx(2 * MS + 2 * SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + 2 * SEND, rel=1e-12)  # 5.004 ms
    # grouped (async or synchronous), the two ways move at once: 4.002 ms
    for p2p in ("async", "synchronous"):
        got, trace = run(exchange_of_a_1f1b_step(), launch, p2p=p2p)
        assert got[(0, "grad")].start_s == pytest.approx(2 * MS, rel=1e-12)
        assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)


def test_separate_transfers_are_one_launch_each_under_blocking_launches():
    # the relay under blocking launches: grouped, the two transfers run at
    # once from 2 ms; separate, the send waits for the receive's launch to
    # end (2.012 ms) and ends at 2.012 + 1.002 = 3.014 ms; u1 after it
    # 3.014 - 4.014 ms, c1 to 5.014 ms
    got, trace = run(relay(), "blocking", devices=3, p2p="async")
    assert got[(1, "t12")].start_s == pytest.approx(2 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(4 * MS + SEND, rel=1e-12)
    got, trace = run(relay(), "blocking", devices=3, p2p="separate")
    assert got[(1, "t12")].start_s == pytest.approx(2 * MS + SMALL, rel=1e-12)
    assert got[(1, "u1")].start_s == pytest.approx(2 * MS + SMALL + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(4 * MS + SMALL + SEND, rel=1e-12)


def test_comm_order_inputs_with_a_synchronous_engine():
    # the send no longer waits for stage 1 (it has nothing before it), and
    # the compute after it still waits for its end: as in stream order here
    got, trace = run(send_then_compute(), "async", comm_order="inputs", p2p="synchronous")
    assert got[(0, "n0")].start_s == pytest.approx(1 * MS + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)


def test_a_run_stopped_waiting_for_a_transfer_names_it():
    # stopped after its first events: the add after the send waits for it
    with pytest.raises(SimulationError, match=r"%n0 \(add\) waiting for the launch before "
                                              r"it to finish \(.*p2p: synchronous"):
        run(send_then_compute(), "async", p2p="synchronous", max_events=2)


def test_a_bad_p2p_setting_is_one_line():
    with pytest.raises(ConfigError, match=r"^--p2p: must be one of 'async', 'synchronous', "
                                          r"'separate', got 'blocking'$"):
        run(send_then_compute(), "async", p2p="blocking")
