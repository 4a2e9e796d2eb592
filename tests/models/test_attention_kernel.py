"""The model's ``attention_kernel``: which fused attention implementation's
figures in the device file time the kernel (cuDNN's on the H100 files).
End to end on a small Llama-like model: the kernel reaches every fused op,
the fast estimator follows it, and a device or model that cannot take it
is one line, exit status 2."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.estimate import point as est

LLAMA_LIKE = dict(family="gpt", name="llama-small", layers=4, hidden=256, heads=8, kv_heads=2,
                  ffn=704, vocab=512, seq=1024, norm="rmsnorm", activation="swiglu", bias=False,
                  tied_embeddings=False, position="rope", global_batch=8, micro_batch=1,
                  attention="fused")
OPTIONS = dict(topology="dgx-h100", tp=2, pp=2, network_mode="analytical")


def test_every_fused_op_names_the_kernel_and_the_step_takes_its_figures():
    program, _, _ = distsim.build_program(model=LLAMA_LIKE, attention_kernel="cudnn",
                                          topology="dgx-h100")
    fused = [op for op in program.ops
             if op.op_type in ("fused_attention", "fused_attention_grad")]
    assert fused and {op.attrs.get("kernel") for op in fused} == {"cudnn"}
    default = distsim.simulate(model=LLAMA_LIKE, **OPTIONS).summary()
    cudnn = distsim.simulate(model=LLAMA_LIKE, attention_kernel="cudnn", **OPTIONS).summary()
    # cuDNN's fitted rates on dgx-h100 are well above FlashAttention-2's
    assert cudnn["step_time_s"] < default["step_time_s"]
    assert cudnn["config"]["attention_kernel"] == "cudnn"


def test_the_estimator_follows_the_kernel():
    options = dict(OPTIONS, model=LLAMA_LIKE, attention_kernel="cudnn")
    sim = distsim.simulate(**options).summary()
    row = est.estimate(options)
    assert row["step_time_s"] == pytest.approx(sim["step_time_s"], rel=AGREEMENT_TOLERANCE)
    assert row["max_peak_memory_bytes"] == pytest.approx(sim["max_peak_memory_bytes"],
                                                         rel=AGREEMENT_TOLERANCE)
    # the default kernel's profile is another cache entry, not this one
    assert est.estimate(dict(OPTIONS, model=LLAMA_LIKE))["step_time_s"] > row["step_time_s"]


@pytest.mark.parametrize("args, message", [
    (["--topology", "dgx-a100", "--attention", "fused", "--attention-kernel", "cudnn"],
     "attention_kernel: cudnn: device A100-SXM4-80GB has no figures for it (its "
     "attention.kernels block; `distsim calibrate` writes it from attention rows with "
     "kernel: cudnn)"),
    (["--topology", "dgx-h100", "--attention", "explicit", "--attention-kernel", "cudnn"],
     "gpt2: attention_kernel: names a fused attention kernel; it needs attention: fused"),
    (["--topology", "dgx-h100", "--attention", "fused", "--attention-kernel", "triton"],
     "gpt2: attention_kernel: must be one of cudnn (or none, the device's default), got "
     "'triton'"),
])
def test_a_kernel_that_cannot_be_timed_is_one_line_exit_2(capsys, args, message):
    assert main(["simulate", "--model", "gpt2", "--layers", "1", *args]) == 2
    assert capsys.readouterr().err == f"distsim: error: {message}\n"
