"""ZeRO 0's per-layer profile is derived from ZeRO 1's (one template lowered
and simulated for both: distsim.estimate.profile.without_zero). Each
derived profile is checked here against a ZeRO-0 template lowered and
simulated on its own: every field the same, the update ops' times to the
last bits of a difference of two clock readings."""
from __future__ import annotations

import dataclasses
import math

import pytest

from distsim.estimate import point as est
from distsim.estimate import profile as ep
from distsim.sweep.batches import profile_group

GPT2 = {"model": "gpt2", "layers": 4, "global_batch": 32, "network_mode": "analytical"}


def _args(case: est.Case, zero: int) -> tuple:
    c, S = case.config, case.strategy
    items = tuple(sorted(dataclasses.replace(c, global_batch=c.micro_batch).to_dict().items()))
    return (items, S.tp, S.sp, S.recompute, zero, c.micro_batch, S.pp > 1,
            case.topology_name, case.collective_algo, S.optimizer)


def _without_update_times(profile: ep.LayerProfile) -> dict:
    out = dataclasses.asdict(profile)
    out.pop("wall_s")
    for params in out["params"].values():
        for p in params:
            p["opt_update"] = [flops for _, flops in p["opt_update"]]
    return out


@pytest.mark.parametrize("options", [
    dict(model="gpt2", tp=1, pp=1, recompute="none"),
    dict(model="gpt2", tp=2, pp=2, recompute="full", micro_batch=2, optimizer="sgd"),
    dict(model="gpt2", tp=2, pp=2, recompute="selective", sp=True),
    dict(model="gpt2", tp=4, pp=1, recompute="full", optimizer="sgd"),
    dict(model="llama2-7b", tp=2, pp=2, recompute="none"),
])
def test_zero0s_profile_from_zero1s_is_the_one_its_own_template_gives(options):
    case = est.resolve({**GPT2, "topology": "dgx-a100", **options})
    built = ep.build_profile(*_args(case, 0))
    from_one = ep.without_zero(ep.build_profile(*_args(case, 1)))
    assert _without_update_times(from_one) == _without_update_times(built)
    for blk, params in built.params.items():
        for p, q in zip(params, from_one.params[blk]):
            assert len(p.opt_update) == len(q.opt_update) > 0
            for (t, _), (u, _) in zip(p.opt_update, q.opt_update):
                # the same ops, timed at other absolute times: the last bits
                # of a difference of two clock readings
                assert math.isclose(t, u, rel_tol=1e-11), (p.name, t, u)
    # and ZeRO 1's own profile does differ where ZeRO 0's was changed: the
    # flat copy and the two reshapes
    one = ep.build_profile(*_args(case, 1))
    wte = next(p for p in one.params[ep.EMB] if p.name == "wte")
    assert wte.opt_flat > 0 and wte.opt_pre > 0 and wte.opt_post > 0


def test_the_cached_profile_of_zero0_is_derived_not_built(monkeypatch):
    case = est.resolve({**GPT2, "topology": "dgx-a100", "tp": 2, "layers": 3})
    built = []
    real = ep.build_profile
    monkeypatch.setattr(ep, "build_profile", lambda *a, **k: built.append(a[4]) or real(*a, **k))
    ep.layer_profile.cache_clear()
    try:
        # every argument given, as the estimator gives them (the cache's
        # key is the call's form)
        zero0 = ep.layer_profile(*_args(case, 0), None, "megatron", False, 1, "inputs", 1,
                                   "allgather", False, False)
        zero1 = ep.layer_profile(*_args(case, 1), None, "megatron", False, 1, "inputs", 1,
                                   "allgather", False, False)
    finally:
        ep.layer_profile.cache_clear()
    assert built == [1]                  # one template, ZeRO 1's
    assert zero0.blocks is zero1.blocks and zero0.params is not zero1.params
    assert all(p.opt_flat == 0 and p.opt_pre == 0.0 for ps in zero0.params.values() for p in ps)


def test_zero_0_1_and_2_points_share_a_batch_group_and_zero_3_has_its_own():
    groups = [profile_group({**GPT2, "fidelity": "estimate", "tp": 2, "pp": 4, "zero": z})
              for z in (0, 1, 2, 3)]
    assert groups[0] == groups[1] == groups[2] != groups[3]
    assert profile_group({**GPT2, "fidelity": "estimate", "tp": 2, "pp": 1, "zero": 0}) \
        != groups[0]                     # a pipeline unties the head: another profile
