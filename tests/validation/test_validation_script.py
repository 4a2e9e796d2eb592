"""reports/validation/run.py keeps running: its smallest runs (8 GPUs, one
micro-batch each, about a second) through the full simulation and the
estimator, into a scratch folder. The errors are the report's content and
are not asserted here; the FLOP formulas that turn a published rate into a
step time are checked against the sources' own pairs of figures."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "reports" / "validation" / "run.py"


@pytest.fixture(scope="module")
def validation():
    spec = importlib.util.spec_from_file_location("validation_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_runs_write_results_and_table(validation, tmp_path):
    assert validation.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["id"] for r in data["runs"]} == set(validation.QUICK)
    for row in data["runs"]:
        for key in ("step_time_s", "estimate_step_time_s"):
            assert math.isfinite(row["predicted"][key]) and row["predicted"][key] > 0
        assert math.isfinite(row["error_pct"])
    text = (tmp_path / "README.md").read_text()
    assert "<!-- results -->" in text and "mean |error|" in text
    # a second run reads both back from the cache instead of simulating
    assert validation.main(["--quick", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert [r["predicted"] for r in again["runs"]] == [r["predicted"] for r in data["runs"]]


def test_every_run_has_a_source_and_a_published_time(validation):
    runs = validation.all_runs()
    assert len({r["id"] for r in runs}) == len(runs)
    for run in runs:
        assert run["source"] in validation.SOURCES
        assert run["published"]["step_time_s"] > 0


def test_flop_formulas_reproduce_the_sources_pairs(validation):
    # Korthikanti Table 5: 530B (280 GPUs, batch 280) at 37.83 s is MFU 56.0 %
    flops = validation.korthikanti_model_flops(280, 2048, 105, 20480, 51200)
    assert flops / (37.83 * 280 * 312e12) == pytest.approx(0.560, abs=0.001)
    # Narayanan's Eq. 3 is 4/3 of Eq. 7 on the GPT-3 shape (the recomputed forward;
    # the output layer, not recomputed, keeps its 3 passes)
    ratio = (validation.narayanan_flops(1, 2048, 96, 12288, 51200)
             / validation.korthikanti_model_flops(1, 2048, 96, 12288, 51200))
    assert ratio == pytest.approx(4 / 3, rel=0.002)


def test_jean_zay_keeps_dgx_a100_figures():
    """The BLOOM cluster's file says it carries dgx-a100.yaml's calibrated
    device figures and NCCL figures figure for figure; hold it to that."""
    import yaml
    root = SCRIPT.parents[2]
    a100 = yaml.safe_load((root / "topologies" / "dgx-a100.yaml").read_text())
    jz = yaml.safe_load((SCRIPT.parent / "jean-zay-a100-x48.yaml").read_text())
    for key in ("peak_flops", "memory_bandwidth_Bps", "launch_overhead_s", "vector_efficiency",
                "memory_efficiency", "memory_efficiency_by_class", "matmul_efficiency",
                "gemm", "attention"):
        assert jz["device"][key] == a100["device"][key], key
    assert jz["collectives"] == a100["collectives"]
