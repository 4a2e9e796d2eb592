"""ZeRO points whose parameters do not shard evenly over dp: the estimator
refuses exactly the points the simulator refuses, and the full simulations
of `check:` and of search run such points without symmetry instead of
refusing them."""
from __future__ import annotations

import distsim
from distsim.sweep.search import search


def test_estimate_refuses_the_zero_points_simulate_refuses():
    """tp 2 x dp 4 on 8 GPUs. hidden 2: 'l0_bqkv' holds 3 elements per rank,
    fewer than dp (ZeRO 2/3 refused) and not a multiple of it (symmetry
    refused); hidden 4: 6 elements, enough for ZeRO 3 but still uneven
    under symmetry."""
    df = distsim.sweep({"model": "tiny", "topology": "dgx-a100", "tp": 2, "heads": 2},
                       {"fidelity": ["simulate", "estimate"], "hidden": [2, 4],
                        "zero": [1, 3], "symmetry": [False, True]},
                       workers=1, progress=False)
    rows = {}
    for _, r in df.iterrows():
        rows.setdefault((r["hidden"], r["zero"], r["symmetry"]), {})[r["fidelity"]] = r
    assert len(rows) == 8
    for key, by in rows.items():
        sim, est = by["simulate"], by["estimate"]
        assert (sim["status"], sim["reason"]) == (est["status"], est["reason"]), key
    reasons = {k: by["estimate"]["reason"] for k, by in rows.items()
               if by["estimate"]["status"] == "invalid"}
    assert sorted(reasons) == [(2, 1, True), (2, 3, False), (2, 3, True), (4, 1, True),
                               (4, 3, True)]
    assert reasons[(2, 3, False)] == (
        "ZeRO 3: parameter 'l0_bqkv' has 3 elements, fewer than the 4 data-parallel ranks to "
        "shard it over (use --zero 1 or a smaller --dp)")
    assert reasons[(4, 1, True)].startswith(
        "ZeRO 1 with symmetry: parameter 'l0_bqkv' (6 elements) does not split evenly over dp 4")


def test_check_and_search_simulate_without_symmetry_where_shards_differ():
    """The full simulations of `check:` and of search add symmetry (faster,
    exact); a ZeRO point whose shards differ between ranks is simulated
    without it rather than refused as invalid ('... with symmetry')."""
    base = {"model": "tiny", "topology": "dgx-a100", "hidden": 36, "heads": 4, "zero": 1,
            "fidelity": "estimate"}       # 'l0_bqkv': 108 elements, dp 8
    df = distsim.sweep(base, {"micro_batch": [1]}, check=1, workers=1, progress=False)
    checked = df[df["fidelity"] == "simulate"]
    assert len(checked) == 1 and checked["status"].tolist() == ["ok"], checked["reason"].tolist()
    result = search("tiny", "dgx-a100", 8, base={"hidden": 36, "heads": 4},
                    space={"zero": [1]}, keep=2, workers=1, network_mode="analytical")
    assert len(result.full) == 2 and (result.full["status"] == "ok").all(), \
        result.full["reason"].tolist()
    assert "symmetry" not in result.full.columns


def test_search_log_says_which_full_runs_use_symmetry():
    from distsim.sweep.search import _reduction_note
    assert _reduction_note([{"symmetry": True}] * 2) == ", symmetry and coarsening"
    assert "no symmetry" in _reduction_note([{"symmetry": False}])
    assert "symmetry for 1 of 2" in _reduction_note([{"symmetry": True}, {"symmetry": False}])
