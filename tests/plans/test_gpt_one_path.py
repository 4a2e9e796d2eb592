"""The GPT family's hand-written per-rank builder against the ``megatron``
plan on the generic path (:mod:`distsim.models.gpt_generic`).

Without tensor parallelism the two are the same program, printed op for op
(collectives, shapes and so bytes included), with the same step time and
memory to the byte. With it both train the same model (the reference
executor, float64, against the one-device step) and their programs differ
exactly where the module docstring of :mod:`distsim.models.gpt_generic`
says."""
import sys
from collections import Counter
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
from distsim.transforms.tensor_parallel import TensorParallel

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
    for key in ("io", "param_shards", "microbatches", "optimizer"):
        assert generic.meta.get(key) == hand.meta.get(key), key
    topo = load_topology("dgx-a100")
    runs = [simulate_function(p, topo, options=SimulationOptions(network_mode="analytical"))
            for p in (hand, generic)]
    assert runs[1].step_time_s == runs[0].step_time_s > 0
    assert runs[1].peak_memory() == runs[0].peak_memory()
    assert all(peak > 0 for peak in runs[0].peak_memory().values())


#: tensor parallelism where the two are the same program: the fused projections split block
#: by block, Megatron's vocabulary-parallel loss, an untied output layer split over the
#: vocabulary
WITH_TP = [
    (SMALL, dict(tp=2)),
    (SMALL, dict(dp=2, tp=2, pp=2, zero=1)),
    (SMALL, dict(tp=2, pp=2, microbatches=2, recompute="selective")),
    (dict(SMALL, attention="fused"), dict(tp=2, dp=2, zero=3)),
    (LLAMA, dict(tp=2)),
    (LLAMA, dict(tp=2, sp=True)),
    (LLAMA, dict(dp=2, tp=2, pp=2, sp=True, zero=2, recompute="full")),
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
    for key in ("io", "param_shards", "microbatches", "optimizer"):
        assert generic.meta.get(key) == hand.meta.get(key), key
    topo = load_topology("dgx-a100")
    runs = [simulate_function(p, topo, options=SimulationOptions(network_mode="analytical"))
            for p in (hand, generic)]
    assert runs[1].step_time_s == runs[0].step_time_s > 0
    assert runs[1].peak_memory() == runs[0].peak_memory()


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


def _collectives(f):
    """(kind, reduction, result shape) -> how many, of ``f``'s SPMD collectives."""
    return Counter((op.op_type, op.attrs.get("reduce_op"), op.outputs[0].type.shape)
                   for op in f.ops
                   if op.op_type in ("spmd.allreduce", "spmd.allgather", "spmd.reducescatter"))


def test_with_sequence_parallelism_the_learned_position_table_is_the_difference():
    """One layer, micro-batch 2, seq 8, hidden 16, 4 heads over 2 kv heads,
    vocab 32, tp 2 with sp: the forward of one rank, collective by
    collective, and how the parameters are split."""
    c = GPTConfig(layers=1, hidden=16, heads=4, kv_heads=2, vocab=32, seq=8, global_batch=2,
                  micro_batch=2, dropout=0.0)
    hand, generic = _both(c, True)
    # the same collectives: the loss's three all-reduces, the embedding's and the two
    # row-parallel layers' sums reduce-scattered along the sequence, the norms' gathers
    assert generic == hand == VOCAB_PARALLEL_LOSS + Counter(
        {(RS, "sum", (2, 4, 16)): 3, (AG, None, (2, 8, 16)): 3})
    # (dim, blocks) or None for whole, where the two differ: the plan splits the position
    # table along the sequence and adds each rank's rows after the reduce-scatter (the builder
    # keeps it whole and adds a tp-th of it to each rank's partial sum)
    assert _shards(c, True) == {"wpe": (None, (0, (8,)))}
    one = gpt_forward(c, micro_batch=2)
    styles = {e.pattern: e.style for e in megatron_plan(one).entries}
    assert styles["l0_wqkv"] == "fused_colwise" and styles["l0_w1"] == "colwise"


AG, RS, AR = "spmd.allgather", "spmd.reducescatter", "spmd.allreduce"
#: Megatron's vocabulary-parallel cross entropy: the row maximum, the sum of exponentials and
#: the label's logit of micro-batch 2 x seq 8, all-reduced over the vocabulary shards
VOCAB_PARALLEL_LOSS = Counter({(AR, "max", (2, 8, 1)): 1, (AR, "sum", (2, 8)): 2})


def _both(c: GPTConfig, sp: bool):
    """The SPMD collectives of one rank's forward at tp 2: the hand-written
    builder's and the megatron plan's."""
    one = gpt_forward(c, micro_batch=2)
    return (_collectives(gpt_forward(c, tp=2, sp=sp, micro_batch=2)),
            _collectives(TensorParallel(megatron_plan(one), 2, sp)(one)))


def _shards(c: GPTConfig, sp: bool):
    """name -> (the builder's split, the plan's) of the parameters split
    differently at tp 2 (``param_shards``; None: whole on every rank)."""
    hand = gpt_forward(c, tp=2, sp=sp, micro_batch=2).meta["param_shards"]
    one = gpt_forward(c, micro_batch=2)
    plan = TensorParallel(megatron_plan(one), 2, sp)(one).meta["param_shards"]
    return {k: (hand.get(k), plan.get(k)) for k in set(hand) | set(plan)
            if hand.get(k) != plan.get(k)}
