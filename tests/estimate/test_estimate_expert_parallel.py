"""The estimator under expert parallelism (``ep`` > 1): the template is one
expert-parallel group (dp = ep), so each MoE block holds its dispatch and
combine all-to-alls and the experts' weights at their 1/ep shape; each
parameter is synchronised and ZeRO-sharded over its own team (dp, or dp / ep
for an expert's weights) by its own sync policy, as the lowering does. With
tensor and sequence parallelism the template holds the MoE layer's tp
all-gather and reduce-scatter of the slots beside its all-to-alls: covered
as they are (the profile is the lowered template)."""
from __future__ import annotations

import pytest
from estimate_pairs import assert_within_bounds

from distsim.errors import ConfigError
from distsim.estimate import cache_key, estimate, resolve
from distsim.estimate.blocks import MOE
from distsim.estimate.context import StepContext
from distsim.estimate.point import _profile_for
from distsim.ir.comm import CollectiveType
from distsim.models.gpt import GPTConfig
from distsim.models.moe import expert_slots
from distsim.sim.solo_time import collective_time
from distsim.topology import load_topology

#: a small GPT whose MLPs route to top-2 of 4 SwiGLU experts of 64, with
#: a shared expert; and the same with its first layer dense (its experts' weights:
#: EXPERTS, the router and the shared expert not among them)
ALL_MOE = {"family": "gpt", "name": "small-moe", "layers": 4, "hidden": 64, "heads": 4,
           "vocab": 128, "seq": 32, "global_batch": 8, "experts": 4, "top_k": 2,
           "expert_ffn": 64, "shared_experts": 1, "activation": "swiglu"}
FIRST_DENSE = {**ALL_MOE, "name": "first-dense", "dense_layers": 1}
EXPERTS = ("experts_b1", "experts_b2", "experts_w1", "experts_w2")


def _options(model, **strategy):
    return {"model": model, "topology": "dgx-a100", "network_mode": "analytical", **strategy}


def test_the_moe_block_holds_its_all_to_alls_timed_on_the_expert_parallel_team():
    # tp 1: the block's only collectives are the dispatch's and the combine's
    # all-to-all of this rank's slots (experts x slots x hidden, bf16) over
    # its ep team, data-parallel ranks 0 and 1; the backward has their two
    # gradients, the same all-to-alls
    case = resolve(_options(ALL_MOE, dp=8, ep=2))
    block = _profile_for(case).blocks["layer"]
    c = GPTConfig.from_dict({k: v for k, v in ALL_MOE.items() if k not in ("family", "name")})
    slots = expert_slots(c, ALL_MOE["seq"])           # micro-batch 1: seq tokens
    assert slots == 16                                 # 32 tokens x top-2 / 4 experts
    nbytes = ALL_MOE["experts"] * slots * ALL_MOE["hidden"] * 2
    a2a = collective_time(load_topology("dgx-a100"), "analytical", CollectiveType.ALL_TO_ALL,
                          (0, 1), nbytes)[0]
    assert block.tp_comm_f == pytest.approx(2 * a2a, rel=1e-12)
    assert block.tp_comm_b == pytest.approx(2 * a2a, rel=1e-12)
    # without expert parallelism the block has no collective
    assert _profile_for(resolve(_options(ALL_MOE, dp=8))).blocks["layer"].tp_comm_f == 0.0


def test_the_experts_weights_are_a_1_over_ep_share_on_their_own_team():
    plain = resolve(_options(FIRST_DENSE, dp=8))
    case = resolve(_options(FIRST_DENSE, dp=8, ep=4))
    whole = {p.name: p for p in _profile_for(plain).params[MOE]}
    ctx = StepContext(case, _profile_for(case))
    experts = [p for p in ctx.profile.params[MOE] if p.expert]
    assert sorted(p.name.split("_", 1)[1] for p in experts) == sorted(EXPERTS)
    for p in ctx.profile.params[MOE]:
        assert p.numel * (4 if p.expert else 1) == whole[p.name].numel
        assert ctx.team(p) == (2 if p.expert else 8)       # dp / ep, or dp
    # the dense layer, the embedding and the head hold no expert
    assert not any(p.expert for blk in ("emb", "layer", "head")
                   for p in ctx.profile.params[blk])
    # an expert's gradient is all-reduced over its expert-data-parallel team:
    # data-parallel ranks 0 and 4 (e, e + ep)
    assert ctx.edp_team == (0, 4)
    # ep is part of the profile's key
    assert cache_key(_options(FIRST_DENSE, dp=8, ep=4)) != cache_key(_options(FIRST_DENSE, dp=8))


