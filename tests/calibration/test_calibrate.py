"""``distsim calibrate``: synthetic measurements made by known figures are
fitted back to those figures, and the topology it writes times the same
shapes as measured; bad measurements are one line and exit status 2,
leaving no file."""
import json
import math
from pathlib import Path

import pytest
import yaml

import distsim
from distsim.cli import main
from distsim.cost import CostModel
from distsim.cost.attention_time import AttentionModel, attention_seconds
from distsim.cost.gemm import GemmModel, GemmShape
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.topology import load_topology

PEAK, BW, LAUNCH = 100e12, 2e12, 5e-6
MEM_EFF = 0.8
#: the figures the synthetic measurements are made with: a k_overhead, a
#: tile_intensity and a wave_quantization on the fit's grids (16 apart;
#: eighths of the largest tile's 85.33 FLOP/B: 64 halves a 64 x 64 tile's
#: rate; quarters)
TRUE = GemmModel(sms=8, efficiency={"bf16": 0.6}, k_overhead=64, tile_intensity=64,
                 wave_quantization=0.5)
TRUE_ATTENTION = AttentionModel(fwd_efficiency=0.5, bwd_efficiency=0.4, key_overhead=96)
SHAPES = [(1, 512, 512, 8192), (1, 384, 512, 8192), (1, 384, 384, 8192), (8, 128, 64, 16384),
          (1, 256, 256, 16384), (2, 256, 384, 8192),
          (1, 640, 384, 8192), (1, 2048, 2048, 1024), (1, 2048, 2048, 4096),
          (4, 1024, 1024, 2048), (1, 4096, 1536, 512), (1, 1280, 3072, 2048)]


def gemm_seconds(b, m, n, k):
    floor = b * (m * k + k * n + m * n) * 2 / (BW * MEM_EFF)
    return LAUNCH + max(TRUE.time(GemmShape(b, m, n, k), DType.BF16, PEAK, BW * MEM_EFF), floor)


def attention_row(direction, seq, causal):
    b, h, d = 2, 8, 64
    frac = 0.5 if causal else 1.0
    fwd = 4.0 * b * h * seq * seq * frac * d
    def one(eff, flops):
        return attention_seconds(flops / (PEAK * eff), b * h, seq, seq * frac,
                                 TRUE_ATTENTION.key_overhead, 128, TRUE.sms,
                                 TRUE.wave_quantization)
    t = {"fwd": one(0.5, fwd) + LAUNCH, "bwd": one(0.4, 2.5 * fwd) + LAUNCH,
         "fwd+bwd": one(0.5, fwd) + one(0.4, 2.5 * fwd) + 2 * LAUNCH}[direction]
    return {"direction": direction, "batch": b, "heads": h, "seq_q": seq, "head_dim": d,
            "causal": causal, "dtype": "bf16", "median_s": t}


def measurements(**change):
    data = {
        "environment": {"gpu": "synthetic", "sm_count": TRUE.sms, "total_memory_bytes": 1e10},
        "peaks_used": {"peak_flops": {"bf16": PEAK, "f32": PEAK / 10},
                       "memory_bandwidth_Bps": BW},
        "launch": {"overhead_s": LAUNCH},
        "gemm": [{"M": m, "N": n, "K": k, "batch": b, "dtype": "bf16",
                  "median_s": gemm_seconds(b, m, n, k)} for b, m, n, k in SHAPES],
        "memory": [{"op": "add", "kernel_class": "elementwise", "dtype": "bf16", "bytes": 6e8,
                    "median_s": LAUNCH + 6e8 / (BW * MEM_EFF)},
                   {"op": "layernorm", "kernel_class": "norm", "dtype": "bf16", "bytes": 4e8,
                    "median_s": LAUNCH + 4e8 / (BW * 0.5)}],
        "vector": [{"dtype": "f32", "flops": 1e12, "median_s": 1e12 / (PEAK / 10 * 0.9)}],
        "attention": [attention_row(dr, s, c) for dr in ("fwd", "fwd+bwd") for s in (1024, 4096)
                      for c in (False, True)],
    }
    data.update(change)
    return data


