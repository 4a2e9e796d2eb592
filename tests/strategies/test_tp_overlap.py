"""``tp_overlap``: where the backward's tensor-parallel collective of a
layer's input gradient is issued, before the weight-gradient GEMM (True,
Megatron-LM's async all-reduce) or after it (False, Megatron-LM v2).
The same numbers either way (the reference executor), the order as said,
and by hand the time it makes under stream order."""
import pytest

import distsim
from distsim.errors import ConfigError
from distsim.transforms.strategy import Strategy


def _backward_order(program, rank=0):
    """For rank ``rank``: the names of its backward TP collectives and the
    weight-gradient matmuls (``d_l<i>_w1``, ``d_l<i>_wqkv``, ...) in program
    order, micro-batch 0."""
    names = []
    for op in program.ops:
        if not op.outputs or op.outputs[0].type.device != rank:
            continue
        name = op.outputs[0].name
        if name.startswith("d_") and "_m0_" in name and (
                op.op_type.startswith("comm.") or op.op_type == "matmul"):
            names.append(name.rsplit("_m0_", 1)[0])
    return names


@pytest.mark.parametrize("strategy", [dict(tp=2), dict(tp=2, sp=True), dict(tp=2, pp=2),
                                      dict(tp=2, dp=2, zero=1, recompute="full")])
@pytest.mark.parametrize("overlap", [True, False])
def test_either_order_gives_the_single_device_numbers(reference, strategy, overlap):
    reference.check(tp_overlap=overlap, **strategy)


def test_async_order_issues_the_input_gradient_collective_before_the_weight_gradient(
        reference):
    on = _backward_order(reference.lower(tp=2, tp_overlap=True))
    off = _backward_order(reference.lower(tp=2, tp_overlap=False))
    assert sorted(on) == sorted(off)
    for layer in range(reference.config.layers):
        d = f"d_l{layer}"
        # fc1 (column-parallel): dX, its all-reduce, then dW; and the reverse
        assert on.index(f"{d}_ln2_out_tp") < on.index(f"{d}_ln2_out") < on.index(f"{d}_w1")
        assert off.index(f"{d}_ln2_out_tp") < off.index(f"{d}_w1") < off.index(f"{d}_ln2_out")
        assert on.index(f"{d}_ln1_out") < on.index(f"{d}_wqkv")
        assert off.index(f"{d}_wqkv") < off.index(f"{d}_ln1_out")


def test_sequence_parallel_reduce_scatter_moves_the_same_way(reference):
    program = reference.lower(tp=2, sp=True, tp_overlap=True)
    order = _backward_order(program)
    kinds = {op.outputs[0].name.rsplit("_m0_", 1)[0]: op.op_type for op in program.ops
             if op.outputs and "_m0_" in op.outputs[0].name}
    assert kinds["d_l0_ln2_out"] == "comm.reducescatter"
    assert order.index("d_l0_ln2_out") < order.index("d_l0_w1")


def test_tp_overlap_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"--tp-overlap: must be true or false"):
        Strategy(tp=2, tp_overlap="yes")


def _step(tp_overlap, comm_order):
    return distsim.simulate(model="tiny", topology="workstation-4gpu-pcie", tp=4, layers=1,
                            network_mode="analytical", tp_overlap=tp_overlap,
                            comm_order=comm_order)


def test_the_order_shows_in_time_only_under_stream_order():
    # by inputs alone a collective starts when its input is ready: the
    # order changes nothing
    assert _step(True, "inputs").step_time_s == _step(False, "inputs").step_time_s
    # under stream order the 2021 order holds each backward all-reduce
    # behind its layer's weight-gradient GEMM (w: from dX's end to its
    # start), which the async order ran beside it: the step grows, by at
    # most min(AR, w) per all-reduce (the op that reads it started at
    # dX end + max(AR, w), now at most dX end + w + AR); the exact times
    # by hand are tests/sim/test_stream_order.py's
    on, off = _step(True, "stream"), _step(False, "stream")
    assert on.step_time_s == pytest.approx(_step(True, "inputs").step_time_s, rel=1e-12)
    rank0 = [r for r in off.trace.ops if r.rank == 0]
    by_name = {r.name: r for r in rank0}
    most = 0.0
    for r in rank0:
        if r.op_type == "comm.allreduce" and r.name.startswith("d_") and r.name.endswith("_r0"):
            stem = r.name.rsplit("_m", 1)[0]           # d_l0_ln2_out
            dx = by_name[r.name.replace(stem, stem + "_tp")]
            assert r.start_s > dx.end_s               # held behind the dW GEMM
            most += min(r.end_s - r.start_s, r.start_s - dx.end_s)
    assert on.step_time_s < off.step_time_s <= on.step_time_s + most * (1 + 1e-9)


def test_the_estimator_follows_the_order():
    # its template is lowered in the same order (tests/estimate/
    # test_estimate_tp_overlap.py for pipelines and sequence parallelism)
    from distsim.estimate import AGREEMENT_TOLERANCE, estimate
    for overlap in (True, False):
        row = estimate({"model": "tiny", "topology": "workstation-4gpu-pcie", "tp": 4,
                        "layers": 1, "network_mode": "analytical", "tp_overlap": overlap,
                        "comm_order": "stream"})
        assert row["step_time_s"] == pytest.approx(_step(overlap, "stream").step_time_s,
                                                   rel=AGREEMENT_TOLERANCE)