@pytest.mark.parametrize("model,strategy", [
    (ALL_MOE, dict(dp=8, ep=2)),
    (ALL_MOE, dict(dp=8, ep=4, zero=1, global_batch=32)),
    (ALL_MOE, dict(dp=8, ep=2, zero=2, global_batch=32)),
    (ALL_MOE, dict(dp=4, pp=2, ep=4, zero=1, global_batch=4)),    # one micro-batch
    (ALL_MOE, dict(dp=4, pp=2, ep=2, zero=2, global_batch=4)),    # ... reduce-scattered
    (FIRST_DENSE, dict(dp=4, tp=2, ep=2, recompute="full")),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=4, zero=1, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=2, zero=2, bucket_mb=0, global_batch=16)),
    (FIRST_DENSE, dict(dp=8, ep=2, bucket_mb=0.01, global_batch=32)),
    (FIRST_DENSE, dict(dp=2, tp=2, pp=2, ep=2, schedule="interleaved", virtual_stages=2,
                       global_batch=8, recompute="selective")),
    (ALL_MOE, dict(dp=4, pp=2, ep=2, schedule="zb-h1", global_batch=16)),
    (ALL_MOE, dict(dp=8, ep=2, zero=2, global_batch=16, comm_streams="per-group")),
    # ZeRO 2 with ep = dp: the experts' gradients (a team of one rank) kept
    # whole, the others reduce-scattered each micro-batch or after the
    # backward (bucket_mb 0); 1.3-4.0 % over in step time while every
    # gradient was flattened and reduce-scattered
    (ALL_MOE, dict(dp=4, tp=2, ep=4, zero=2, global_batch=16)),
    (ALL_MOE, dict(dp=4, pp=2, ep=4, zero=2, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, tp=2, ep=4, zero=2, bucket_mb=0, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=4, zero=2, global_batch=4)),    # one micro-batch
    # with sequence parallelism (each tp rank routes its sequence shard): the
    # block's all-to-alls and its tp all-gather and reduce-scatter of the slots
    (ALL_MOE, dict(dp=4, tp=2, sp=True, ep=2)),
    (FIRST_DENSE, dict(dp=4, tp=2, sp=True, ep=2, recompute="full")),
    (FIRST_DENSE, dict(dp=2, tp=2, pp=2, sp=True, ep=2, zero=1, global_batch=16,
                       recompute="selective")),
    # ZeRO 3 by parameter: each parameter gathered and reduce-scattered over
    # its own team (the experts' over dp / ep); these were 6.6-13.6 % over in
    # step time when every gather was timed over dp
    (ALL_MOE, dict(dp=8, ep=2, zero=3)),
    (ALL_MOE, dict(dp=8, ep=2, zero=3, prefetch=0)),
    (ALL_MOE, dict(dp=8, ep=4, zero=3, global_batch=32)),
    (FIRST_DENSE, dict(dp=4, tp=2, ep=2, zero=3)),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=2, zero=3, global_batch=16)),
    # ZeRO 3 with ep = dp: the experts' weights (a team of one rank) not
    # gathered and their gradients kept whole, beside the others gathered
    # and reduce-scattered over dp; by parameter, prefetching or not, with a
    # pipeline under each schedule
    (ALL_MOE, dict(dp=4, pp=2, ep=4, zero=3, global_batch=16)),
    (ALL_MOE, dict(dp=4, tp=2, ep=4, zero=3, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, tp=2, ep=4, zero=3, bucket_mb=0, global_batch=16)),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=4, zero=3, prefetch=0, global_batch=4)),
    (FIRST_DENSE, dict(dp=2, tp=2, pp=2, ep=2, zero=3, schedule="interleaved",
                       virtual_stages=2, global_batch=8)),
    (ALL_MOE, dict(dp=4, pp=2, ep=4, zero=3, prefetch=0, schedule="gpipe", global_batch=16)),
    # ZeRO 3 by layer, refused while the walk knew one unit per block. With
    # ep < dp a MoE block's two units, the others' over dp and the
    # experts' over dp / ep (with one unit these were 2.5-8.4 % over in
    # step time; with both and one micro-batch 2.4 % under while the
    # experts' shards' average over their ep ranks' tokens was left out)
    (ALL_MOE, dict(dp=8, ep=2, zero=3, zero3_unit="layer")),
    (ALL_MOE, dict(dp=8, ep=2, zero=3, zero3_unit="layer", prefetch=0)),
    (ALL_MOE, dict(dp=8, ep=2, zero=3, zero3_unit="layer", prefetch=2, global_batch=16)),
    (ALL_MOE, dict(dp=8, ep=4, zero=3, zero3_unit="layer", global_batch=32)),
    (FIRST_DENSE, dict(dp=4, tp=2, ep=2, zero=3, zero3_unit="layer")),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=2, zero=3, zero3_unit="layer", global_batch=16)),
    (ALL_MOE, dict(dp=4, pp=2, ep=2, zero=3, zero3_unit="layer", prefetch=0,
                   schedule="gpipe", global_batch=8)),
    # with ep = dp the block's one unit the others' parameters, the
    # experts' weights (a team of one rank) in none
    (ALL_MOE, dict(dp=4, pp=2, ep=4, zero=3, zero3_unit="layer", global_batch=16)),
    (ALL_MOE, dict(dp=4, tp=2, ep=4, zero=3, zero3_unit="layer", global_batch=16)),
    (FIRST_DENSE, dict(dp=4, tp=2, ep=4, zero=3, zero3_unit="layer", bucket_mb=0,
                       global_batch=16)),
    (FIRST_DENSE, dict(dp=4, pp=2, ep=4, zero=3, zero3_unit="layer", prefetch=0,
                       global_batch=4)),
    (FIRST_DENSE, dict(dp=2, tp=2, pp=2, ep=2, zero=3, zero3_unit="layer",
                       schedule="interleaved", virtual_stages=2, global_batch=8)),
], ids=lambda x: x.get("name") if "family" in x else ",".join(f"{k}={v}" for k, v in x.items()))
def test_the_estimate_agrees_with_the_simulation(model, strategy):
    assert_within_bounds(_options(model, **strategy))


