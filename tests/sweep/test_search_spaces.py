"""What a search tries beyond dp x tp x pp: expert parallelism for a
mixture of experts, context parallelism, the schedule; which tier
estimates each point; the weights bound with experts; bad values."""
from __future__ import annotations

import pytest
import yaml

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.estimate import AGREEMENT_TOLERANCE
from distsim.sweep import search
from distsim.sweep.search_space import (expert_weights, model_config, weights_lower_bound,
                                        weights_per_gpu)

MOE = {"family": "gpt", "name": "tiny-moe", "layers": 2, "hidden": 32, "heads": 4,
       "vocab": 64, "seq": 16, "global_batch": 8, "experts": 4, "top_k": 2, "dtype": "bf16"}
WORKSTATION = "workstation-4gpu-pcie"     # 4 GPUs


def _direct(model, row, axes, **fixed):
    """distsim.simulate of a search row's point, whole (no reduction)."""
    options = {a: row[a] for a in axes if row[a] is not None and row[a] == row[a]}
    return distsim.simulate(model, WORKSTATION, network_mode="analytical",
                            **{k: (int(v) if isinstance(v, float) else v)
                               for k, v in {**fixed, **options}.items()})


def test_a_mixture_of_experts_searches_every_valid_ep():
    """ep by default: every degree dividing both dp and the 4 experts, at
    each (dp, tp, pp); the ranking is by simulated step time, and each
    figure is the point's own simulation."""
    result = search(MOE, WORKSTATION, 4, keep=3, network_mode="analytical", workers=1)
    est = result.estimates
    assert "ep" in result.axes
    pairs = {(int(r["dp"]), int(r["ep"])) for _, r in est.iterrows()}
    assert pairs == {(4, 1), (4, 2), (4, 4), (2, 1), (2, 2), (1, 1)}
    ok = est[est["status"] == "ok"]
    assert (ok["ep"] > 1).any()
    ranked = result.ranking["step_time_s"].tolist()
    assert ranked == sorted(ranked) and len(ranked) == 3
    # the three fastest first-stage figures were simulated in full
    assert sorted(result.ranking["estimate_s"]) == sorted(ok["step_time_s"])[:3]
    with_ep = ok[ok["ep"] == 2].iloc[0]
    direct = _direct(MOE, with_ep, result.axes)
    # an analytical simulation reduced by symmetry and coarsening: exact
    # in step time (the estimator, where it models the point: within its bound)
    rel = 1e-9 if with_ep["estimated_by"] == "simulate" else AGREEMENT_TOLERANCE
    assert with_ep["step_time_s"] == pytest.approx(direct.step_time_s, rel=rel)


def test_ep_with_zero_3_is_estimated():
    # ZeRO 3 with ep = dp (the experts' weights and gradients on a team of
    # one rank: not gathered, kept whole) and with ep < dp (each parameter
    # gathered over its own team): the estimator estimates both
    result = search(MOE, WORKSTATION, 4, space={"zero": [1, 3]}, keep=1,
                    network_mode="analytical", workers=1)
    est = result.estimates
    z3 = est[(est["ep"] > 1) & (est["zero"] == 3)]
    assert len(z3) and (z3["status"] == "ok").all()
    whole = z3["ep"] == z3["dp"]
    assert whole.any() and (~whole).any()
    assert (z3["estimated_by"] == "estimate").all()
    assert (est[(est["ep"] > 1) & (est["zero"] == 1)]["status"] == "ok").any()


def test_with_cp_ep_divides_dp_times_cp_and_is_estimated():
    """cp 2 on 4 GPUs: the experts see the cp ranks as data-parallel ones,
    so ep runs over the divisors of dp x cp and the 4 experts (dp 2: 1, 2,
    4; dp 1: 1, 2); the estimator estimates ep with cp (ZeRO 0/1)."""
    result = search(MOE, WORKSTATION, 4, space={"cp": [2]}, keep=1, network_mode="analytical",
                    workers=1)
    est = result.estimates
    pairs = {(int(r["dp"]), int(r["ep"])) for _, r in est.iterrows()}
    assert pairs == {(2, 1), (2, 2), (2, 4), (1, 1), (1, 2)}
    assert (est["status"] == "ok").all()
    assert set(est["estimated_by"]) == {"estimate"}


def test_explain_names_the_options_the_runner_up_differs_in():
    result = search(MOE, WORKSTATION, 4, keep=4, network_mode="analytical", workers=1)
    best, second = result.ranking.iloc[0], result.ranking.iloc[1]
    runner_up = result.explain().splitlines()[1]
    for a in result.axes:
        named = f"{a} {int(second[a])} (best {int(best[a])})"
        assert (named in runner_up) == (best[a] != second[a]), (a, runner_up)


