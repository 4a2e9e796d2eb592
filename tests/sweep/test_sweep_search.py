"""The search finds the same best strategy as the exhaustive sweep."""
from __future__ import annotations

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.sweep import search
from distsim.sweep.search import _weights_lower_bound


def test_search_finds_the_exhaustive_best():
    result = search("tiny", "dgx-a100", 8, space={"microbatches": [8]}, workers=2)
    exhaustive = distsim.sweep({"model": "tiny", "topology": "dgx-a100", "microbatches": 8},
                               {"dp": [1, 2, 4, 8], "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8]},
                               constraints=["dp * tp * pp == devices"], workers=2,
                               progress=False)
    ok = exhaustive[exhaustive["status"] == "ok"]
    ok = ok[~ok["oom"].fillna(False).astype(bool)].sort_values(["step_time_s", "index"])
    best = ok.iloc[0]
    assert result.best == {"dp": int(best["dp"]), "tp": int(best["tp"]),
                           "pp": int(best["pp"]), "microbatches": 8}
    assert result.ranking.iloc[0]["step_time_s"] == pytest.approx(best["step_time_s"])
    assert len(result.full) < len(ok)                      # it did prune
    text = result.explain()
    assert text.startswith("best: ") and "runner-up" in text and "ms" in text


def test_search_simulates_unpipelined_and_pipelined_points_together():
    # By default pipelined points get microbatches pp, 2pp, 4pp and the
    # unpipelined ones none: a column pandas fills with NaN. Simulating the
    # kept points of both kinds in full must not pass that NaN on as an option.
    result = search("tiny", "dgx-a100", 8, keep=100, workers=1)
    assert len(result.full) == len(result.estimates[result.estimates["status"] == "ok"])
    assert (result.full["status"] == "ok").all(), result.full["reason"].tolist()
    pipelined = result.full[result.full["pp"] > 1]
    unpipelined = result.full[result.full["pp"] == 1]
    assert len(pipelined) and len(unpipelined)
    assert unpipelined["microbatches"].isna().all()
    assert sorted(set(pipelined["microbatches"] / pipelined["pp"])) == [1, 2, 4]


def test_memory_bound_is_the_weights():
    # GPT-3 175B weights are 350 GB in bf16: with 8 x 80 GB GPUs only
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
