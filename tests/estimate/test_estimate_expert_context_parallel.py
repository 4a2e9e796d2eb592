"""The estimator under expert parallelism with context parallelism under
ZeRO 2 and ZeRO 3 by parameter: the lowering cuts the expert-parallel
groups from the dp x cp ranks (the cp ranks are data-parallel ranks for
the weights), so an expert's gradient is synchronised, ZeRO-sharded and
(ZeRO 3) gathered over (dp x cp) / ep ranks, a team of one where ep = dp x
cp (its gradient kept whole and accumulated in place, its weights not
gathered). Under ZeRO 3 only that team of one is modelled. The walk takes the flat view
(:meth:`~distsim.transforms.strategy.Strategy.flat_cp`) and asks the
lowering's :func:`~distsim.transforms.sync_policy.sync_team` per parameter.
The sub-cases measured past the bound stay refused."""
from __future__ import annotations

import pytest
from estimate_pairs import INPUTS_UNFUSED, assert_within_bounds

from distsim.errors import NotModelledError
from distsim.estimate import estimate, resolve
from distsim.estimate.blocks import MOE
from distsim.estimate.context import StepContext
from distsim.estimate.point import _profile_for

#: top-2 of 4 SwiGLU experts with a shared expert, the first layer dense;
#: and every layer a mixture of experts
FIRST_DENSE = {"family": "gpt", "name": "first-dense", "layers": 4, "hidden": 32, "heads": 4,
               "vocab": 64, "seq": 32, "global_batch": 8, "experts": 4, "top_k": 2,
               "expert_ffn": 64, "shared_experts": 1, "dense_layers": 1,
               "activation": "swiglu"}
ALL_MOE = {**FIRST_DENSE, "name": "all-moe", "hidden": 64, "dense_layers": 0}


def _options(model, topology="workstation-4gpu-pcie", **strategy):
    return {"model": model, "topology": topology, "network_mode": "analytical",
            **INPUTS_UNFUSED, **strategy}


@pytest.mark.parametrize("dp,cp,ep,team", [(2, 2, 2, 2), (2, 2, 4, 1), (1, 4, 4, 1),
                                           (1, 4, 2, 2)])
def test_the_experts_team_is_cut_from_the_dp_x_cp_ranks(dp, cp, ep, team):
    # (dp x cp) / ep ranks hold the same experts; a team of one keeps its
    # gradient whole (no reduce-scatter each micro-batch), the others' over dp x cp
    case = resolve(_options(FIRST_DENSE, dp=dp, cp=cp, ep=ep, zero=2))
    ctx = StepContext(case, _profile_for(case))
    assert ctx.dp == dp * cp
    params = ctx.profile.params[MOE]
    for i, p in enumerate(params):
        assert ctx.team(p) == (team if p.expert else dp * cp)
        assert ctx.scatters(MOE, i) == (team > 1 or not p.expert)
    assert any(p.expert for p in params)


@pytest.mark.parametrize("model,strategy", [
    (FIRST_DENSE, dict(dp=2, cp=2, ep=2, zero=2)),
    (FIRST_DENSE, dict(dp=2, cp=2, ep=4, zero=2)),                  # ep = dp x cp
    (ALL_MOE, dict(dp=1, cp=4, ep=4, zero=2, bucket_mb=0)),
    (FIRST_DENSE, dict(dp=2, cp=2, ep=4, zero=3)),                  # ep = dp x cp
    (ALL_MOE, dict(dp=1, cp=4, ep=4, zero=3, bucket_mb=0)),
    (FIRST_DENSE, dict(dp=2, cp=2, ep=4, tp=2, zero=2, topology="dgx-a100")),
    (ALL_MOE, dict(dp=2, cp=2, ep=4, tp=2, zero=3, topology="dgx-a100")),   # ep = dp x cp
])
def test_expert_and_context_parallelism_under_zero_2_and_3_agree_with_the_simulation(
        model, strategy):
    assert_within_bounds(_options(model, **strategy))


@pytest.mark.parametrize("strategy,what", [
    (dict(dp=2, cp=2, ep=2, zero=3), "ZeRO 3 with ep < dp x cp .*team of 2 ranks"),
    (dict(dp=2, cp=2, ep=4, zero=3, cp_comm="ring", attention="fused"), "ring attention"),
    (dict(dp=1, cp=2, ep=2, pp=2, zero=2, schedule="zb-h1", global_batch=4),
     "ZeRO 2 and schedule 'zb-h1'"),
])
def test_the_sub_cases_past_the_bound_are_refused_in_one_line(strategy, what):
    with pytest.raises(NotModelledError, match=what) as err:
        estimate(_options(FIRST_DENSE, **strategy))
    assert "\n" not in str(err.value) and "fidelity: simulate" in str(err.value)
