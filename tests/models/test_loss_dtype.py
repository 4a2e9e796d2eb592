"""The GPT family's loss in float32 (``loss_dtype: fp32``), as
Megatron-LM (``vocab_parallel_cross_entropy(output.float(), labels)``) and
Hugging Face's causal-LM heads (``logits.float()``) compute it; ``model``
(the default) keeps it in the model's dtype (``--fp16-lm-cross-entropy``). Here: the
program, the bytes of each pass on a unit device written from the formula,
the float32 copy kept for the backward pass, the reference executor (the
vocabulary-parallel loss against the one-device one, and the float32 loss
of half-precision logits against float64), and the field's refusal."""
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from distsim.cost import CostModel, DeviceSpec
from distsim.errors import ConfigError
from distsim.interp import execute
from distsim.ir import DType, verify
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import build_gpt_step
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.memory_model import saved_activation_bytes
from distsim.transforms.strategy import Strategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))
from gpt_reference import Reference  # noqa: E402

B, S, V = 2, 8, 32          # micro-batch, sequence, vocabulary
C = GPTConfig(layers=1, hidden=16, heads=2, vocab=V, seq=S, dtype="bf16", loss_dtype="fp32")
N, T = B * S * V, B * S     # logits, tokens (labels: 8-byte integers)

#: time = bytes: 1 B/s, no launch, compute never the bound
UNIT = DeviceSpec(name="unit", peak_flops={"bf16": 1e30, "f32": 1e30, "f64": 1e30},
                  memory_bandwidth_Bps=1.0, memory_bytes=10 ** 12)


def _loss_ops(config):
    """The head's ops after the logits' product, forward and backward, by
    type: the cast to float32 and back, the loss and its gradient."""
    f = gpt_forward(config, micro_batch=B)
    step = verify(Autodiff(f.meta["loss"], f.meta["params"])(f))
    kinds = ("cast", "cross_entropy", "cross_entropy_grad")
    return step, [op for op in step.ops if op.op_type in kinds]


def test_the_logits_are_cast_to_float32_before_the_loss():
    f = gpt_forward(C, micro_batch=B)
    cast, loss = f.ops[-2:]
    assert (cast.op_type, cast.outputs[0].type.dtype) == ("cast", DType.F32)
    assert loss.op_type == "cross_entropy" and loss.inputs[0] is cast.outputs[0]
    assert f.outputs[0].type.dtype == DType.F32
    half = gpt_forward(replace(C, loss_dtype="model"), micro_batch=B)
    assert half.ops[-1].inputs[0].type.dtype == DType.BF16
    assert "cast" not in [op.op_type for op in half.ops]
    wide = gpt_forward(replace(C, dtype="f64"), micro_batch=B)     # never narrowed
    assert "cast" not in [op.op_type for op in wide.ops]
    assert GPTConfig().loss_dtype == "model"


def test_the_bytes_of_each_pass_of_the_loss():
    """Bytes per logit: the cast reads 2 and writes 4; the loss reads 4;
    its gradient reads 4 and writes 4; the cast back reads 4 and writes 2:
    24 where the loss in bf16 moves 6 (the loss reads 2, its gradient
    reads 2 and writes 2). Per token each loss op reads its 8-byte label;
    the loss writes its scalar and the gradient reads it."""
    model = CostModel(UNIT)
    _, ops = _loss_ops(C)
    got = [(op.op_type, model.op_cost(op).time_s) for op in ops]
    assert got == [("cast", 6 * N), ("cross_entropy", 4 * N + 8 * T + 4),
                   ("cross_entropy_grad", 4 + 8 * N + 8 * T), ("cast", 6 * N)]
    assert sum(t for _, t in got) == 24 * N + 16 * T + 8
    _, ops = _loss_ops(replace(C, loss_dtype="model"))
    got = [(op.op_type, model.op_cost(op).time_s) for op in ops]
    assert got == [("cross_entropy", 2 * N + 8 * T + 2),
                   ("cross_entropy_grad", 2 + 4 * N + 8 * T)]


