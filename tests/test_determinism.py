"""Same inputs, same outputs: two runs of the same command write
byte-identical summary.json and trace.json (in separate processes, so that
no cache or hash seed is shared); a sweep gives the same table with 1 and 2
workers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = {
    "mlp-dp8-flow": ["--layers", "3", "--hidden", "512", "--batch", "256", "--dp", "8"],
    "mlp-dp4-two-nodes": ["--layers", "2", "--hidden", "256", "--batch", "64", "--dp", "4",
                          "--topology", "dgx-a100-x2", "--collective-algo", "ring"],
    "tiny-gpt-3d": ["--model", "tiny", "--dp", "2", "--tp", "2", "--pp", "2",
                    "--network-mode", "flow"],
}


def _simulate(args, out: Path, seed: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    proc = subprocess.run([sys.executable, "-m", "distsim", "simulate", *args, "--no-plots",
                           "--json", "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", sorted(RUNS))
def test_same_run_twice_gives_identical_files(name, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _simulate(RUNS[name], a, seed="1")
    _simulate(RUNS[name], b, seed="2")
    for f in ("summary.json", "trace.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert sorted(os.listdir(a)) == ["summary.json", "trace.json"]


def test_sweep_gives_the_same_results_with_one_and_two_workers(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("base: {model: mlp, layers: 2, hidden: 256, batch: 64, "
                    "network_mode: analytical}\ngrid: {dp: [1, 2, 4]}\n")
    tables = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        proc = subprocess.run([sys.executable, "-m", "distsim", "sweep", str(spec), "--workers",
                               str(workers), "--no-charts", "--quiet", "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        import pandas as pd
        df = pd.read_csv(out / "results.csv")
        keep = [c for c in df.columns if not any(w in c for w in ("wall", "elapsed", "worker",
                                                                  "pid", "host", "started",
                                                                  "finished", "time_taken"))]
        tables.append(df[keep].sort_values("dp").reset_index(drop=True))
    import pandas.testing as pdt
    pdt.assert_frame_equal(tables[0], tables[1])
