"""The GPT family's hand-written per-rank builder against the ``megatron``
plan on the generic path (:mod:`distsim.models.gpt_generic`).

Without tensor parallelism the two are the same program, printed op for op
(collectives, shapes and so bytes included), with the same step time and
memory to the byte. With it they are the same program up to the names of
values, with the same step time and memory, and both train the one-device
model (the reference executor, float64); what still differs is what the
module docstring of :mod:`distsim.models.gpt_generic` says."""
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from distsim.ir import verify
from distsim.models.gpt import GPTConfig, gpt_forward
from distsim.models.gpt_family import build_gpt, resolve_batch, validate
from distsim.models.gpt_generic import build_gpt_generic, lower_gpt_generic
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.text import print_function
from distsim.topology import load_topology
from distsim.transforms.megatron_plan import megatron_plan
from distsim.transforms.strategy import Strategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))
from gpt_reference import TOLERANCE, Reference  # noqa: E402

SMALL = dict(family="gpt", name="small", layers=4, hidden=32, heads=4, kv_heads=2, vocab=64,
             seq=16, global_batch=8, micro_batch=2, dropout=0.1, dtype="bf16")
LLAMA = dict(SMALL, name="llama-small", norm="rmsnorm", activation="swiglu", position="rope",
             bias=False, tied_embeddings=False)


def _strategy(**kw) -> Strategy:
    s = Strategy(**kw)
    return s if s.dp is not None else Strategy(**{**kw, "dp": 1})


WITHOUT_TP = [
    (SMALL, dict()),
    (SMALL, dict(dp=2)),
    (SMALL, dict(dp=2, bucket_mb=0.001)),
    (SMALL, dict(pp=2)),
    (SMALL, dict(pp=4, schedule="gpipe")),
    (SMALL, dict(pp=2, schedule="interleaved", virtual_stages=2)),
    (SMALL, dict(pp=3, partition="balanced")),
    (SMALL, dict(dp=2, zero=1)),
    (SMALL, dict(dp=2, zero=2, microbatches=2)),
    (SMALL, dict(dp=2, zero=3)),
    (SMALL, dict(dp=2, zero=3, zero3_unit="layer", prefetch=2)),
    (SMALL, dict(recompute="selective")),
    (SMALL, dict(dp=2, pp=2, recompute="full", optimizer="sgd")),
    (SMALL, dict(dp=2, pp=2, coarsen=True)),
    (LLAMA, dict(dp=2, pp=2, zero=1)),
    (dict(SMALL, attention="fused"), dict(pp=2, recompute="selective")),
]


def _id(case):
    config, strategy = case
    return ",".join([config["name"] + ("-fused" if config.get("attention") else "")] +
                    [f"{k}={v}" for k, v in strategy.items()])


@pytest.mark.parametrize("case", WITHOUT_TP, ids=_id)
def test_without_tensor_parallelism_the_programs_are_the_same(case):
    config, kw = case
    hand = build_gpt(config, _strategy(**kw))
    generic = build_gpt_generic(config, _strategy(**kw))
    assert print_function(generic) == print_function(hand)
    _same_meta_time_and_memory(hand, generic)


def _same_meta_time_and_memory(hand, generic):
    """The same ``meta`` that lowering and the numbers read, and the same
    simulated step time and per-device peak memory, to the byte."""
    for key in ("io", "param_shards", "microbatches", "optimizer"):
        assert generic.meta.get(key) == hand.meta.get(key), key
    topo = load_topology("dgx-a100")
    runs = [simulate_function(p, topo, options=SimulationOptions(network_mode="analytical"))
            for p in (hand, generic)]
    assert runs[1].step_time_s == runs[0].step_time_s > 0
    assert runs[1].peak_memory() == runs[0].peak_memory()
    assert all(peak > 0 for peak in runs[0].peak_memory().values())


#: tensor (and sequence) parallelism, where the two are the same program: the fused
#: projections split block by block, Megatron's vocabulary-parallel loss, an untied output
#: layer split over the vocabulary, a padded vocabulary, the position table with sp
WITH_TP = [
    (SMALL, dict(tp=2)),
    (SMALL, dict(dp=2, tp=2, pp=2, zero=1)),
    (SMALL, dict(tp=2, pp=2, microbatches=2, recompute="selective")),
    (dict(SMALL, attention="fused"), dict(tp=2, dp=2, zero=3)),
    (SMALL, dict(tp=2, sp=True)),
    (dict(SMALL, dropout=0.0), dict(dp=2, tp=2, pp=2, sp=True, zero=3, recompute="full")),
    (LLAMA, dict(tp=2)),
    (LLAMA, dict(tp=2, sp=True)),
    (LLAMA, dict(dp=2, tp=2, pp=2, sp=True, zero=2, recompute="full")),
    # a vocabulary tp does not divide: padded (Megatron's way, to a multiple of tp) and masked
    (dict(SMALL, vocab=63), dict(tp=2)),
    (dict(LLAMA, vocab=63), dict(dp=2, tp=2, pp=2, zero=1)),
]


@pytest.mark.parametrize("case", WITH_TP, ids=_id)
def test_with_tensor_parallelism_the_programs_are_the_same(case):
    """Op for op (types, shapes, devices, attributes, collectives and so
    bytes; only the names of values differ), the same meta, step time and
    per-device peak memory to the byte."""
    config, kw = case
    hand = build_gpt(config, _strategy(**kw))
    generic = build_gpt_generic(config, _strategy(**kw))
    assert generic.structural_key() == hand.structural_key()
    _same_meta_time_and_memory(hand, generic)