def test_the_weights_bound_divides_the_experts_by_ep():
    # Mixtral-8x7B: 32 MoE layers of 8 SwiGLU experts of 3 x 4096 x 14336
    # weights, bf16
    config = model_config("mixtral-8x7b", {})
    experts = 32 * 8 * 3 * 4096 * 14336 * 2
    assert expert_weights(config) == experts
    assert expert_weights(model_config("tiny", {})) == 0
    total = weights_lower_bound("mixtral-8x7b", {})
    point = {"dp": 8, "tp": 1, "pp": 1}
    assert weights_per_gpu(total, experts, {**point, "ep": 8}, {}) == total - experts * 7 / 8
    assert weights_per_gpu(total, experts, point, {"ep": 4}) == total - experts * 3 / 4
    # and it is a lower bound: what a GPU of tiny-moe holds, simulated
    # (equal at tp 1, pp 1: every GPU holds the dense weights and 1/ep of
    # the experts)
    total, experts = weights_lower_bound(MOE, {}), expert_weights(model_config(MOE, {}))
    for strategy, equal in ((dict(dp=4, ep=4), True), (dict(dp=2, pp=2, ep=2), False)):
        run = distsim.simulate(MOE, WORKSTATION, **strategy)
        held = [m["weights"] for m in run.summary()["memory_by_category"].values()]
        bound = weights_per_gpu(total, experts, {"tp": 1, "pp": 1, **strategy}, {})
        assert min(held) >= bound and (min(held) == bound) == equal


def test_a_cp_space_is_estimated_and_refused_where_invalid(capsys):
    """cp 1, 2, 4 on 4 GPUs: dp x tp x pp x cp == 4 at every point; the
    estimator models context parallelism, so every valid point is
    estimated (column estimated_by, counted in the progress), a ring point
    within its bound of the simulation; cp 4 does not split a sequence
    of 20 into 8 chunks: invalid with the reason; cp_comm is only crossed
    with cp > 1."""
    result = search("tiny", WORKSTATION, 4, base={"seq": 20, "attention": "fused"},
                    space={"cp": [1, 2, 4], "cp_comm": ["allgather", "ring"]}, keep=2,
                    network_mode="analytical", workers=1, progress=True)
    est = result.estimates
    assert (est["dp"] * est["tp"] * est["pp"] * est["cp"] == 4).all()
    assert set(est.loc[est["cp"] == 1, "cp_comm"]) == {"allgather"}
    assert set(est.loc[est["cp"] == 2, "cp_comm"]) == {"allgather", "ring"}
    four = est[est["cp"] == 4]
    assert len(four) and (four["status"] == "invalid").all()
    assert four["reason"].str.contains("sequence length 20 is not a multiple of 2 x cp = 8").all()
    two = est[est["cp"] == 2]
    assert (two["status"] == "ok").all() and (two["estimated_by"] == "estimate").all()
    assert set(est.loc[est["cp"] == 1, "estimated_by"]) == {"estimate"}
    err = capsys.readouterr().err
    assert f"estimated {len(est)}: {len(est)} by the estimator, 0 by analytical simulation" in err
    ring = two[two["cp_comm"] == "ring"].iloc[0]
    direct = _direct("tiny", ring, result.axes, seq=20, attention="fused")
    assert ring["step_time_s"] == pytest.approx(direct.step_time_s, rel=AGREEMENT_TOLERANCE)
    assert set(result.full["estimated_by"]) <= {"estimate", "simulate"}


def test_a_non_gpt_model_is_estimated_by_simulation():
    result = search("mlp", "dgx-a100", 8, keep=1, network_mode="analytical", workers=1)
    assert set(result.estimates["estimated_by"]) == {"simulate"}
    assert result.full["estimated_by"].tolist() == ["simulate"]
    header, first = result.table().splitlines()[:2]
    assert "est. by" in header and " simulate " in first
    # every point pruned by the weights bound: nothing to estimate, said so
    none = search("mlp", "dgx-a100", 8, base={"hidden": 400_000}, keep=1,
                  network_mode="analytical", workers=1)
    assert none.estimates.empty and "estimated_by" in none.estimates
    assert none.explain() == "no strategy fits: 10 pruned (memory bound or batch)"


@pytest.mark.parametrize("flags,message", [
    (["--space", "ep=3"], "--space ep 3: does not divide the model's 4 experts"),
    (["--space", "cp=0"], "--space cp: must be a positive integer, got 0"),
    (["--space", "cp=1,3"], "--space cp 3: does not divide the 4 GPUs"),
    (["--space", "ep=8"], "--space ep 8: does not divide the 4 GPUs"),
])
def test_bad_cp_or_ep_values_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({**MOE, "experts": 8 if "ep=8" in flags else 4}))
    assert main(["search", "--model", str(path), "--topology", WORKSTATION, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_ep_on_a_dense_model_and_cp_on_a_non_gpt_are_refused():
    with pytest.raises(ConfigError, match="--space ep 2: model 'tiny' has no experts"):
        search("tiny", WORKSTATION, 4, space={"ep": [1, 2]})
    with pytest.raises(ConfigError, match="--space cp 2: context parallelism is modelled "
                                          "for GPT models only"):
        search("mlp", WORKSTATION, 4, space={"cp": [2]})
