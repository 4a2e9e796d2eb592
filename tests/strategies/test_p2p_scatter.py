"""``p2p_scatter``: a pipeline transfer of a value every tensor-parallel
rank holds whole sent as 1/tp from each rank and all-gathered on the
receiving stage (Megatron-LM's scatter/gather of pipeline tensors). The
same numbers as one device (the reference executor), the pieces' bytes,
which values split, and by hand the time it saves."""
import pytest

import distsim
from distsim.topology import topology_from_dict
from distsim.errors import ConfigError
from distsim.ir.comm import CollectiveType
from distsim.models.gpt import GPTConfig
from distsim.models.gpt_family import build_gpt_step
from distsim.transforms.fusion import Fuse
from distsim.transforms.pipeline_split import split_axis, splits, tp_uniform
from distsim.transforms.spmd import LowerSPMD
from distsim.transforms.strategy import Strategy, fusion_for

from gpt_reference import TINY

US = 1e-6
B = 100e9


def _pipeline_ops(program, kind):
    return [op for op in program.ops if op.op_type == kind.op_type
            and op.meta.get("role") == "pipeline"]


@pytest.mark.parametrize("strategy", [
    dict(tp=2, pp=2), dict(tp=2, pp=2, dp=2, zero=1, recompute="full"),
    dict(tp=2, pp=2, schedule="interleaved", virtual_stages=2, microbatches=4),
    dict(tp=2, pp=2, coarsen=True), dict(tp=2, pp=2, sp=True),
    dict(tp=2, pp=2, schedule="zb-h1", microbatches=4)])
def test_scattered_transfers_give_the_single_device_numbers(reference, strategy):
    reference.check(p2p_scatter=True, **strategy)


def test_each_rank_sends_its_piece_and_the_stage_gathers_it(reference):
    whole = reference.lower(tp=2, pp=2, p2p_scatter=False)
    split = reference.lower(tp=2, pp=2, p2p_scatter=True)
    sends = _pipeline_ops(whole, CollectiveType.SEND_RECV)
    pieces = _pipeline_ops(split, CollectiveType.SEND_RECV)
    assert len(pieces) == len(sends) > 0
    # every transfer carries half the bytes it carried whole
    assert sorted(2 * op.inputs[0].type.size_bytes for op in pieces) == \
        sorted(op.inputs[0].type.size_bytes for op in sends)
    gathers = _pipeline_ops(split, CollectiveType.ALL_GATHER)
    # one gather per value, micro-batch and receiving tensor-parallel group
    assert len(gathers) == len(sends) // 2
    for op in gathers:
        assert len(op.attrs["ranks"]) == 2
    assert not _pipeline_ops(whole, CollectiveType.ALL_GATHER)


def test_the_gather_comes_before_the_task_that_reads_the_value(reference):
    program = reference.lower(tp=2, pp=2, p2p_scatter=True)
    rank = Strategy(dp=1, tp=2, pp=2).rank(0, 1, 0)   # the second stage's first rank
    mine = [op for op in program.ops if op.outputs and op.outputs[0].type.device == rank]
    for i, op in enumerate(mine):
        if op.op_type == CollectiveType.ALL_GATHER.op_type and op.meta.get("role") == "pipeline":
            gathered = op.outputs[0]
            first_reader = next(j for j, o in enumerate(mine) if gathered in o.inputs)
            assert first_reader > i
            # nothing of the reading task runs before its gather
            task = (op.meta["microbatch"], op.meta["chunk"], op.meta["detail"])
            earlier = [o for o in mine[:i] if o.meta.get("microbatch") == task[0]
                       and o.meta.get("chunk") == task[1] and not o.meta.get("role")
                       and ("phase" in o.meta) == (task[2] == "backward")]
            assert not earlier


def _template(sp):
    c = GPTConfig(**TINY)
    S = Strategy(dp=1, tp=2, pp=2, sp=sp)
    step = Fuse(fusion_for(S))(build_gpt_step(c, S, c.micro_batch))
    probe = LowerSPMD(S, 2)
    probe._analyse(step)
    return step, probe


