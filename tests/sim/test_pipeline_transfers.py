"""Pipeline transfers under stream order (``comm_order: stream``).

Megatron-LM's 1F1B (``schedules.py``, non-interleaved) and PyTorch's
``Schedule1F1B`` post a stage's receive with its sends right after the
stage's previous task (``send_forward_recv_backward`` after a forward,
``send_backward_recv_forward`` after a backward; in the warm-up
``recv_forward`` after the previous forward), in one ``batch_isend_irecv``
(one NCCL group), and ProcessGroupNCCL makes the NCCL stream wait for the
compute issued before it. So a transfer starts no earlier than the compute
both its sender and its receiver issued before it: a receiver still busy
with its previous task holds the transfer up. That is why a deep pipeline
whose transfers are long (InfiniBand between servers) is slower in stream
order than by inputs alone.

Times by hand on the toy star of ``test_blocking_launch`` (an add 1 ms,
100 MB point to point SEND = 1.002 ms, analytical network)."""
import pytest
from test_blocking_launch import MS, SEND, run

from distsim.ir import DType, FunctionBuilder, TensorType

F16 = DType.F16
N = int(5e7)                     # 100 MB of f16: one transfer takes SEND


def two_stage_tasks(b, sent0: int = N, in1: int = N):
    """Stage 0's task (an add, 1 ms) of ``sent0`` f16 values and stage 1's
    (two adds, 2 ms) of ``in1``: their outputs ``(f0, b1)``."""
    x = b.input("x", TensorType((sent0,), F16, 0))
    y = b.input("y", TensorType((in1,), F16, 1))
    f0 = b.op("add", [x, x], name="f0")
    p1 = b.op("add", [y, y], name="p1")
    return f0, b.op("add", [p1, p1], name="b1")


def receiver_busy_before_its_receive():
    """Stage 0: its forward f0 (an add, 1 ms), sent to stage 1. Stage 1:
    its previous task (two adds, 2 ms) issued before the receive, then the
    forward reading what it received (an add, 1 ms)."""
    b = FunctionBuilder("recv_late")
    f0, q1 = two_stage_tasks(b, in1=100)
    t = b.op("comm.sendrecv", [f0], {"ranks": (0, 1)}, name="t")
    c1 = b.op("add", [t, t], name="c1")
    return b.finish([c1, q1])


def test_the_transfer_waits_for_the_compute_its_receiver_issued_before_it():
    # stream order: from the end of stage 1's previous task (2 ms), not of
    # the forward that made it (1 ms); its consumer 3.002 - 4.002 ms
    got, trace = run(receiver_busy_before_its_receive(), "async", comm_order="stream")
    for r in (0, 1):
        assert got[(r, "t")].start_s == pytest.approx(2 * MS, rel=1e-12)
        assert got[(r, "t")].end_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert got[(1, "c1")].start_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)      # 4.002 ms
    # by inputs it moves while stage 1 computes (1 - 2.002 ms): 1 ms earlier
    got, trace = run(receiver_busy_before_its_receive(), "async", comm_order="inputs")
    assert got[(0, "t")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(2 * MS + SEND, rel=1e-12)      # 3.002 ms


def exchange_of_a_1f1b_step():
    """One steady 1F1B exchange between two stages: stage 0 ends a forward
    (an add, 1 ms), stage 1 a backward (two adds, 2 ms); then the
    activation goes 0 -> 1 and the gradient 1 -> 0, issued one after the
    other (one ``batch_isend_irecv`` each side), and each stage's next task
    (an add) reads what it received."""
    b = FunctionBuilder("exchange")
    f0, b1 = two_stage_tasks(b)
    act = b.op("comm.sendrecv", [f0], {"ranks": (0, 1)}, name="act")
    grad = b.op("comm.sendrecv", [b1], {"ranks": (1, 0)}, name="grad")
    c0 = b.op("add", [grad, grad], name="c0")
    c1 = b.op("add", [act, act], name="c1")
    return b.finish([c0, c1])


def test_the_two_ways_of_an_exchange_move_at_once():
    # both from 2 ms (stage 1's backward), side by side on the two
    # directions' queues (NCCL's sendrecv): both end at 3.002 ms, each
    # stage's next task 3.002 - 4.002 ms (one after the other: 5.004 ms)
    got, trace = run(exchange_of_a_1f1b_step(), "async", comm_order="stream")
    for name in ("act", "grad"):
        assert got[(0, name)].start_s == pytest.approx(2 * MS, rel=1e-12)
        assert got[(0, name)].end_s == pytest.approx(2 * MS + SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)      # 4.002 ms
    # by inputs the activation moves from 1 ms, the gradient from 2 ms
    got, trace = run(exchange_of_a_1f1b_step(), "async", comm_order="inputs")
    assert got[(0, "act")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert got[(0, "grad")].start_s == pytest.approx(2 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + SEND, rel=1e-12)


def test_transfers_the_same_way_still_queue_in_program_order():
    # two 100 MB sends 0 -> 1, both ready at 0: NCCL runs calls to one
    # peer in order, so the second starts when the first ends
    b = FunctionBuilder("same_way")
    x = [b.input(f"x{i}", TensorType((N,), F16, 0)) for i in (0, 1)]
    t = [b.op("comm.sendrecv", [x[i]], {"ranks": (0, 1)}, name=f"t{i}") for i in (0, 1)]
    got, trace = run(b.finish(t), "async", comm_order="stream")
    assert got[(1, "t0")].start_s == 0.0
    assert got[(1, "t1")].start_s == pytest.approx(SEND, rel=1e-12)
    assert trace.step_time_s == pytest.approx(2 * SEND, rel=1e-12)
