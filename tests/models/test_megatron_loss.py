"""Megatron-LM's float32 loss at one tensor-parallel rank: Megatron runs
``vocab_parallel_cross_entropy(output.float(), labels)`` at every ``tp``,
so under ``fusion: megatron`` the step of one rank writes the loss as the
vocabulary-parallel steps (:mod:`distsim.transforms.sharding.vocab_loss`)
with no collectives; ``fusion: none`` keeps the one ``cross_entropy`` op,
as does ``megatron-core`` (its ``cross_entropy_loss_fusion`` kernel),
and so does a loss in bf16. Here: the program, the time of each pass on a
unit device written from the formula, and the reference executor (the
loss and every gradient as the one-op loss gives them)."""
from dataclasses import replace

import numpy as np
import pytest

from distsim.cost import CostModel, DeviceSpec
from distsim.interp import execute
from distsim.models.gpt import GPTConfig
from distsim.models.gpt_family import build_gpt_step
from distsim.transforms.memory_model import saved_activation_bytes
from distsim.transforms.strategy import Strategy

B, S, V = 2, 8, 32          # micro-batch, sequence, vocabulary
C = GPTConfig(layers=1, hidden=16, heads=2, vocab=V, seq=S, dtype="bf16", loss_dtype="fp32",
              micro_batch=B)
N, T = B * S * V, B * S     # logits, tokens (labels: 8-byte integers)

#: time = bytes: 1 B/s, no launch, compute never the bound
UNIT = DeviceSpec(name="unit", peak_flops={"bf16": 1e30, "f32": 1e30, "f64": 1e30},
                  memory_bandwidth_Bps=1.0, memory_bytes=10 ** 12)


def _step(fusion, config=C, tp=1):
    return build_gpt_step(config, Strategy(dp=1, tp=tp, fusion=fusion), B)


def _loss_ops(step):
    """The head's ops after the logits' product (not the norm, the
    product or their gradients), forward and backward, in order."""
    return [op for op in step.ops if op.meta.get("layer") == C.layers
            and op.op_type not in ("layernorm", "layernorm_grad", "matmul", "fused")]


def test_the_loss_is_megatrons_steps_at_one_rank_under_its_fusion():
    steps = [op.op_type for op in _loss_ops(_step("megatron")) if "phase" not in op.meta]
    assert steps == ["cast", "reduce_max", "stop_gradient", "sub", "exp", "reduce_sum",
                     "select_label", "log", "sub", "reduce_mean"]
    assert not [op for op in _step("megatron").ops if op.op_type.startswith("spmd.")]
    # one op: unfused, PyTorch eager, Megatron-core's fused cross entropy,
    # and a loss in bf16 under Megatron's fusion
    for fusion, config in (("none", C), ("pytorch-eager", C), ("megatron-core", C),
                           ("megatron", replace(C, loss_dtype="model"))):
        ops = [op.op_type for op in _loss_ops(_step(fusion, config))]
        assert "cross_entropy" in ops and "reduce_max" not in ops, (fusion, config.loss_dtype)


def test_the_time_of_each_pass_of_megatrons_loss():
    """Per logit (N of them, float32: 4 bytes) and per token (T: its
    8-byte label, and one float32 per row): the cast reads 2 N and writes
    4 N; the row maximum reads 4 N and writes 4 T; the shift reads 4 N and
    the maximum and writes 4 N; the exponentials read and write 4 N; their
    sum reads 4 N and writes 4 T; the label's logit reads the shifted 4 N
    and the labels, writes 4 T; the log, the difference and the mean run
    on rows. The backward: the label logit's gradient written into zeros
    (reads the shifted 4 N and the labels, writes 4 N), the row gradient
    broadcast over the vocabulary (4 N written), times the exponentials
    (reads 8 N, writes 4 N), the two gradients of the shifted logits added
    (reads 8 N, writes 4 N), the cast back (reads 4 N, writes 2 N): 76
    bytes a logit, where the one-op loss moves 24 (its test in
    test_loss_dtype.py)."""
    model = CostModel(UNIT)
    got = [(op.op_type, model.op_cost(op).time_s) for op in _loss_ops(_step("megatron"))]
    assert got == [
        ("cast", 6 * N),
        ("reduce_max", 4 * N + 4 * T), ("stop_gradient", 8 * T), ("sub", 8 * N + 4 * T),
        ("exp", 8 * N), ("reduce_sum", 4 * N + 4 * T), ("select_label", 4 * N + 12 * T),
        ("log", 8 * T), ("sub", 12 * T), ("reduce_mean", 4 * T + 4),
        # backward: the seed's reshape and broadcast over the rows, the mean's
        # scale, the two row gradients (label logit, sum of exponentials)
        ("reshape", 8), ("broadcast_to", 4 * T + 4), ("scale", 8 * T), ("neg", 8 * T),
        ("div", 12 * T),
        ("select_label_grad", 8 * N + 12 * T), ("reshape", 8 * T),
        ("broadcast_to", 4 * N + 4 * T), ("mul", 12 * N), ("add", 12 * N),
        ("cast", 6 * N)]
    assert sum(t for _, t in got) == 76 * N + 112 * T + 16
    one_op = sum(model.op_cost(op).time_s for op in _loss_ops(_step("none")))
    assert one_op == 24 * N + 16 * T + 8


def test_megatrons_loss_keeps_the_shifted_logits_and_their_exponentials():
    """For the backward the steps keep the shifted logits and their
    exponentials (8 N bytes) and the rows' sums (4 T), where the one op
    keeps the float32 logits (4 N)."""
    one_op = saved_activation_bytes(_step("none"))[C.layers]
    steps = saved_activation_bytes(_step("megatron"))[C.layers]
    assert steps - one_op == 4 * N + 4 * T


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_megatrons_loss_gives_the_one_op_loss_and_gradients(dtype):
    """The reference executor (bf16 runs in float32): the step under
    Megatron's fusion, its loss written as the steps, gives the unfused
    step's loss and every gradient to float32 rounding."""
    config = replace(C, dtype=dtype)
    fused, plain = _step("megatron", config), _step("none", config)
    assert [v.name for v in fused.inputs] == [v.name for v in plain.inputs]
    assert "reduce_max" in [op.op_type for op in fused.ops]
    assert "reduce_max" not in [op.op_type for op in plain.ops]
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, V, v.type.shape) if not v.type.dtype.is_float
              else rng.normal(0, 0.5, v.type.shape).astype(np.float32) for v in plain.inputs]
    got, want = execute(fused, inputs), execute(plain, inputs)
    assert [v.name for v in fused.outputs] == [v.name for v in plain.outputs]
    for v, a, b in zip(plain.outputs, got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=v.name)
    assert np.abs(want[0]) > 0 and any(np.abs(g).max() > 0 for g in want[1:])