def test_the_residual_stream_splits_and_its_sequence_parallel_shard_does_not():
    step, probe = _template(sp=False)
    assert probe.crossing and set(splits(step, probe.crossing, 2)) == set(probe.crossing)
    step, probe = _template(sp=True)
    assert probe.crossing and not splits(step, probe.crossing, 2)


def test_a_tensor_parallel_shard_is_not_uniform():
    step, _ = _template(sp=False)
    uniform = tp_uniform(step)
    shards = step.meta["param_shards"]
    assert shards
    for v in step.inputs:
        assert (v in uniform) == (v.name not in shards)
    # a column-parallel matmul's result is each rank's own columns
    wqkv = next(v for v in step.inputs if v.name == "l0_wqkv")
    made = [o for op in step.ops if wqkv in op.inputs for o in op.outputs]
    assert made and not any(v in uniform for v in made)


def test_the_split_axis_is_the_first_one_tp_divides():
    step, probe = _template(sp=False)
    v = next(iter(probe.crossing))
    assert v.type.shape == (2, 8, 16)
    assert split_axis(v, 2) == 0
    assert split_axis(v, 4) == 1
    assert split_axis(v, 3) is None
    assert splits(step, probe.crossing, 3) == {}


def test_p2p_scatter_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"--p2p-scatter: must be true or false"):
        Strategy(tp=2, p2p_scatter="yes")


def test_no_effect_without_tensor_parallelism():
    a = distsim.simulate("tiny", "dgx-a100", pp=2, dp=4, microbatches=2)
    b = distsim.simulate("tiny", "dgx-a100", pp=2, dp=4, microbatches=2, p2p_scatter=True)
    assert a.step_time_s == b.step_time_s


def _toy_star():
    """Four devices on a star, 100 GB/s a link each way and 1 us a hop: a
    point-to-point transfer of S bytes takes 2 us + S/B, a two-rank ring
    all-gather of S bytes (its result) 2 us + (S/2)/B."""
    device = {"name": "toy", "peak_flops": {"f16": 1e12, "f32": 1e12},
              "memory_bandwidth_Bps": 1e12, "memory_bytes": 1e10}
    return topology_from_dict({"device": device, "builder": "star", "params": {
        "devices": 4, "link_GBps": 100, "latency_us": 1}}, "star.yaml")


@pytest.mark.parametrize("scatter", [False, True])
def test_the_transfers_and_gathers_take_their_bytes_time(scatter):
    r = distsim.simulate("tiny", _toy_star(), tp=2, pp=2, dp=1, microbatches=2, dtype="f16",
                         network_mode="analytical", p2p_scatter=scatter)
    ops = {op.outputs[0].name: op for op in r.program.ops
           if op.meta.get("role") == "pipeline" and op.op_type.startswith("comm.")}
    whole = 4 * 16 * 32 * 2      # (micro-batch 8 / 2, seq 16, hidden 32) in f16
    timed = set()
    for rec in r.trace.ops:
        op = ops.get(rec.name)
        if op is None:
            continue
        timed.add(id(op))
        nbytes = op.inputs[0].type.size_bytes
        if op.op_type == "comm.sendrecv":
            assert nbytes == (whole // 2 if scatter else whole)
            expected = 2 * US + nbytes / B
        else:
            assert op.op_type == "comm.allgather" and scatter
            assert op.outputs[0].type.size_bytes == whole
            expected = 2 * US + (whole / 2) / B
        assert rec.end_s - rec.start_s == pytest.approx(expected, rel=1e-9)
    # 2 micro-batches, each sending its activation forward and its gradient
    # back from both tensor-parallel ranks: 8 transfers; split, the two
    # pieces of each gathered by one all-gather: 4 more
    assert len(timed) == len(ops) == (12 if scatter else 8)
