"""fp32 gradient buffers (``fp32_grads``, DeepSpeed's BF16_Optimizer): each
micro-batch's bf16 gradient cast to fp32 and added into an fp32 buffer,
the data-parallel all-reduce and the optimizer on that buffer.

The costs are checked by hand on a unit device; the lowering against the
same step without the option, in the reference executor (which computes
bf16 in float32, so the casts round nothing and the two must agree bit
for bit)."""
import json
from dataclasses import replace

import numpy as np
import pytest

import distsim
from distsim.errors import ConfigError

from gpt_reference import Reference

# 1 TB/s at efficiency 0.5, 1 us per launch, FLOPs never the bound; a
# 1 GB/s link without latency between the two devices
UNIT = """name: unit-pair
device: {name: unit, peak_flops: {bf16: 1.0e+18, f32: 1.0e+18}, memory_bandwidth_Bps: 1.0e+12,
         memory_bytes: 1.0e+12, launch_overhead_s: 1.0e-6, matmul_efficiency: 1.0,
         vector_efficiency: 1.0, memory_efficiency: 0.5}
builder: star
params: {devices: 2, link_GBps: 1.0, latency_us: 0.0}
"""
# vocabulary 32 x hidden 16: the embedding's 512 elements; 7,232 parameters
MODEL = {"family": "gpt", "layers": 2, "hidden": 16, "heads": 4, "vocab": 32, "seq": 8,
         "dtype": "bf16", "global_batch": 8}
N_WTE, N_PARAMS = 32 * 16, 7232


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    topo = tmp_path_factory.mktemp("topo") / "unit.yaml"
    topo.write_text(UNIT)
    # dp 2, micro-batch 1: 4 micro-batches per rank; one all-reduce after the backward
    return {f: distsim.simulate(model=MODEL, topology=str(topo), dp=2, micro_batch=1,
                                bucket_mb=0, fp32_grads=f) for f in (False, True)}


def _ops(result, prefix):
    return [o for o in result.trace.ops if o.rank == 0 and o.name.startswith(prefix)]


def test_accumulation_cast_then_add_in_fp32_by_hand(runs):
    """4 micro-batches: each gradient cast to fp32 (read 2 + write 4 bytes
    per element), the last 3 added to the buffer (read 4 + 4, write 4);
    without the option 3 bf16 adds (2 + 2 + 2). Time = 1 us + bytes / 0.5 TB/s."""
    casts = _ops(runs[True], "wte_gcast_r0")
    adds = _ops(runs[True], "wte_gacc_r0")
    assert [o.bytes for o in casts] == [6 * N_WTE] * 4 == [3072.0] * 4
    assert [o.bytes for o in adds] == [12 * N_WTE] * 3 == [6144.0] * 3
    for o, seconds in [(casts[0], 1e-6 + 3072 / 0.5e12), (adds[0], 1e-6 + 6144 / 0.5e12)]:
        assert o.end_s - o.start_s == pytest.approx(seconds, rel=1e-9)
    assert not _ops(runs[False], "wte_gcast_r0")
    assert [o.bytes for o in _ops(runs[False], "wte_gacc_r0")] == [6 * N_WTE] * 3
    # the optimizer reads the fp32 gradient: 28 bytes per element against 26
    update = {f: _ops(runs[f], "wte_r0.master_new")[0].bytes for f in (False, True)}
    assert update == {False: 26 * N_WTE, True: 28 * N_WTE}


def test_data_parallel_allreduce_in_fp32_by_hand(runs):
    """Two ranks' ring all-reduce sends the buffer once: 7,232 x 4 bytes
    over 1 GB/s in fp32, half that in bf16."""
    for fp32, width in ((False, 2), (True, 4)):
        comm = [o for o in runs[fp32].trace.ops
                if o.rank == 0 and o.op_type == "comm.allreduce"]
        assert [o.bytes for o in comm] == [width * N_PARAMS]
        assert comm[0].end_s - comm[0].start_s == pytest.approx(width * N_PARAMS / 1e9,
                                                                rel=1e-9)


def test_grad_buffers_are_fp32(runs):
    for fp32, dtype in ((False, "bf16"), (True, "f32")):
        program = runs[fp32].program
        kinds = {v.type.dtype.value for v in program.inputs
                 if program.meta["io"][v.name]["role"] == "grad_buffer"}
        assert kinds == {dtype}


@pytest.fixture(scope="module")
def half():
    """The tiny GPT of the strategy tests in bf16 (computed in float32 by
    the reference executor), on the same numbers."""
    ref = Reference()
    out = Reference.__new__(Reference)
    out.__dict__.update(ref.__dict__)
    out.config = replace(ref.config, dtype="bf16")
    return out


@pytest.mark.parametrize("strategy", [
    dict(dp=2, microbatches=2),
    dict(dp=2, zero=1, microbatches=2),
    dict(dp=2, zero=2, microbatches=2),
    dict(dp=2, zero=3, zero3_unit="layer", microbatches=2),
    dict(dp=2, bucket_mb=0.001, microbatches=2),
    dict(tp=2, sp=True, pp=2, microbatches=2),
    # fused segments add into bundled buffers between the first and last micro-batch
    dict(pp=2, microbatches=4, coarsen=True),
    dict(dp=2, pp=2, microbatches=4, coarsen=True, schedule="interleaved"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_fp32_buffers_update_as_bf16_buffers(half, strategy):
    strategy = dict(strategy, micro_batch=half.config.global_batch
                    // (strategy.get("dp", 1) * strategy["microbatches"]))
    plain = half.lower(**strategy)
    fp32 = half.lower(**strategy, fp32_grads=True)
    assert sum(op.op_type == "cast" for op in fp32.ops) > sum(
        op.op_type == "cast" for op in plain.ops)
    _, expected = half.run(plain)
    _, updated = half.run(fp32)
    assert expected.keys() == updated.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(updated[name], value, err_msg=name)


def test_fp32_grads_never_narrows(reference):
    """Parameters already in fp32 or wider keep their buffers: no cast."""
    program = reference.check(dp=2, micro_batch=2, fp32_grads=True)
    assert not [op for op in program.ops if op.name and "_gcast_" in op.name]


def test_bad_value_is_one_clear_error():
    with pytest.raises(ConfigError, match="--fp32-grads: must be true or false"):
        distsim.build_program(model=MODEL, topology="dgx-a100", fp32_grads="yes")


def test_cli_flag_reaches_the_summary(tmp_path):
    from distsim.cli import main

    out = tmp_path / "out"
    assert main(["simulate", "--model", "tiny", "--dp", "8", "--fp32-grads", "--no-plots",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["fp32_grads"] is True


def test_the_estimator_refuses_fp32_buffers_only_with_zero_2_over_dp():
    """The fast tier models fp32 buffers (tests/estimate/
    test_estimate_fp32_grads.py) but where ZeRO 2/3 reduce-scatter them
    over dp > 1: that point is refused in one line."""
    from distsim.errors import NotModelledError
    from distsim.estimate import estimate
    options = {"model": "tiny", "topology": "workstation-4gpu-pcie", "dp": 4,
               "fp32_grads": True}
    assert estimate({**options, "zero": 1})["step_time_s"] > 0
    with pytest.raises(NotModelledError,
                       match=r"^estimate: fp32_grads with ZeRO 2 over dp 4 is not modelled"):
        estimate({**options, "zero": 2})
