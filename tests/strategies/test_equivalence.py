"""Every strategy and a set of compositions update the weights exactly as
the single-device step does (NumpyExecutor, float64, rtol 1e-9)."""
import pytest

from distsim.errors import ConfigError

STRATEGIES = [
    dict(dp=2),
    dict(dp=2, bucket_mb=0.001),
    dict(dp=2, bucket_mb=0),
    dict(tp=2),
    dict(tp=2, sp=True),
    dict(pp=2),
    dict(pp=2, schedule="gpipe"),
    dict(pp=2, schedule="interleaved"),
    dict(pp=4, microbatches=4, micro_batch=2, global_batch=8),
    dict(dp=2, zero=1),
    dict(dp=2, zero=2),
    dict(dp=2, zero=3),
    dict(recompute="selective"),
    dict(recompute="full"),
    dict(microbatches=4, micro_batch=2),
    # compositions
    dict(dp=2, tp=2, pp=2, schedule="1f1b", zero=1),
    dict(tp=2, sp=True, recompute="selective"),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3, schedule="interleaved", recompute="full"),
    dict(dp=2, tp=2, zero=2, bucket_mb=0.001),
    # ZeRO-3 with a layer's parameters gathered (and reduce-scattered) together
    dict(dp=2, zero=3, zero3_unit="layer"),
    dict(dp=4, zero=3, zero3_unit="layer", microbatches=2, micro_batch=1),
    dict(dp=2, tp=2, pp=2, zero=3, zero3_unit="layer", prefetch=2, recompute="selective"),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3, zero3_unit="layer", schedule="interleaved"),
    # zero-bubble ZB-H1: the backward split into input- and weight-gradient tasks
    dict(pp=2, schedule="zb-h1"),
    dict(pp=4, microbatches=4, micro_batch=2, global_batch=8, schedule="zb-h1"),
    dict(dp=2, tp=2, pp=2, schedule="zb-h1", zero=1, microbatches=4, bucket_mb=0.001),
    dict(dp=2, tp=2, pp=2, zero=2, schedule="zb-h1", microbatches=4),
    dict(dp=2, tp=2, pp=2, sp=True, zero=3, schedule="zb-h1", recompute="full"),
    dict(dp=2, tp=2, pp=2, zero=3, zero3_unit="layer", prefetch=2, recompute="selective",
         schedule="zb-h1"),
    dict(dp=2, pp=2, zero=2, schedule="zb-h1", microbatches=4, coarsen=True),
]


@pytest.mark.parametrize("strategy", STRATEGIES,
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_strategy_matches_single_device(reference, strategy):
    reference.check(**strategy)


@pytest.mark.parametrize("strategy", [
    dict(),
    dict(dp=2, zero=1),
    dict(dp=2, zero=2, microbatches=2),
    dict(dp=2, tp=2, pp=2, zero=3, recompute="selective"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "single")
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_with_master_weights_matches(make_reference, strategy, momentum):
    """SGD (fp32 master weights, weight decay, optional momentum) under
    every kind of sharding of its state updates like the single-device step."""
    ref = make_reference(optimizer="sgd", momentum=momentum)
    program = ref.check(**strategy)
    assert program.meta["optimizer"] == "sgd"
    states = {info.get("state") for info in program.meta["io"].values()}
    assert ("mom" in states) == (momentum > 0) and not states & {"m", "v"}


@pytest.mark.parametrize("vocab, strategy", [
    (33, dict(tp=2)),
    (33, dict(tp=4)),                       # 36 rows: the last rank holds 3 padding rows
    (5, dict(tp=4)),                        # 8 rows: the last rank holds only padding
    (33, dict(tp=2, pp=2)),                 # the output layer is its own (padded) copy
    (33, dict(dp=2, tp=2, sp=True, zero=3)),
])
def test_odd_vocabulary_padded_for_tensor_parallelism(make_reference, vocab, strategy):
    """A vocabulary that tp does not divide is padded (Megatron); the
    padding stays out of the softmax, so the step is the unpadded one."""
    program = make_reference(vocab=vocab, kv_heads=4).check(**strategy)
    assert program.meta["param_unpadded"]["wte"] == vocab


@pytest.mark.parametrize("strategy", [
    dict(pp=3),
    dict(dp=2, tp=2, pp=3, zero=1, microbatches=2),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_balanced_partition_matches(reference, strategy):
    """--partition balanced moves a layer off the stage that carries the
    embedding (4 layers on 3 stages: 1, 2, 1 instead of 2, 1, 1); the step
    still computes the same update."""
    program = reference.check(**strategy, partition="balanced")
    assert program.meta["stage_ranges"] == [(0, 1), (1, 3), (3, 4)]


def test_llama_style_model_matches(make_reference):
    ref = make_reference(norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False,
                    position="none", kv_heads=2, ffn=24)
    ref.check(dp=2, tp=2, pp=2, sp=True, zero=1)


@pytest.mark.parametrize("strategy, message", [
    (dict(tp=3), "does not divide the 4 attention heads"),
    (dict(pp=8), "pipeline stages but the model has only 4 layers"),
    (dict(pp=4, schedule="interleaved"), "pipeline stages"),
    (dict(pp=2, schedule="interleaved", microbatches=3, global_batch=6), "not a multiple of the 2"),
    (dict(dp=3), "not a multiple of dp x micro-batch"),
])
def test_bad_strategies_are_one_clear_error(reference, strategy, message):
    with pytest.raises(ConfigError, match=message):
        reference.lower(**strategy)
