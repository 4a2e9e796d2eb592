"""The counted growth benchmark (``distsim bench --only growth_counts``):
reading cachegrind's totals, subtracting the baseline, fitting exponents.
The counts themselves belong to the report; here a fake counter stands in
for Valgrind, except for one real run of cachegrind on /bin/true (when
Valgrind is installed) that checks the options and the file format."""
import json
import shutil
import subprocess

import pytest

from distsim.bench import counted
from distsim.bench.suite import run_suite
from distsim.cli import main
from distsim.errors import ConfigError

SAMPLE = """desc: I1 cache:         32768 B, 64 B, 8-way associative
cmd: python -m distsim.bench.counted baseline
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=???
fn=0x0
1 5 0 0 0 0 0 0 0 0
summary: 2443439916 25687463 48198 727810310 15697265 237289 382250963 4013670 748554
"""


def test_cachegrind_totals_are_read_by_event_name():
    totals = counted.parse_cachegrind(SAMPLE)
    assert totals["Ir"] == 2443439916
    assert totals["DLmr"] == 237289 and totals["DLmw"] == 748554
    assert len(totals) == 9


def test_a_file_without_totals_is_an_error():
    with pytest.raises(counted.CountingUnavailable, match="summary"):
        counted.parse_cachegrind(SAMPLE.replace("summary:", "totals:"))


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_options_run_and_the_real_file_parses(tmp_path):
    out = tmp_path / "cg.out"
    proc = subprocess.run(counted._cachegrind_args(str(out)) + ["/bin/true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    totals = counted.parse_cachegrind(out.read_text())
    assert totals["Ir"] > 0
    assert {"D1mr", "DLmr", "D1mw", "DLmw"} <= set(totals)


def test_points_less_the_baseline_fitted_against_ops():
    """Baseline: 10**9 instructions, 10**5 LL misses. The points' own work:
    instructions 50 per op (k = 1), LL misses 0.01 * ops**1.25 (k = 1.25),
    D1 misses 2 * ops**0.9 (k = 0.9)."""
    base = {"Ir": 10**9, "D1mr": 3000, "D1mw": 1000, "DLmr": 60_000, "DLmw": 40_000}
    ops_of = {(64, 8, 8, 24): 100_000, (128, 8, 16, 48): 200_000, (128, 8, 16, 96): 400_000}
    seen = []

    def fake(job):
        seen.append(job)
        if job == ("baseline",):
            return dict(base)
        assert job[0] == "point" and job[-1] == 32   # quick: 32 micro-batches
        ops = ops_of[tuple(job[1:5])]
        ll, d1 = 0.01 * ops ** 1.25, 2 * ops ** 0.9
        return {"Ir": base["Ir"] + 50 * ops, "D1mr": base["D1mr"] + d1, "D1mw": base["D1mw"],
                "DLmr": base["DLmr"] + ll / 2, "DLmw": base["DLmw"] + ll / 2,
                "simulated_ops": ops}

    figures = counted.growth_counts(quick=True, workers=1, counter=fake)
    assert len(seen) == 4
    assert figures["growth_exponent_instructions"] == pytest.approx(1.0, abs=1e-9)
    assert figures["growth_exponent_ll_misses"] == pytest.approx(1.25, abs=1e-9)
    assert figures["growth_exponent_d1_misses"] == pytest.approx(0.9, abs=1e-9)
    assert figures["growth_instructions_per_op"] == pytest.approx([50, 50, 50])
    first = figures["growth_count_points"][0]
    assert (first["gpus"], first["layers"], first["ops"]) == (64, 24, 100_000)
    assert first["ll_misses"] == pytest.approx(0.01 * 100_000 ** 1.25)
    assert figures["growth_ll_misses_per_op"][2] == pytest.approx(0.01 * 400_000 ** 0.25)
    assert figures["growth_count_caches"] == {"D1": (32 * 1024, 8, 64),
                                              "LL": (32 * 1024 * 1024, 16, 64)}


def test_without_valgrind_the_benchmark_says_why(monkeypatch, capsys):
    monkeypatch.setattr(counted.shutil, "which", lambda name: None)
    assert main(["bench", "--quick", "--only", "growth_counts", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert "valgrind is not installed" in figures["growth_counts_note"]
    assert "growth_exponent_instructions" not in figures


def test_the_counted_benchmark_is_not_in_the_default_suite(monkeypatch):
    ran = []
    monkeypatch.setattr("distsim.bench.suite.run_one", lambda name, quick: ran.append(name) or {})
    run_suite(quick=True)
    assert "growth_counts" not in ran and "growth" in ran
    with pytest.raises(ConfigError, match="no benchmark named 'nope'"):
        run_suite(["nope"])


def test_the_report_plots_and_tabulates_the_counted_growth(tmp_path):
    """reports/perf/run.py: with counted points, growth.png gets a second
    panel, and the table rows of the counted exponents read their values."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "reports" / "perf" / "run.py"
    spec = importlib.util.spec_from_file_location("perf_run", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    figures = {"growth_points": [{"gpus": 64, "layers": 24, "ops": 100, "wall_s": 1.0},
                                 {"gpus": 64, "layers": 48, "ops": 200, "wall_s": 2.1}],
               "growth_exponent": 1.07,
               "growth_count_points": [{"ops": 100, "instructions": 10**6, "ll_misses": 10},
                                       {"ops": 200, "instructions": 2 * 10**6, "ll_misses": 24}],
               "growth_exponent_instructions": 1.004, "growth_exponent_ll_misses": 1.263,
               "machine": {"processor": "x86_64", "cpus": 2, "python": "3.11",
                           "platform": "linux"}, "quick": True}
    out = tmp_path / "growth.png"
    run.growth_plot(figures, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run.table(figures)
    assert "instructions ~ ops^k, k (`growth_exponent_instructions`) | 1.004 |" in text
    assert "cache misses ~ ops^k, k (`growth_exponent_ll_misses`) | 1.263 |" in text
