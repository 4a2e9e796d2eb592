"""Sweep and search at their edges: integers past 64 bits in the tables,
a grid every point of which is skipped, a search where no strategy fits."""
from __future__ import annotations

import json

import pandas as pd

import distsim
from distsim.sweep.search import search
from distsim.sweep.store import Journal, write_tables
from sweep_fakes import TINY


def test_parquet_takes_integers_past_64_bits(tmp_path):
    df = pd.DataFrame({"index": [0], "key": ["k"], "dp": [10 ** 23], "status": ["invalid"],
                       "reason": ["x"]})
    df["dp"] = df["dp"].astype(object)
    paths = write_tables(df, tmp_path, {"name": "t"})
    if "parquet" in paths:
        assert pd.read_parquet(paths["parquet"])["dp"].tolist() == [str(10 ** 23)]


def test_skipped_points_go_to_the_journal_in_one_write(tmp_path, monkeypatch):
    fsyncs = []
    real = Journal.extend

    def counting(self, rows):
        rows = list(rows)
        fsyncs.append(len(rows))
        return real(self, rows)

    monkeypatch.setattr(Journal, "extend", counting)
    df = distsim.sweep(TINY, {"dp": [1, 2, 4, 8], "hidden": [16, 32, 48]},
                       constraints=["dp > 100"], workers=1, out_dir=tmp_path, progress=False)
    assert (df["status"] == "skipped").all() and fsyncs == [12]
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 12 and len({json.loads(x)["key"] for x in lines}) == 12
    again = distsim.sweep(TINY, {"dp": [1, 2, 4, 8], "hidden": [16, 32, 48]},
                          constraints=["dp > 100"], workers=1, out_dir=tmp_path,
                          progress=False)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 12
    assert again.equals(df)


def test_search_says_why_no_strategy_fits():
    result = search("gpt2-tiny", "dgx-a100", 8, workers=1)   # ONNX: symbolic batch, dp only
    assert result.best is None
    text = result.explain()
    assert text.startswith("no strategy fits:") and "symbolic" in text
    assert "10 invalid or failed" in text
