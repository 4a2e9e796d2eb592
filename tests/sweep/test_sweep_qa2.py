"""Second sweep/search QA round: the estimator refuses the ZeRO points the
simulator refuses; strategy values (ZeRO 0-3, ...) are checked before any
point runs; SIGTERM stops a sweep as Ctrl-C does, its workers included."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.sweep.search import search
from distsim.transforms import strategy as strategy_module
from distsim.transforms.strategy import Strategy

HERE = Path(__file__).resolve().parent


# -- 1. estimate and simulate refuse the same ZeRO points ---------------------------
def test_estimate_refuses_the_zero_points_simulate_refuses():
    """tp 2 x dp 4 on 8 GPUs. hidden 2: 'l0_bqkv' holds 3 elements per rank,
    fewer than dp (ZeRO 2/3 refused) and not a multiple of it (symmetry
    refused); hidden 4: 6 elements, enough for ZeRO 3 but still uneven
    under symmetry. Was: every estimated point ok."""
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
    without it rather than refused (was: invalid, '... with symmetry')."""
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


# -- 2. strategy values checked up front ---------------------------------------------
def test_every_strategy_field_has_a_value_check():
    assert set(strategy_module._CHECK_ORDER) == {f.name for f in fields(Strategy)}


@pytest.mark.parametrize("grid, message", [
    ("{zero: [0, 5]}", "grid.zero[1]: must be 0, 1, 2 or 3, got 5"),
    ("{prefetch: [1, -1]}", "grid.prefetch[1]: must be a non-negative integer, got -1"),
    ("{bucket_mb: [-1.0]}", "grid.bucket_mb[0]: must be a finite non-negative number"),
    ("{micro_batch: [0]}", "grid.micro_batch[0]: must be a positive integer, got 0"),
])
def test_sweep_refuses_bad_strategy_values_before_running(tmp_path, capsys, grid, message):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"base: {{model: tiny, fidelity: estimate}}\ngrid: {grid}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_search_refuses_bad_strategy_values_before_running(capsys):
    assert main(["search", "--model", "tiny", "--topology", "dgx-a100",
                 "--space", "zero=0,5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["distsim: error: --space zero: must be 0, 1, 2 or 3, got 5"]
    with pytest.raises(ConfigError, match="--space zero: must be 0, 1, 2 or 3, got 4"):
        search("tiny", "dgx-a100", 8, space={"zero": [0, 4]})
    with pytest.raises(ConfigError, match="base.zero: must be 0, 1, 2 or 3, got 7"):
        distsim.sweep({"model": "tiny", "zero": 7}, {"dp": [8]}, workers=1, progress=False)


# -- 3. SIGTERM stops the workers ----------------------------------------------------
_SCRIPT = """
import functools, sys
sys.path.insert(0, {here!r})
import sweep_fakes
from distsim.cli import main, sweep_cmd
from distsim.sweep import driver
slow = functools.partial(sweep_fakes.marked_sleep_simulate, {markers!r})
sweep_cmd.sweep = functools.partial(driver.sweep, simulate=slow)
sys.exit(main(sys.argv[1:]))
"""


def _children() -> dict:
    """ppid -> child pids, from /proc."""
    out: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(name))
    return out


def _descendants(pid: int) -> list:
    children, found, todo = _children(), [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("signum, status, message", [
    (signal.SIGTERM, 143, "distsim: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "distsim: interrupted"),   # to the coordinator alone, not its group
])
def test_signal_stops_the_sweep_and_its_workers(tmp_path, signum, status, message):
    """Two workers each running a point that sleeps a minute; the signal
    must end the coordinator within seconds with its workers (and their
    forkserver), keep the finished points in the journal and mark the
    tables incomplete. Was (SIGTERM): the coordinator died at once and its
    workers ran on; (SIGINT to the pid) it waited for the points."""
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: mlp, network_mode: analytical, layers: 2, batch: 64}\n"
                    "grid: {dp: [1, 2, 4, 8]}\n")
    out = tmp_path / "out"
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err_file:    # a file, not a pipe: survivors would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT.format(here=str(HERE), markers=str(markers)),
             "sweep", str(spec), "--out", str(out), "--workers", "2", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=err_file)
    family: list = []
    try:
        deadline = time.monotonic() + 120
        while len(list(markers.iterdir())) < 2:       # both workers busy sleeping
            assert proc.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, "the workers never started their points"
            time.sleep(0.1)
        family = _descendants(proc.pid)
        busy = {int(p.read_text()) for p in markers.iterdir()}
        assert busy <= set(family), (busy, family)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        err = stderr.read_text()
        assert proc.returncode == status, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), err
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in family if _alive(p)], "processes of the sweep survived it"
        journal = (out / "results.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["params"]["dp"] for line in journal) == [1, 2]
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] is False and manifest["done"] == 2
        assert not [p.name for p in out.iterdir() if p.name.startswith(".") or "tmp" in p.name]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in family:                # what the test started, by pid, if it survived
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_search_log_says_which_full_runs_use_symmetry():
    from distsim.sweep.search import _reduction_note
    assert _reduction_note([{"symmetry": True}] * 2) == ", symmetry and coarsening"
    assert "no symmetry" in _reduction_note([{"symmetry": False}])
    assert "symmetry for 1 of 2" in _reduction_note([{"symmetry": True}, {"symmetry": False}])
