"""The imported GPT-2 tiny and the built-in GPT of the same config: the same
parameter count and the same forward FLOP count.

The model is ``models/gpt2-tiny.onnx`` (``models/export_hf.py``: Hugging
Face's GPT2LMHeadModel, 2 layers, hidden 32, 4 heads, vocab 128, 64
positions, eval mode; input ids -> logits), imported at a batch and
sequence length; the built-in model is ``gpt_forward`` of the GPTConfig
with the same layers, hidden, heads, vocab, positions (``positions=64``,
GPT-2's ``n_positions``), seq and micro-batch, dropout 0, float32.

Parameters, exactly, three ways: the importer's parameters, the builder's
(its program and ``GPTConfig.parameter_count``) and the GPT-2 formula
written out by hand below. GPT-2 ties its output layer to the token
embedding; both sides count that matrix once, as Hugging Face's
``num_parameters()`` and the published 124M do: the export stores it once
(``inner.lm_head.weight``, gathered for the embedding and transposed for
the logits) and the builder's head reuses ``wte``.

FLOPs, with distsim's cost model (``op_flops``), exactly, with no
tolerance:

- Matrix products: the list of per-matmul FLOPs is the same on both sides
  (the export's Gemms on (batch*seq, hidden) rows, the builder's matmuls on
  (batch, seq, hidden)), and equals the hand formula.
- Everything else: layernorm and softmax are single ops on both sides and
  equal. The exporter decomposes the rest: GELU is 8 ONNX ops (mul, pow,
  mul, add, mul, tanh, add, mul; 1 FLOP per element each) where the
  builder has one ``gelu`` counted 8 per element; the attention scale is a
  ``mul`` against the builder's ``scale`` and the causal mask an ``add`` of
  a -inf mask against ``causal_mask`` (1 per element each); bias and
  residual adds are adds on both sides. So the export's mul + add + pow +
  tanh FLOPs equal the builder's gelu + add + scale + causal_mask FLOPs,
  checked exactly, and so does the total. Data movement (reshape,
  transpose, split, gather / embedding) counts 0 on both sides.
- The builder's forward ends with the loss (``cross_entropy``); the export
  ends at the logits, so the loss op is left out of the builder's count.
"""
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from distsim.cost.flops import op_flops
from distsim.importers.onnx import import_onnx
from distsim.ir import verify
from distsim.models import load_model_config
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import gpt_config

MODELS = Path(__file__).resolve().parents[2] / "models"