def test_what_it_does_not_model_is_refused_in_one_line():
    # invalid points are refused as the simulator refuses them
    with pytest.raises(ConfigError, match="--ep 8 does not divide"):
        estimate(_options(ALL_MOE, dp=8, ep=8))
    with pytest.raises(ConfigError, match="no experts"):
        estimate(_options("tiny", dp=8, ep=2))


def test_a_layers_gathers_go_over_each_parameters_team_the_others_first():
    # the lowering's decision (sync_policy.layer_gathers), which the
    # estimator's gather plan asks too: under ep 2 over dp 8 the experts'
    # weights (positions 1 and 3) gather over their 4 ranks after the
    # others, over 8; by layer a unit of each team (those it divides)
    from distsim.transforms.strategy import Strategy
    from distsim.transforms.sync_policy import layer_gathers, sync_team
    S = Strategy(dp=8, ep=2, zero=3)
    assert (sync_team(S, False), sync_team(S, True)) == (8, 4)
    numels = [64, 4096, 100, 8192]
    experts = [False, True, False, True]
    assert layer_gathers(numels, experts, S) == [((0,), False), ((2,), False), ((1,), True),
                                                 ((3,), True)]
    by_layer = Strategy(dp=8, ep=2, zero=3, zero3_unit="layer")
    # 64 and 100: 8 divides 64 only (no unit of one); 4 divides both experts'
    assert layer_gathers(numels, experts, by_layer) == [((0,), False), ((2,), False),
                                                        ((1, 3), True)]


def _context(model, **strategy):
    """The step context of ``model`` under ``strategy`` on a DGX A100, and
    that topology."""
    case = resolve(_options(model, **strategy))
    return StepContext(case, _profile_for(case)), load_topology("dgx-a100")


def _moe_gather_plans(ctx):
    """Per task kind, the MoE block's gathered parameters and its gather plan."""
    from distsim.estimate.gates import gather_plan
    blk = ctx.profile.blocks[MOE]
    for kind, gathered in (("F", blk.f_gather), ("B", blk.b_gather)):
        yield (kind, [ctx.profile.params[owner][i] for owner, i in gathered],
               gather_plan(ctx, kind, MOE))


def test_under_zero3_with_ep_equal_to_dp_the_experts_weights_are_not_gathered():
    # dp 4 tp 2 ep 4: the experts' team is one rank, over which the lowering
    # emits no collective. The MoE block's gather plan has one all-gather per
    # other parameter, over the dp ranks of tp rank 0 (0, 2, 4, 6), timed
    # as the simulator times it alone; none for the experts' weights, whose
    # reads wait for no gather past the others' read before them
    ctx, topo = _context(FIRST_DENSE, dp=4, tp=2, ep=4, zero=3)
    for kind, params, plan in _moe_gather_plans(ctx):
        others = [j for j, p in enumerate(params) if not p.expert]
        assert plan.alone == tuple(j for j, p in enumerate(params) if p.expert)
        assert {params[j].name.split("_", 1)[1] for j in plan.alone} <= set(EXPERTS)
        assert len(plan.alone) >= 2
        assert plan.members == tuple((j,) for j in others)
        assert plan.items == [collective_time(topo, "analytical", CollectiveType.ALL_GATHER,
                                              (0, 2, 4, 6),
                                              params[j].numel * params[j].dtype.itemsize)[0]
                              for j in others]
        for j in range(len(params)):
            read = [g for g, o in enumerate(others) if o <= j]
            assert plan.upto[j] == (read[-1] if read else -1)


