"""The GPT family's tensor (and sequence) parallelism comes from the
``megatron`` plan on the generic path: :func:`~distsim.models.gpt_family.
build_gpt_step` places the one-device forward (``gpt_forward(pad_for=tp)``)
by the plan (:func:`~distsim.transforms.parallelize.template_step`). Here:
the plan's styles on a GPT layer, the collectives it gives each layer
(Megatron's, counted by hand from its layout), a learned position table
longer than the sequence, and the reference executor (float64) on what
the strategy tests' tiny GPT does not cover: a Llama block and a padded
vocabulary."""
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import build_gpt_step
from distsim.transforms.megatron_plan import megatron_plan
from distsim.transforms.strategy import Strategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))
from gpt_reference import Reference  # noqa: E402

SMALL = dict(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq=16, dropout=0.1)
LLAMA = dict(SMALL, norm="rmsnorm", activation="swiglu", position="rope", bias=False,
             tied_embeddings=False)


@pytest.mark.parametrize("config", [SMALL, LLAMA], ids=["gpt", "llama"])
def test_the_megatron_plan_of_a_gpt_layer(config):
    """The styles the plan finds in one layer: the fused QKV and (SwiGLU's)
    gate/up projections block by block, an untied output layer over the
    vocabulary; biases and norms are left to propagation."""
    c = replace(GPTConfig(**config), layers=1)
    styles = {e.pattern: e.style for e in megatron_plan(gpt_forward(c)).entries}
    want = {"wte": "vocab", "l0_wqkv": "fused_colwise", "l0_wo": "rowwise",
            "l0_w1": "fused_colwise" if c.activation == "swiglu" else "colwise",
            "l0_w2": "rowwise"}
    if not c.tied_embeddings:
        want["lm_head"] = "colwise"
    assert styles == want


def _collectives(step):
    """(layer, phase, collective, result shape) -> count, of a one-rank step."""
    return Counter((op.meta["layer"], "bwd" if "phase" in op.meta else "fwd",
                    op.op_type[len("spmd."):], op.outputs[0].type.shape)
                   for op in step.ops if op.op_type.startswith("spmd."))


def test_each_layer_has_megatrons_collectives():
    """Micro-batch 2, sequence 16, hidden 32 (``x`` = (2, 16, 32)), tp 2.
    Without sp a layer has the two ``f``/``g`` pairs of Megatron's layout:
    a copy of the attention's and of the MLP's input (all-reduced in the
    backward pass) and an all-reduce of each row-parallel product. The
    embedding all-reduces its vocabulary-parallel lookup; the head copies
    its input and the loss all-reduces the row maximum, the sum of
    exponentials and the label logit."""
    x, rows = (2, 16, 32), (2, 16)
    got = _collectives(build_gpt_step(GPTConfig(**SMALL), Strategy(dp=1, tp=2), 2))
    want = Counter({(-1, "fwd", "allreduce", x): 1,
                    (2, "fwd", "copy", x): 1, (2, "bwd", "allreduce", x): 1,
                    (2, "fwd", "allreduce", rows + (1,)): 1, (2, "fwd", "allreduce", rows): 2})
    for layer in (0, 1):
        want.update({(layer, "fwd", "copy", x): 2, (layer, "fwd", "allreduce", x): 2,
                     (layer, "bwd", "allreduce", x): 2})
    assert got == want


def test_with_sequence_parallelism_each_layer_gathers_and_scatters():
    """The same layout with sp (sequence shards of (2, 8, 32)): each
    copy/all-reduce pair becomes an all-gather of the sequence and a
    reduce-scatter of the product, and the backward pass gathers each
    sequence shard again for the weights' gradients (4 all-gathers, 2
    reduce-scatters); the 6 replicated parameters a layer uses on sequence
    shards (two layernorms' gain and bias, the biases of the two
    row-parallel products) have their gradients all-reduced. A learned
    table of 32 positions of which the step reads 16: the lookup and a
    share of the 16 rows are reduce-scattered together, and only those
    rows' gradient is all-reduced."""
    x, shard, rows, h = (2, 16, 32), (2, 8, 32), (2, 16), (32,)
    c = GPTConfig(**SMALL, positions=32)
    got = _collectives(build_gpt_step(c, Strategy(dp=1, tp=2, sp=True), 2))
    want = Counter({(-1, "fwd", "reducescatter", shard): 1, (-1, "bwd", "allgather", x): 1,
                    (-1, "fwd", "copy", (16, 32)): 1, (-1, "bwd", "allreduce", (16, 32)): 1,
                    (2, "fwd", "allgather", x): 1, (2, "bwd", "reducescatter", shard): 1,
                    (2, "fwd", "copy", h): 2, (2, "bwd", "allreduce", h): 2,
                    (2, "fwd", "allreduce", rows + (1,)): 1, (2, "fwd", "allreduce", rows): 2})
    for layer in (0, 1):
        want.update({(layer, "fwd", "allgather", x): 2, (layer, "fwd", "reducescatter", shard): 2,
                     (layer, "bwd", "allgather", x): 4, (layer, "bwd", "reducescatter", shard): 2,
                     (layer, "fwd", "copy", h): 6, (layer, "bwd", "allreduce", h): 6})
    assert got == want


@pytest.fixture(scope="module")
def llama():
    """Llama's block: SwiGLU's fused gate/up split block by block, an untied
    output layer split over the vocabulary, the vocabulary-parallel loss."""
    return Reference(norm="rmsnorm", activation="swiglu", position="rope", bias=False,
                     tied_embeddings=False)


@pytest.mark.parametrize("strategy", [
    dict(tp=2),
    dict(dp=2, tp=2, pp=2, sp=True, zero=1, recompute="selective"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_a_llama_block_with_tensor_parallelism_trains_the_one_device_model(llama, strategy):
    program = llama.check(**strategy)
    assert program.meta["param_shards"]["lm_head"] == (0, (32,))
    assert program.meta["param_shards"]["l0_w1"] == (1, (64, 64))


@pytest.fixture(scope="module")
def padded():
    """A vocabulary of 31: padded to 32 for tp 2, the padding masked out."""
    return Reference(vocab=31)


@pytest.mark.parametrize("strategy", [
    dict(tp=2),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_a_padded_vocabulary_trains_the_one_device_model(padded, strategy):
    program = padded.check(**strategy)
    assert program.meta["param_global_shapes"]["wte"] == (32, 16)
    assert program.meta["param_unpadded"]["wte"] == 31


def test_a_step_finished_from_a_shared_backward_is_the_one_built_alone():
    """The estimator places and differentiates a template once for its
    three recomputation settings (``build_gpt_step(..., backward=...)``):
    each finished step prints as the step built on its own, op by op with
    its meta, and the shared backward is left as it was."""
    from distsim.models.gpt_family import build_gpt_backward
    from distsim.text.printer import print_function

    def text(f):
        return [(print_function(f), sorted((k, repr(x)) for k, x in f.meta.items()))] + [
            sorted((k, repr(x)) for k, x in op.meta.items()) for op in f.ops]

    c = GPTConfig(**SMALL)
    for tp, sp, pp in ((2, False, 1), (2, True, 2)):
        backward = build_gpt_backward(c, Strategy(dp=1, tp=tp, sp=sp, pp=pp), 2)
        before = text(backward)
        for recompute in ("none", "selective", "full"):
            for fusion in ("megatron", "none"):
                s = Strategy(dp=1, tp=tp, sp=sp, pp=pp, recompute=recompute, fusion=fusion)
                assert text(build_gpt_step(c, s, 2, backward)) == text(build_gpt_step(c, s, 2))
        assert text(backward) == before
