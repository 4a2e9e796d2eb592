"""The search finds the same best strategy as the exhaustive sweep."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.sweep import search
from distsim.sweep.search_space import weights_lower_bound as _weights_lower_bound


def test_search_finds_the_exhaustive_best():
    # every point trains the same 32 sequences: the search estimates them all,
    # simulates the 3 fastest estimates in full and must pick the exhaustive
    # sweep's fastest
    fixed = {"model": "tiny", "topology": "dgx-a100", "global_batch": 32}
    result = search("tiny", "dgx-a100", 8, base={"global_batch": 32}, keep=3,
                    network_mode="analytical", workers=1)
    exhaustive = distsim.sweep({**fixed, "network_mode": "analytical"},
                               {"dp": [1, 2, 4, 8], "tp": [1, 2, 4], "pp": [1, 2, 4],
                                "micro_batch": [1, 2, 4, 8]},
                               constraints=["dp * tp * pp == devices",
                                            "global_batch % (dp * micro_batch) == 0"],
                               workers=2, progress=False)
    ok = exhaustive[exhaustive["status"] == "ok"]
    ok = ok[~ok["oom"].fillna(False).astype(bool)].sort_values(["step_time_s", "index"])
    assert set(ok["resolved_global_batch"]) == {32}            # equal work everywhere
    best = ok.iloc[0]
    assert result.best == {"dp": int(best["dp"]), "tp": int(best["tp"]),
                           "pp": int(best["pp"]), "micro_batch": int(best["micro_batch"])}
    assert result.ranking.iloc[0]["step_time_s"] == pytest.approx(best["step_time_s"],
                                                                  rel=1e-9)
    assert len(result.estimates) == len(ok) + (result.estimates["status"] != "ok").sum()
    assert len(result.full) == 3 < len(ok)                  # it simulated only the 3 best
    assert set(result.estimates["fidelity"]) == {"estimate"}
    text = result.explain()
    assert text.startswith("best: ") and "runner-up" in text and "ms" in text


def test_search_simulates_the_best_estimates_in_full_with_reduction():
    result = search("tiny", "dgx-a100", 8, keep=2, network_mode="analytical", workers=1,
                    space={"zero": [0, 1]})
    assert len(result.full) == 2 and (result.full["status"] == "ok").all()
    assert set(result.full["fidelity"]) == {"simulate"}
    # the model's global batch (8) fixes the micro-batch sizes each dp allows
    assert set(result.estimates["resolved_global_batch"].dropna()) == {8}
    est = result.estimates[result.estimates["status"] == "ok"]
    assert (est["resolved_dp"] * est["micro_batch"] * est["resolved_microbatches"] == 8).all()
    assert set(result.axes) == {"dp", "tp", "pp", "zero", "micro_batch"}


def test_search_prints_progress(capsys):
    search("tiny", "dgx-a100", 8, keep=1, network_mode="analytical", workers=1,
           progress=True)
    err = capsys.readouterr().err
    assert "estimating" in err and "simulating the 1 fastest in full" in err
    assert "search: estimates" in err and "done" in err


def test_memory_bound_is_the_weights():
    # GPT-3 175B weights are 350 GB in bf16: with 8 x 80 GiB GPUs only
    # tp x pp >= 8 can hold them; the search prunes the rest unsimulated.
    bound = _weights_lower_bound("gpt3-175b", {})
    assert 340e9 < bound < 360e9
    assert _weights_lower_bound("gpt3-175b", {"layers": 1}) < bound / 50


def test_search_checks_its_input(capsys):
    with pytest.raises(ConfigError, match="has 8 devices"):
        search("tiny", "dgx-a100", 4)
    assert main(["search", "--model", "tiny", "--topology", "dgx-a100",
                 "--space", "tp=1,2"]) == 2
    assert "dp, tp and pp are always searched" in capsys.readouterr().err


def test_zero3_points_are_not_pruned_by_the_weights_bound():
    """ZeRO 3 shards the weights over the data-parallel ranks too, so the
    weights bound is weights / (tp x pp x dp) there: GPT-3 175B (350 GB of
    bf16 weights) on 8 x 80 GiB (85.9 GB) at dp 8, tp 1, pp 1 holds 44 GB of
    them per GPU, and is estimated, not pruned. Under ZeRO 1 (weights
    replicated over dp) the same point is pruned: 350 GB > 85.9 GB."""
    zero3 = search("gpt3-175b", "dgx-a100", 8, base={"zero": 3}, keep=1,
                   network_mode="analytical", workers=1)
    assert zero3.pruned.empty
    assert ((zero3.estimates["tp"] == 1) & (zero3.estimates["pp"] == 1)).any()
    zero1 = search("gpt3-175b", "dgx-a100", 8, base={"zero": 1}, keep=1,
                   network_mode="analytical", workers=1)
    reasons = zero1.pruned.set_index(["tp", "pp"])["reason"]
    assert reasons.loc[(1, 1)].iloc[0] == "weights alone need 349.2 GB per GPU > 85.9 GB"
    # searched over zero: only the points that are not ZeRO 3 are pruned
    both = search("gpt3-175b", "dgx-a100", 8, space={"zero": [1, 3]}, keep=1,
                  network_mode="analytical", workers=1)
    assert set(both.pruned["zero"]) == {1}


def test_nothing_fits_names_the_memory_options_not_searched():
    """When memory is what is short, the answer names the options that save
    it and were neither searched nor fixed."""
    plain = search("gpt3-175b", "dgx-a100", 8, keep=1, network_mode="analytical", workers=1)
    text = plain.explain()
    assert text.startswith("no strategy fits:")
    assert text.endswith("; to save memory, also search --space zero=0,1,2,3 "
                         "--space recompute=none,selective,full "
                         "--space attention=explicit,fused")
    fixed = search("gpt3-175b", "dgx-a100", 8, base={"zero": 3},
                   space={"recompute": ["none", "full"]}, keep=1,
                   network_mode="analytical", workers=1)
    # ZeRO fixed, recomputation searched: only the attention is left to name
    assert fixed.explain().endswith("; to save memory, also search "
                                    "--space attention=explicit,fused")
    # a model written with fused attention has no attention lever to name
    fused = search("gpt3-175b", "dgx-a100", 8, base={"attention": "fused"}, keep=1,
                   network_mode="analytical", workers=1)
    assert fused.explain().endswith("--space recompute=none,selective,full")


def test_mostly_out_of_memory_names_the_memory_options_too():
    """A best found while most layouts did not fit: the memory-saving
    options not searched are named, as when nothing fits (they may let a
    faster layout in); not when most fit."""
    tight = search("gpt3-13b", "dgx-a100", 8, base={"global_batch": 16}, keep=1,
                   network_mode="analytical", workers=1)
    est = tight.estimates
    n_oom = int(est["oom"].fillna(False).astype(bool).sum())
    n_ok = int((est["status"] == "ok").sum())
    assert tight.best is not None and 2 * n_oom >= n_ok > 0
    assert tight.explain().endswith(
        f"{n_oom} of the {n_ok} estimated strategies did not fit in memory; to save memory, "
        "also search --space zero=0,1,2,3 --space recompute=none,selective,full "
        "--space attention=explicit,fused")
    roomy = search("tiny", "dgx-a100", 8, base={"global_batch": 32}, keep=1,
                   network_mode="analytical", workers=1)
    assert "did not fit" not in roomy.explain()



def test_a_mixture_of_experts_is_estimated_by_the_tier_that_models_it(capsys):
    # each point by the estimator where it models a mixture of experts, else
    # by an analytical simulation; the column and the progress line say which
    moe = {"family": "gpt", "name": "tiny-moe", "layers": 2, "hidden": 32, "heads": 4,
           "vocab": 64, "seq": 16, "global_batch": 8, "experts": 4, "top_k": 2}
    result = search(moe, "workstation-4gpu-pcie", 4, keep=1, network_mode="analytical",
                    workers=1, progress=True)
    est = result.estimates
    assert (est["estimated_by"] == est["fidelity"]).all()
    assert (est["status"] == "ok").any() and len(result.ranking) == 1
    by = est["estimated_by"].value_counts()
    assert (f"estimated {len(est)}: {by.get('estimate', 0)} by the estimator, "
            f"{by.get('simulate', 0)} by analytical simulation") in capsys.readouterr().err
