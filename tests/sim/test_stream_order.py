"""Stream order (``comm_order: stream``): a communication op starts no
earlier than the end of the compute op issued before it on its device, as
PyTorch's ProcessGroupNCCL makes the NCCL stream wait on the compute
stream; compute after it waits only for what it reads. Times by hand on
the toy star of ``test_blocking_launch`` (an add 1 ms, a matmul 1 ms, a
2-rank ring all-reduce of S bytes 4.004 ms, analytical network)."""
import pytest
from test_blocking_launch import ALLREDUCE, MS, SEND, S, compute_collective_compute, run

from distsim.errors import ConfigError
from distsim.ir import DType, FunctionBuilder, TensorType

F16 = DType.F16


def unrelated_op_before():
    """Rank 0: an add of w (1 ms) that the all-reduce does not read, then
    the all-reduce of x (ready at 0) over ranks 0 and 1."""
    b = FunctionBuilder("late")
    x = [b.input(f"x{r}", TensorType((int(S) // 2,), F16, r)) for r in (0, 1)]
    w = b.input("w", TensorType((100,), F16, 0))
    m = b.op("add", [w, w], name="m")
    s = b.op("comm.allreduce", x, {"ranks": (0, 1), "algorithm": "ring"}, name=["s0", "s1"])
    return b.finish([m] + list(s))


def test_a_compute_op_issued_before_a_collective_delays_it_by_its_duration():
    got, trace = run(unrelated_op_before(), "async", comm_order="inputs")
    assert got[(1, "s0")].start_s == 0.0                  # inputs: it starts at once
    assert trace.step_time_s == pytest.approx(ALLREDUCE, rel=1e-12)
    got, trace = run(unrelated_op_before(), "async", comm_order="stream")
    for r in (0, 1):                                      # rank 0's add ends at 1 ms
        assert got[(r, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(1 * MS + ALLREDUCE, rel=1e-12)   # 5.004 ms


def test_compute_issued_after_a_collective_still_overlaps_it():
    # g (1 ms), all-reduce of g, y (1 ms, not reading it): the all-reduce
    # waits for g as before, y runs beside it; the same as inputs here
    for order in ("inputs", "stream"):
        got, trace = run(compute_collective_compute(), "async", comm_order=order)
        assert got[(0, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
        assert got[(0, "y0")].start_s == pytest.approx(1 * MS, rel=1e-12)
        assert trace.step_time_s == pytest.approx(1 * MS + ALLREDUCE, rel=1e-12)


def weight_gradient_around(before: bool):
    """A layer's backward on ranks 0 and 1: dX = matmul (1 ms), dW =
    matmul (1 ms, not read by the all-reduce), the all-reduce of dX issued
    before dW (``before``) or after it, then an add reading the result."""
    b = FunctionBuilder("tp")
    g = [b.input(f"g{r}", TensorType((int(S) // 4, 2), F16, r)) for r in (0, 1)]
    w = [b.input(f"w{r}", TensorType((2, 2), F16, r)) for r in (0, 1)]
    dx = [b.op("matmul", [g[r], w[r]], name=f"dx{r}") for r in (0, 1)]

    def dw():
        return [b.op("matmul", [w[r], w[r]], name=f"dw{r}") for r in (0, 1)]

    dws = dw() if not before else None
    s = b.op("comm.allreduce", dx, {"ranks": (0, 1), "algorithm": "ring"}, name=["s0", "s1"])
    if before:
        dws = dw()
    y = [b.op("add", [s[r], s[r]], name=f"y{r}") for r in (0, 1)]
    return b.finish(y + dws)


def test_the_all_reduce_issued_before_the_weight_gradient_overlaps_it():
    # issued before dW: it starts when dX ends (1 ms), dW runs beside it;
    # the add waits for it: 1 + 4.004 + 1 ms
    got, trace = run(weight_gradient_around(before=True), "async", comm_order="stream")
    assert got[(0, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert got[(0, "dw0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(2 * MS + ALLREDUCE, rel=1e-12)


def test_the_all_reduce_issued_after_the_weight_gradient_waits_for_it():
    # issued after dW: stream order starts it at 2 ms, so the step is
    # 1 ms longer (6.004 + 1 ms); by inputs alone it would start at 1 ms
    got, trace = run(weight_gradient_around(before=False), "async", comm_order="stream")
    assert got[(0, "s0")].start_s == pytest.approx(2 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(3 * MS + ALLREDUCE, rel=1e-12)
    got, trace = run(weight_gradient_around(before=False), "async", comm_order="inputs")
    assert got[(0, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(2 * MS + ALLREDUCE, rel=1e-12)


def test_consecutive_collectives_wait_for_the_same_compute_op_not_for_each_other():
    # add (1 ms) on rank 0, then two sends of 100 MB to different peers,
    # each on its own queue: both start at 1 ms and end at 1 ms + SEND
    b = FunctionBuilder("two")
    w = b.input("w", TensorType((100,), F16, 0))
    x = [b.input(f"x{r}", TensorType((int(5e7),), F16, 0)) for r in (1, 2)]
    m = b.op("add", [w, w], name="m")
    outs = [b.op("comm.sendrecv", [x[i]], {"ranks": (0, r)}, name=f"t{r}")
            for i, r in enumerate((1, 2))]
    got, trace = run(b.finish([m] + outs), "async", devices=3, comm_order="stream")
    for r in (1, 2):
        assert got[(0, f"t{r}")].start_s == pytest.approx(1 * MS, rel=1e-12)
    assert trace.step_time_s == pytest.approx(1 * MS + SEND, rel=1e-12)


def test_blocking_launches_are_stream_ordered_whatever_comm_order_says():
    for order in ("inputs", "stream"):
        got, trace = run(unrelated_op_before(), "blocking", comm_order=order)
        assert got[(1, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
        assert trace.step_time_s == pytest.approx(1 * MS + ALLREDUCE, rel=1e-12)


def test_a_bad_comm_order_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"--comm-order: must be 'inputs' or 'stream'"):
        run(unrelated_op_before(), "async", comm_order="fifo")


def test_the_estimator_takes_stream_order():
    """(Its agreement: tests/estimate/test_engine_stream_order.py and the
    agreement corpus.)"""
    from distsim.estimate import estimate
    o = {"model": "tiny", "tp": 2, "dp": 4}
    assert estimate({**o, "comm_order": "stream"})["step_time_s"] >= \
        estimate({**o, "comm_order": "inputs"})["step_time_s"]


def test_stream_order_is_the_default():
    got, trace = run(unrelated_op_before(), "async")
    assert got[(1, "s0")].start_s == pytest.approx(1 * MS, rel=1e-12)
