"""ZeRO-3 / FSDP prefetch: the all-gather of layer L+1's parameters runs
while layer L computes (``prefetch=1``, the default), so the gathers of
the transformer layers hide behind compute; without prefetch
(``prefetch=0``) each layer's gathers start when the layer does and the
compute waits for them."""
import pytest

import distsim
from distsim.intervals import difference_length, merge_intervals, total_length

CASE = dict(model="gpt3-1.3b", topology="dgx-a100", dp=8, layers=4, global_batch=8, zero=3,
            network_mode="analytical")


def layer_gathers(result, rank=0):
    """(time, time not overlapped by compute) of the transformer layers'
    parameter all-gathers on ``rank`` (names ``l<i>_..._full_...``)."""
    ops = [o for o in result.trace.ops if o.rank == rank]
    compute = merge_intervals((o.start_s, o.end_s) for o in ops if o.category == "compute")
    gathers = [(o.start_s, o.end_s) for o in ops
               if o.op_type == "comm.allgather" and o.name.startswith("l") and "_full_" in o.name]
    assert gathers
    return total_length(merge_intervals(gathers)), difference_length(gathers, compute)


@pytest.fixture(scope="module")
def runs():
    return {p: distsim.simulate(**CASE, prefetch=p) for p in (0, 1)}


def test_prefetch_hides_the_layer_gathers(runs):
    total, exposed = layer_gathers(runs[1])
    assert exposed <= 0.02 * total            # all but the rounding hidden
    total0, exposed0 = layer_gathers(runs[0])
    assert total0 == pytest.approx(total)     # the same gathers, only issued earlier
    assert exposed0 >= 0.1 * total0           # the compute waits for part of each


def exposed_reduce_scatters(result, rank=0):
    """Time of ``rank``'s reduce-scatters not overlapped by compute."""
    ops = [o for o in result.trace.ops if o.rank == rank]
    compute = merge_intervals((o.start_s, o.end_s) for o in ops if o.category == "compute")
    return difference_length([(o.start_s, o.end_s) for o in ops
                              if o.op_type == "comm.reducescatter"], compute)


def test_prefetch_shrinks_exposed_communication_and_the_step(runs):
    s0, s1 = runs[0].summary(), runs[1].summary()
    saved = layer_gathers(runs[0])[1] - layer_gathers(runs[1])[1]
    assert s1["exposed_communication_s"] < s0["exposed_communication_s"]
    # what prefetch hides on rank 0 comes off its exposed communication: the
    # layer gathers', and the gradients' reduce-scatters' (each paying NCCL's
    # per-collective latency, they end behind a backward that no longer
    # waits for gathers, so more of them hide behind it)
    saved += exposed_reduce_scatters(runs[0]) - exposed_reduce_scatters(runs[1])
    exposed = {p: runs[p].summary()["devices"][0]["exposed_communication_s"] for p in (0, 1)}
    assert exposed[0] - exposed[1] == pytest.approx(saved, rel=0.05)
    assert s1["step_time_s"] < s0["step_time_s"]


def test_prefetched_gathers_precede_the_layer_before_in_program_order():
    """Program order is what the communication stream follows: layer 2's
    forward gathers are emitted before layer 1's first forward compute op."""
    program, _, _ = distsim.build_program(**{k: v for k, v in CASE.items()
                                             if k != "network_mode"}, prefetch=1)
    ops = program.ops
    first_l1 = next(i for i, op in enumerate(ops) if op.meta.get("layer") == 1
                    and op.op_type == "matmul" and "phase" not in op.meta)
    gathers_l2 = [i for i, op in enumerate(ops) if op.op_type == "comm.allgather"
                  and op.meta.get("layer") == 2]
    assert gathers_l2 and min(gathers_l2) < first_l1


def test_a_backward_gathers_when_its_gradient_arrives_from_the_next_stage():
    """With pipeline stages, a backward task's first gathers are gated on
    its start: the gradient it receives from the next stage, as the
    estimator (estimate/timeline) times them. Gated only on the
    compute before, they would run right after the stage's forward and
    hold the gathered parameters through the next stage's work. (A shared
    comm stream used to give this gate by accident: the receive sat there
    before the gathers; pipeline transfers now have queues of their own.)"""
    import re
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=4, pp=2, zero=3,
                              global_batch=16, micro_batch=2, network_mode="analytical")
    produced_by = {v.name: op for op in result.program.ops for v in op.outputs}
    ops = [o for o in result.trace.ops if o.rank == 0]          # stage 0
    grad_in = {}        # micro-batch -> when its gradient from stage 1 is on rank 0
    for o in ops:
        op = produced_by[o.name]
        if o.op_type == "comm.sendrecv" and op.meta.get("detail") == "backward":
            grad_in[op.meta["microbatch"]] = o.end_s
    assert sorted(grad_in) == [0, 1]
    starts = {}         # (parameter, micro-batch) -> its gathers' starts: forward, backward
    for o in ops:
        m = re.match(r"^(l\d+_.*)_full_m(\d+)_r0(\.\d+)?$", o.name)
        if o.op_type == "comm.allgather" and m:
            starts.setdefault((m.group(1), int(m.group(2))), []).append(o.start_s)
    backward = [(mb, max(s)) for (_, mb), s in starts.items() if len(s) == 2]
    assert len(backward) > 10
    for mb, start in backward:
        assert start >= grad_in[mb]