def test_the_float32_logits_live_until_the_backward():
    """The backward reads the float32 copy (4 bytes a logit), not the bf16
    logits (the cast's gradient needs no input): the head keeps 4 N bytes
    where the loss in bf16 keeps 2 N (and the scalar loss, 4 bytes where
    2, which the backward's seed reads)."""
    fp32 = saved_activation_bytes(_loss_ops(C)[0])
    half = saved_activation_bytes(_loss_ops(replace(C, loss_dtype="model"))[0])
    assert fp32[C.layers] - half[C.layers] == (4 - 2) * N + (4 - 2)
    assert {k: v for k, v in fp32.items() if k != C.layers} == \
        {k: v for k, v in half.items() if k != C.layers}


def test_the_vocabulary_parallel_loss_runs_in_float32():
    """With tp 2 the loss's steps on the vocabulary shard and their three
    all-reduces (row maximum, sum of exponentials, label logit) are
    float32; the step before them is the cast of the bf16 shard."""
    step = build_gpt_step(replace(C, micro_batch=B), Strategy(dp=1, tp=2), B)
    head = [op for op in step.ops if op.meta.get("layer") == C.layers and "phase" not in op.meta]
    reduces = [op for op in head if op.op_type == "spmd.allreduce"]
    assert len(reduces) == 3
    assert {op.outputs[0].type.dtype for op in reduces} == {DType.F32}
    cast = next(op for op in head if op.op_type == "cast")
    assert cast.inputs[0].type.dtype == DType.BF16 and cast.outputs[0].type.shape == (B, S, V // 2)
    exp = next(op for op in head if op.op_type == "exp")
    assert exp.outputs[0].type.dtype == DType.F32


@pytest.mark.parametrize("strategy", [dict(tp=2), dict(dp=2, tp=2, pp=2, sp=True)],
                         ids=["tp2", "dp2-tp2-pp2-sp"])
def test_the_vocabulary_parallel_float32_loss_is_the_one_device_loss(strategy):
    """bf16 runs in float32 in the reference executor: the lowered
    program's loss (each rank's float32 shard, its all-reduces) equals the
    one-device model's to float32 rounding."""
    ref = Reference(dtype="bf16", loss_dtype="fp32")
    program = ref.lower(**strategy)
    outs, _ = ref.run(program)
    losses = [o for v, o in zip(program.outputs, outs)
              if program.meta["io"].get(v.name, {}).get("role") == "loss"]
    assert {v.type.dtype for v in program.outputs
            if program.meta["io"].get(v.name, {}).get("role") == "loss"} == {DType.F32}
    assert np.mean(losses) == pytest.approx(ref.loss, rel=1e-5)


def test_half_precision_logits_give_a_float32_loss():
    """f16 logits (float16 in the executor): the float32 loss is the
    float64 cross entropy of those logits to float32 rounding; the loss in
    f16 is off by float16 rounding."""
    c = GPTConfig(layers=1, hidden=16, heads=2, vocab=2048, seq=8, dtype="f16", micro_batch=2,
                  loss_dtype="fp32")
    rng = np.random.default_rng(0)

    def run(config):
        f = gpt_forward(config, micro_batch=2)
        f.outputs.append(next(v for v in f.values() if v.name == "logits"))
        inputs = [rng.integers(0, c.vocab, v.type.shape) if not v.type.dtype.is_float
                  else rng.normal(0, 0.5, v.type.shape).astype(v.type.dtype.numpy_name)
                  for v in f.inputs]
        rng.bit_generator.state = np.random.default_rng(0).bit_generator.state
        loss, x = execute(f, inputs)
        labels = inputs[[v.name for v in f.inputs].index("labels")]
        return float(loss), x, labels

    loss32, x, labels = run(c)
    x = x.astype(np.float64)
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    exact = float(np.mean(lse - np.take_along_axis(x, labels[..., None], -1)[..., 0]))
    assert loss32 == pytest.approx(exact, rel=1e-6)
    loss16, x16, _ = run(replace(c, loss_dtype="model"))
    np.testing.assert_array_equal(x16, x.astype(np.float16))
    assert abs(loss16 - exact) > 10 * abs(loss32 - exact)


@pytest.mark.parametrize("value", ["fp16", "f32", 32, None])
def test_a_bad_loss_dtype_is_refused_in_one_line(value):
    with pytest.raises(ConfigError) as e:
        GPTConfig.from_dict({"loss_dtype": value})
    assert str(e.value) == f"gpt: loss_dtype: must be one of fp32, model, got {value!r}"