def write(tmp_path, data, name="m.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_synthetic_measurements_give_back_their_figures(tmp_path):
    cal = distsim.calibrate(write(tmp_path, measurements()))
    g = cal.gemm.model
    assert g.sms == 8 and g.k_overhead == 64 and g.wave_quantization == 0.5
    assert g.tile_intensity == pytest.approx(TRUE.tile_intensity, rel=1e-6)
    assert g.efficiency["bf16"] == pytest.approx(0.6, rel=1e-9)
    assert cal.gemm.fitted_structure and cal.gemm.rms() < 1e-9
    a = cal.attention.model
    assert (a.fwd_efficiency, a.bwd_efficiency, a.key_overhead) == \
        (pytest.approx(0.5, rel=1e-9), pytest.approx(0.4, rel=1e-9), 96)
    assert cal.device["memory_efficiency"] == 0.8
    assert cal.device["memory_efficiency_by_class"] == {"elementwise": 0.8, "norm": 0.5}
    assert cal.device["vector_efficiency"] == 0.9
    assert cal.device["launch_overhead_s"] == LAUNCH


def test_the_written_topology_times_the_measured_shapes_as_measured(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        "name: base\n# the node\ndevice:\n  name: old\n"
        "  peak_flops: {bf16: 1.0e+14, f32: 1.0e+13}\n"
        "  memory_bandwidth_Bps: 2.0e+12\n  memory_bytes: 1.0e+10\n"
        "  # an old guess, replaced with its comment\n  matmul_efficiency: 0.7\n"
        "  memory_efficiency_by_op: {layernorm: 0.3}\n"
        "devices: [g0, g1]\nlinks:\n  - {src: g0, dst: g1, bandwidth_GBps: 10, latency_us: 1}\n")
    code = main(["calibrate", str(write(tmp_path, measurements())), "--update", str(base)])
    assert code == 0
    text = base.read_text()
    assert "an old guess" not in text and "memory_efficiency_by_op" not in text
    assert text.startswith("name: base\n# the node\ndevice:\n  name: old\n")
    assert text.count("matmul_efficiency:") == 1
    device = load_topology(str(base)).device_spec
    cost = CostModel(device)
    for b, m, n, k in SHAPES:
        fb = FunctionBuilder("f")
        x = fb.input("x", TensorType((b, m, k), DType.BF16, 0))
        w = fb.input("w", TensorType((b, k, n), DType.BF16, 0))
        fb.op("matmul", [x, w])
        assert cost.op_cost(fb.function.ops[0]).time_s == pytest.approx(
            gemm_seconds(b, m, n, k), rel=1e-9)
    # a second run replaces the calibrated section instead of adding one
    assert main(["calibrate", str(write(tmp_path, measurements())), "--update", str(base)]) == 0
    assert base.read_text() == text


def test_out_without_a_topology_writes_the_device_block(tmp_path, capsys):
    out = tmp_path / "device.yaml"
    assert main(["calibrate", str(write(tmp_path, measurements())), "--out", str(out)]) == 0
    device = yaml.safe_load(out.read_text())["device"]
    assert device["gemm"]["efficiency"] == {"bf16": 0.6}
    assert device["memory_bytes"] == 1e10
    assert "| bf16 |" in capsys.readouterr().out      # the measured-against-modelled table


def test_levels_of_other_series_do_not_move_the_reference_efficiency(tmp_path):
    data = measurements()
    burst = [dict(r, median_s=LAUNCH + (r["median_s"] - LAUNCH) / 1.1, series="burst")
             for r in data["gemm"]]
    data["gemm"] += burst
    data["reference_series"] = "sweep"
    cal = distsim.calibrate(write(tmp_path, data))
    assert cal.gemm.model.efficiency["bf16"] == pytest.approx(0.6, rel=1e-6)
    assert cal.gemm.levels["burst"] == pytest.approx(1.1, rel=1e-6)


def _gemm(**row):
    return [{"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16", "median_s": 2e-4, **row}]


@pytest.mark.parametrize("change, message", [
    ({"gemm": _gemm(median_s=-1)},
     "m.json: gemm[0].median_s: must be a positive time in seconds, got -1"),
    ({"gemm": [{"M": 2048, "N": 2048, "K": 2048, "dtype": "bf16"}]},
     "m.json: gemm[0].median_s: missing"),
    ({"gemm": _gemm(K=0)}, "m.json: gemm[0].K: must be between 1 and 2.14748e+09, got 0"),
    ({"gemm": _gemm(median_s=1e-6)},
     "m.json: gemm[0]: 1.72e+16 FLOP/s is above peak_flops.bf16 (1e+14): the time or the "
     "peak is wrong"),
    ({"gemm": []}, "m.json: gemm: no GEMM measurements (the section the GEMM model is "
                   "fitted to)"),
    ({"memory": [{"op": "add", "kernel_class": "elementwise", "bytes": 6e9, "median_s": 1e-3}]},
     "m.json: memory[0]: 6.03e+12 B/s is above memory_bandwidth_Bps (2e+12): efficiency 3.02 > 1"),
    ({"memory": [{"op": "stream", "bytes": 1e8, "median_s": 1e-3}]},
     "m.json: memory[0].kernel_class: expected one of copy, elementwise, norm, softmax, "
     "reduction, got None (op 'stream')"),
    ({"vector": [{"dtype": "f32", "flops": 1e13, "median_s": 0.5}]},
     "m.json: vector[0]: 2e+13 FLOP/s is above peak_flops.f32 (1e+13): efficiency 2.00 > 1"),
    ({"launch": {"overhead_s": -1e-6}},
     "m.json: launch.overhead_s: must be a positive time in seconds, got -1e-06"),
    ({"attention": [attention_row("fwd+bwd", 1024, False)]},
     "attention: every row times forward and backward together: add a forward (or "
     "backward) alone to tell their efficiencies apart"),
    ({"environment": {}}, "m.json: environment.sm_count: missing (the GPU's SM count; or give "
                          "--topology with a gemm block)"),
])
def test_bad_measurements_are_one_line_exit_2_and_no_file(tmp_path, capsys, change, message):
    out = tmp_path / "out.yaml"
    path = write(tmp_path, measurements(**change))
    code = main(["calibrate", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"distsim: error: {message.replace('m.json', str(path))}\n"
    assert not out.exists()


def test_a_dtype_without_measurements_is_refused_by_name(tmp_path, capsys):
    path = write(tmp_path, measurements())
    assert main(["calibrate", str(path), "--dtype", "f16"]) == 2
    assert capsys.readouterr().err == (f"distsim: error: {path}: gemm: no measurements for "
                                       "dtype f16 (measured: bf16)\n")


def test_an_update_that_fails_leaves_the_file_as_it_was(tmp_path, capsys):
    target = tmp_path / "t.yaml"
    target.write_text("name: t\ndevice: {name: d}\n")
    before = target.read_text()
    assert main(["calibrate", str(write(tmp_path, measurements())), "--update",
                 str(target), "--topology", "dgx-h100"]) == 2
    assert "written on one line" in capsys.readouterr().err
    assert target.read_text() == before


def test_the_committed_measurements_calibrate():
    # the A100's public figures fit as the README says (and keep fitting)
    root = Path(__file__).resolve().parents[2] / "reports" / "calibration"
    cal = distsim.calibrate(root / "a100-public.json", topology="dgx-a100")
    assert cal.gemm.rms() < 0.05 and math.isfinite(cal.gemm.model.efficiency["bf16"])


def test_measure_gpu_output_sets_the_level_at_its_layer_loop(tmp_path):
    # measure_gpu.py's sections: a layer loop (GEMMs with M, N, K among
    # element-wise ops) is the reference; a failed section is no section
    slower = 1.05
    layer = [{"label": "gelu", "median_s": 1e-4}]
    layer += [{"label": f"gemm {m}", "M": m, "N": n, "K": k, "dtype": "bf16", "flops": 1.0,
               "median_s": LAUNCH + (gemm_seconds(1, m, n, k) - LAUNCH) * slower}
              for _, m, n, k in SHAPES[5:8]]
    data = measurements(gemm_cycles={"layer": {"ops": layer, "tokens": 4096}},
                        vector={"error": "RuntimeError('jiterator unavailable')"})
    cal = distsim.calibrate(write(tmp_path, data))
    assert cal.gemm.reference == "layer"
    assert cal.gemm.model.efficiency["bf16"] == pytest.approx(0.6 / slower, rel=1e-6)
    assert cal.gemm.levels["sweep"] == pytest.approx(slower, rel=1e-6)
    assert "vector_efficiency" not in cal.device


@pytest.mark.parametrize("flags, message", [
    (["--out", "x.txt"], "--out x.txt: the output is a topology file; name a .yaml file"),
    (["--update", "missing.yaml"], "--update missing.yaml: topology file not found"),
    (["--out", "no/such/folder/x.yaml"], "--out no/such/folder/x.yaml: the folder no/such/folder "
                                         "does not exist"),
    (["--reference", "burst"], "--reference burst: no such GEMM series (the measurements have "
                               "sweep)"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, measurements())
    assert main(["calibrate", str(path), *flags]) == 2
    assert capsys.readouterr().err == f"distsim: error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_the_api_is_strict_and_documents_every_parameter():
    import inspect
    from distsim.errors import ConfigError
    with pytest.raises(ConfigError, match="unknown keyword 'topolgy' \\(did you mean 'topology'"):
        distsim.calibrate("m.json", topolgy="dgx-h100")
    doc = inspect.getdoc(distsim.calibrate)
    assert all(f"``{name}``" in doc for name in inspect.signature(distsim.calibrate).parameters)


#: a second kernel's figures (all on the fit's grid: key_overhead 16 apart)
CUDNN = AttentionModel(fwd_efficiency=0.7, bwd_efficiency=0.55, key_overhead=32)


def kernel_row(direction, seq, causal, figures=CUDNN, kernel="cudnn"):
    """``attention_row`` of a kernel with its own figures."""
    b, h, d = 2, 8, 64
    frac = 0.5 if causal else 1.0
    fwd = 4.0 * b * h * seq * seq * frac * d
    eff = {"fwd": figures.fwd_efficiency, "bwd": figures.bwd_efficiency}
    flops = {"fwd": fwd, "bwd": 2.5 * fwd}
    t = LAUNCH + attention_seconds(flops[direction] / (PEAK * eff[direction]), b * h, seq,
                                   seq * frac, figures.key_overhead, 128, TRUE.sms,
                                   TRUE.wave_quantization)
    return {"direction": direction, "batch": b, "heads": h, "seq_q": seq, "head_dim": d,
            "causal": causal, "dtype": "bf16", "median_s": t, "kernel": kernel}


def test_each_kernels_rows_give_back_their_own_figures_and_the_file_times_them(tmp_path):
    rows = [kernel_row(dr, s, c) for dr in ("fwd", "bwd") for s in (512, 1024, 4096)
            for c in (False, True)]
    data = measurements()
    data["attention"] += rows
    cal = distsim.calibrate(write(tmp_path, data))
    a = cal.attention.model                 # the rows without a kernel: the default
    assert (a.fwd_efficiency, a.bwd_efficiency, a.key_overhead) == \
        (pytest.approx(0.5, rel=1e-9), pytest.approx(0.4, rel=1e-9), 96)
    k = cal.attention_kernels["cudnn"].model
    assert (k.fwd_efficiency, k.bwd_efficiency, k.key_overhead) == \
        (pytest.approx(0.7, rel=1e-9), pytest.approx(0.55, rel=1e-9), 32)
    assert cal.device["attention"]["kernels"]["cudnn"]["fwd_efficiency"] == 0.7
    out = tmp_path / "t.yaml"
    assert main(["calibrate", str(write(tmp_path, data)), "--topology", "dgx-h100",
                 "--out", str(out)]) == 0
    spec = load_topology(str(out)).device_spec
    written = spec.attention.for_kernel("cudnn")
    assert (written.fwd_efficiency, written.bwd_efficiency, written.key_overhead) == \
        (0.7, 0.55, 32)
    assert spec.attention.for_kernel(None) is spec.attention


def test_rows_that_all_name_a_kernel_are_refused_by_name(tmp_path, capsys):
    rows = [kernel_row(dr, 1024, False) for dr in ("fwd", "bwd")]
    path = write(tmp_path, measurements(attention=rows))
    assert main(["calibrate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"distsim: error: {path}: attention[0]: every attention row names a kernel: the "
        "default kernel's rows (no kernel) are needed too\n")
    bad = [dict(kernel_row("fwd", 1024, False), kernel=3)]
    path = write(tmp_path, measurements(attention=measurements()["attention"] + bad))
    assert main(["calibrate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"distsim: error: {path}: attention[8].kernel: expected a kernel's name, got 3\n")