def test_by_layer_with_ep_equal_to_dp_the_unit_is_the_others_parameters():
    # dp 4 tp 2 ep 4, zero3_unit layer: the MoE block's one unit is the
    # parameters other than the experts' that dp 4 divides, gathered as one
    # all-gather of their whole bytes over the dp ranks of tp rank 0
    # (0, 2, 4, 6); the experts' weights (a team of one rank, numels 4
    # divides too) in no unit and gathered over no team; its gradients'
    # unit the same parameters, their bytes whole
    from distsim.estimate.gathered_walk import item_bytes
    ctx, topo = _context(FIRST_DENSE, dp=4, tp=2, ep=4, zero=3, zero3_unit="layer")
    for kind, params, plan in _moe_gather_plans(ctx):
        unit = tuple(j for j, p in enumerate(params) if not p.expert and p.numel % 4 == 0)
        assert len(unit) > 1 and any(p.expert and p.numel % 4 == 0 for p in params)
        assert plan.members[0] == unit and plan.first == unit[0]
        assert plan.alone == tuple(j for j, p in enumerate(params) if p.expert)
        whole = sum(params[j].numel * params[j].dtype.itemsize for j in unit)
        assert plan.unit_bytes == whole
        assert plan.items[0] == collective_time(topo, "analytical", CollectiveType.ALL_GATHER,
                                                (0, 2, 4, 6), whole)[0]
        # per item: its first parameter, the shards' bytes (1/4 each), the whole bytes
        assert item_bytes(ctx, kind, MOE)[0] == (unit[0], whole // 4, whole)
    params = ctx.profile.params[MOE]
    units = ctx.grad_units(MOE)
    assert len(units) == 1
    grads = units[0]
    assert sorted(grads) == [i for i, p in enumerate(params)
                             if not p.expert and p.numel % 4 == 0]
    assert ctx.unit_bytes(MOE, grads) == sum(params[i].numel * params[i].dtype.itemsize
                                             for i in grads)


def test_by_layer_with_ep_below_dp_a_moe_block_has_two_units_each_over_its_team():
    # dp 8 ep 2, zero3_unit layer: the MoE block gathers the others' unit
    # (the parameters 8 divides) over the 8 data-parallel ranks, then the
    # experts' unit (all four, 4 divides each) over their team of 4 ranks
    # (0, 2, 4, 6): two all-gathers of their whole bytes, two copy-ins, each
    # unit split at its own first read; its gradients two units the same
    from distsim.estimate.gates import gather_plan
    ctx, topo = _context(ALL_MOE, dp=8, ep=2, zero=3, zero3_unit="layer")
    params = [ctx.profile.params[owner][i] for owner, i in ctx.profile.blocks["layer"].f_gather]
    plan = gather_plan(ctx, "F", "layer")
    others = tuple(j for j, p in enumerate(params) if not p.expert and p.numel % 8 == 0)
    experts = tuple(j for j, p in enumerate(params) if p.expert)
    assert len(others) > 1 and len(experts) == 4
    assert plan.units == (others, experts) and plan.members[0] == others
    assert plan.members[-1] == experts and plan.alone == ()
    for unit, team in ((others, tuple(range(8))), (experts, (0, 2, 4, 6))):
        whole = sum(params[j].numel * params[j].dtype.itemsize for j in unit)
        assert plan.items[plan.members.index(unit)] == collective_time(
            topo, "analytical", CollectiveType.ALL_GATHER, team, whole)[0]
    # each unit's split comes in with the run that first reads it
    assert plan.read_change(-1, others[0]) == pytest.approx(
        plan.unit_splits[0] - sum(plan.reshape_s[:others[0] + 1]))
    assert plan.read_change(experts[0] - 1, experts[0]) == pytest.approx(
        plan.unit_splits[1] - plan.reshape_s[experts[0]])
    grads = ctx.profile.params["layer"]
    units = ctx.grad_units("layer")
    assert sorted(map(sorted, units)) == sorted(
        [[i for i, p in enumerate(grads) if not p.expert and p.numel % 8 == 0],
         [i for i, p in enumerate(grads) if p.expert]])
    assert {ctx.unit_team("layer", u) for u in units} == {8, 4}