class GenericReference(Reference):
    """The tiny GPT's one-device step; ``lower`` takes the generic path."""

    def lower(self, **strategy):
        s = _strategy(**{"optimizer": self.optimizer, **strategy})
        m = validate(self.config, s)
        c, _ = resolve_batch(self.config, s)
        return verify(lower_gpt_generic(c, s, m, self.hyper, "f64"))


@pytest.fixture(scope="module")
def generic_reference():
    return GenericReference()


@pytest.fixture(scope="module")
def generic_llama():
    """Llama's block: SwiGLU's fused gate/up split block by block, an untied
    output layer split over the vocabulary, the vocabulary-parallel loss."""
    return GenericReference(norm="rmsnorm", activation="swiglu", position="rope", bias=False,
                            tied_embeddings=False)


@pytest.mark.parametrize("strategy", [
    dict(tp=2),
    dict(tp=2, sp=True),
    dict(tp=2, pp=2, microbatches=2),
    dict(dp=2, tp=2, zero=1),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3, recompute="full"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_with_tensor_parallelism_both_train_the_one_device_model(generic_reference, strategy):
    program = generic_reference.check(**strategy)
    assert program.meta["tp"] == strategy["tp"]
    # the same numbers as the hand-written builder's step, parameter by parameter
    hand = Reference.lower(generic_reference, **strategy)
    _, by_hand = generic_reference.run(hand)
    _, by_plan = generic_reference.run(program)
    for name, value in by_hand.items():
        np.testing.assert_allclose(by_plan[name], value, **TOLERANCE, err_msg=name)


@pytest.mark.parametrize("strategy", [
    dict(tp=2),
    dict(dp=2, tp=2, pp=2, sp=True, zero=1, recompute="selective"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_a_llama_block_with_tensor_parallelism_trains_the_one_device_model(generic_llama,
                                                                           strategy):
    program = generic_llama.check(**strategy)
    assert program.meta["param_shards"]["lm_head"] == (0, (32,))
    assert program.meta["param_shards"]["l0_w1"] == (1, (64, 64))


@pytest.fixture(scope="module")
def generic_padded():
    """A vocabulary of 31: padded to 32 for tp 2, the padding masked out."""
    return GenericReference(vocab=31)


@pytest.mark.parametrize("strategy", [
    dict(tp=2),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_a_padded_vocabulary_trains_the_one_device_model(generic_padded, strategy):
    program = generic_padded.check(**strategy)
    assert program.meta["param_global_shapes"]["wte"] == (32, 16)
    assert program.meta["param_unpadded"]["wte"] == 31
    hand = Reference.lower(generic_padded, **strategy)
    assert program.structural_key() == hand.structural_key()


def _ops(f):
    """The ops of ``f`` as a multiset: type, attributes, operand and result
    types (not names, not order)."""
    return Counter((op.op_type, tuple(sorted(op.attrs.items())), tuple(v.type for v in op.inputs),
                    tuple(v.type for v in op.outputs)) for op in f.ops)


def test_a_position_table_longer_than_the_sequence_is_the_difference():
    """32 learned positions, sequence 16 (the step uses the first 16 rows):
    without sp the same ops, in another order (the plan slices the table
    after the embedding's all-reduce), and the same step time and memory;
    with sp the builder all-reduces the gradient of the whole table (a copy
    of it before the slice), the plan that of the 16 rows used (a copy of
    the slice)."""
    config = dict(SMALL, positions=32)
    for sp in (False, True):
        hand = build_gpt(config, _strategy(tp=2, sp=sp))
        generic = build_gpt_generic(config, _strategy(tp=2, sp=sp))
        if not sp:
            assert generic.structural_key() != hand.structural_key()
            assert _ops(generic) == _ops(hand)
            _same_meta_time_and_memory(hand, generic)
            continue
        reduced = {k: n for k, n in (_ops(hand) - _ops(generic)).items()
                   if k[0] == "comm.allreduce"}
        assert [k[3][0].shape for k in reduced] == [(32, 32)]
        reduced = {k: n for k, n in (_ops(generic) - _ops(hand)).items()
                   if k[0] == "comm.allreduce"}
        assert [k[3][0].shape for k in reduced] == [(16, 32)]


@pytest.mark.parametrize("config", [SMALL, LLAMA], ids=lambda c: c["name"])
def test_the_megatron_plan_of_a_gpt_layer(config):
    """The styles the plan finds in one layer: the fused QKV and (SwiGLU's)
    gate/up projections block by block, an untied output layer over the
    vocabulary; biases and norms are left to propagation."""
    c = GPTConfig(**{k: v for k, v in config.items() if k not in ("family", "name")})
    c = replace(c, layers=1)
    styles = {e.pattern: e.style for e in megatron_plan(gpt_forward(c)).entries}
    want = {"wte": "vocab", "l0_wqkv": "fused_colwise", "l0_wo": "rowwise",
            "l0_w1": "fused_colwise" if c.activation == "swiglu" else "colwise",
            "l0_w2": "rowwise"}
    if not c.tied_embeddings:
        want["lm_head"] = "colwise"
    assert styles == want