def _export_config():
    """TINY["gpt2"] of models/export_hf.py (the script imports torch only
    when it exports, so reading its configs needs no torch)."""
    spec = importlib.util.spec_from_file_location("export_hf", MODELS / "export_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TINY["gpt2"]


HF = _export_config()
LAYERS, HIDDEN, HEADS = HF["n_layer"], HF["n_embd"], HF["n_head"]
VOCAB, POSITIONS = HF["vocab_size"], HF["n_positions"]
SHAPES = [(2, 64), (2, 16), (1, 7)]  # (batch, seq): the whole table, and shorter sequences


def gpt2_parameters(layers, hidden, vocab, positions):
    """GPT-2 by hand: token and position embeddings, per layer two
    layernorms (2h each), QKV (h x 3h + 3h), attention out (h x h + h),
    MLP (h x 4h + 4h, 4h x h + h), the final layernorm; the output layer is
    the token embedding (tied, counted once)."""
    h = hidden
    per_layer = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + \
        (4 * h * h + h)
    assert per_layer == 12 * h * h + 13 * h
    return vocab * h + positions * h + layers * per_layer + 2 * h


def gpt2_matmul_flops(layers, hidden, vocab, batch, seq):
    """Forward matmul FLOPs (2 per multiply-add) by hand: per token 2 x the
    weights of QKV, out, MLP and the logits; per layer the scores and the
    weighted values, 2 x batch x seq^2 x hidden each."""
    h, tokens = hidden, batch * seq
    weights = layers * (3 * h * h + h * h + 2 * 4 * h * h) + h * vocab
    return 2 * tokens * weights + layers * 2 * (2 * batch * seq * seq * h)


def imported(batch, seq):
    return verify(import_onnx(MODELS / "gpt2-tiny.onnx", batch=batch, seq=seq))


def built(batch, seq):
    c = GPTConfig(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, seq=seq,
                  positions=POSITIONS, dropout=0.0, dtype="f32", global_batch=batch,
                  micro_batch=batch)
    return c, verify(gpt_forward(c, micro_batch=batch))


def params_of(f):
    roles = f.meta["roles"]
    return [v for v in f.inputs if roles.get(v.name) == "param"]


def flops_by_type(ops):
    out = Counter()
    for op in ops:
        out[op.op_type] += op_flops(op)
    return out


def test_the_hand_formula_is_gpt2():
    """The formula gives the published GPT-2 small count, which is also
    distsim's gpt2 (models/gpt2.yaml)."""
    assert gpt2_parameters(12, 768, 50257, 1024) == 124_439_808
    assert gpt_config(load_model_config("gpt2")).parameter_count() == 124_439_808


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_same_parameter_count(batch, seq):
    f = imported(batch, seq)
    c, g = built(batch, seq)
    expected = gpt2_parameters(LAYERS, HIDDEN, VOCAB, POSITIONS)
    assert expected == 31_616
    ours = params_of(f)
    assert sum(v.type.numel for v in ours) == expected
    assert sum(v.type.numel for v in params_of(g)) == c.parameter_count() == expected
    # tensor by tensor: the same shapes (28 tensors; the tied matrix once)
    assert sorted(v.type.shape for v in ours) == sorted(v.type.shape for v in params_of(g))
    assert len(ours) == 4 + 12 * LAYERS
    tied = f.value_by_name("inner.lm_head.weight")
    assert tied in ours and tied.type.shape == (VOCAB, HIDDEN)
    uses = sorted(op.op_type for op in f.ops if tied in op.inputs)
    assert uses == ["gather", "transpose"]  # the embedding lookup and the output layer


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_same_forward_flops(batch, seq):
    f = imported(batch, seq)
    _, g = built(batch, seq)
    loss = [op for op in g.ops if op.op_type == "cross_entropy"]
    assert len(loss) == 1 and g.ops[-1] is loss[0]  # the loss is the builder's last op
    theirs = flops_by_type(f.ops)
    ours = flops_by_type(g.ops[:-1])  # up to the logits, as the export

    # matrix products: op by op, and the hand formula
    matmuls_f = sorted(op_flops(op) for op in f.ops if op.op_type == "matmul")
    matmuls_g = sorted(op_flops(op) for op in g.ops if op.op_type == "matmul")
    assert matmuls_f == matmuls_g
    assert len(matmuls_f) == 6 * LAYERS + 1
    assert theirs["matmul"] == ours["matmul"] == gpt2_matmul_flops(LAYERS, HIDDEN, VOCAB,
                                                                    batch, seq)
    assert theirs.keys() - {"matmul"} == {"layernorm", "softmax", "add", "mul", "pow", "tanh",
                                          "reshape", "transpose", "split", "gather"}
    # single ops on both sides
    for kind in ("layernorm", "softmax"):
        assert theirs[kind] == ours[kind] > 0, kind
    # the exporter's decompositions (see the module docstring)
    tokens = batch * seq
    assert theirs["tanh"] == theirs["pow"] == LAYERS * tokens * 4 * HIDDEN  # one per GELU element
    assert ours["gelu"] == 8 * LAYERS * tokens * 4 * HIDDEN
    assert ours["scale"] == ours["causal_mask"] == LAYERS * batch * HEADS * seq * seq
    decomposed = theirs["mul"] + theirs["add"] + theirs["pow"] + theirs["tanh"]
    assert decomposed == ours["gelu"] + ours["add"] + ours["scale"] + ours["causal_mask"]
    # data movement: no arithmetic
    for kind in ("reshape", "transpose", "split", "gather"):
        assert theirs[kind] == 0, kind
    for kind in ("reshape", "transpose", "split", "embedding", "slice"):
        assert ours.get(kind, 0) == 0, kind
    assert sum(theirs.values()) == sum(ours.values())
