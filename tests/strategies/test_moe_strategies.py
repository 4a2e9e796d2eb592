"""A mixture-of-experts GPT (routed experts top-2 of 4, a shared expert,
the first layer dense) under data, pipeline and tensor parallelism, ZeRO
and recomputation updates the weights as its single-device step does
(NumpyExecutor, float64); tensor parallelism splits every expert's FFN
as a dense MLP's (the megatron plan's column/row pairs). Every expert has room for every token
(``routing_skew: 1``), so that no token is dropped in either the global
batch or a data-parallel rank's micro-batch: the two route the same."""
import pytest

MOE = dict(experts=4, top_k=2, expert_ffn=8, shared_experts=1, dense_layers=1,
           activation="swiglu", routing_skew=1.0)


@pytest.fixture(scope="module")
def moe_reference(make_reference):
    return make_reference(**MOE)


@pytest.mark.parametrize("strategy", [
    dict(),
    dict(dp=2),
    dict(dp=2, bucket_mb=0.001),
    dict(pp=2),
    dict(dp=2, zero=1),
    dict(dp=2, zero=3),
    dict(recompute="full"),
    dict(dp=2, pp=2, zero=2, recompute="selective", schedule="interleaved"),
    dict(tp=2),
    dict(tp=2, sp=True, dp=2),
    dict(dp=2, tp=2, pp=2, zero=3, zero3_unit="layer", recompute="selective"),
    # expert parallelism: each rank of an ep group holds experts / ep, all-to-all
    # dispatch and combine, the experts' gradients synced over dp / ep ranks
    dict(dp=2, ep=2),
    dict(dp=4, ep=2),
    dict(dp=4, ep=4),
    dict(dp=2, ep=2, tp=2),
    # with sequence parallelism each tp rank routes its sequence shard (Megatron-LM's
    # MoE layer): all-to-all over ep, then the slots all-gathered over tp for the
    # experts' split FFNs, reduce-scattered back
    dict(dp=2, ep=2, tp=2, sp=True),
    dict(dp=4, ep=2, tp=2, sp=True),
    dict(dp=4, ep=2, tp=2, sp=True, zero=1, pp=2, recompute="selective"),
    # ZeRO 3: the experts' weights sharded over their dp / ep ranks, gathered
    # there before use, their gradients reduce-scattered there
    dict(dp=2, ep=2, zero=3),
    dict(dp=4, ep=2, zero=3),
    dict(dp=4, ep=2, zero=3, zero3_unit="layer"),
    dict(dp=4, ep=2, zero=3, zero3_unit="layer", prefetch=2, pp=2, tp=2, sp=True),
    dict(dp=4, ep=2, zero=3, bucket_mb=0, recompute="full"),
    dict(dp=2, ep=2, zero=1),
    dict(dp=4, ep=2, zero=1),
    dict(dp=4, ep=2, zero=2),
    dict(dp=4, ep=2, bucket_mb=0.001),
    dict(dp=2, ep=2, pp=2, bucket_mb=0, recompute="full"),
    dict(dp=4, ep=2, coarsen=True),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "single")
def test_moe_strategy_matches_single_device(moe_reference, strategy):
    moe_reference.check(**strategy)


@pytest.fixture(scope="module")
def dropless_reference(make_reference):
    # uniform routing: a padded dispatch would drop tokens past tokens x 2 / 4
    # slots; a dropless one has room for every token in every expert
    return make_reference(**dict(MOE, routing_skew=0.0, dispatch="dropless"))


@pytest.mark.parametrize("strategy", [
    dict(),
    dict(dp=2),
    dict(dp=2, ep=2),
    dict(dp=4, ep=4),
    dict(dp=2, ep=2, tp=2, sp=True),
    dict(dp=4, ep=2, tp=2, sp=True, zero=1, pp=2, recompute="selective"),
    dict(dp=4, ep=2, zero=3),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "single")
def test_dropless_strategy_matches_single_device(dropless_reference, strategy):
    dropless_reference.check(**strategy)


@pytest.fixture(scope="module")
def allgather_reference(make_reference):
    return make_reference(**dict(MOE, dispatch="allgather"))


@pytest.mark.parametrize("strategy", [
    dict(),
    dict(dp=2, ep=2),
    dict(dp=4, ep=2),
    dict(dp=4, ep=4),
    dict(dp=2, ep=2, tp=2),
    dict(dp=4, ep=2, zero=3),
    dict(dp=2, ep=2, pp=2, recompute="full"),
    dict(dp=4, ep=2, coarsen=True),
    # sequence parallelism: each tp rank gathers its sequence shard's tokens over ep
    dict(dp=2, ep=2, tp=2, sp=True),
    dict(dp=4, ep=2, tp=2, sp=True, zero=1, pp=2, recompute="selective"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "single")
def test_allgather_strategy_matches_single_device(allgather_reference, strategy):
    # the all-gather dispatcher: each rank gathers its group's tokens, its
    # experts take theirs, their partial outputs are reduce-scattered back
    allgather_reference.check(**strategy)
