"""The end-to-end CLI: the default run writes every output file; bad input
gives one line on stderr, exit status 2 and no output files."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from distsim.cli import main

SMALL = ["--layers", "2", "--hidden", "256", "--batch", "64"]


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_default_run_writes_all_outputs(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_cli(["simulate", "--out", str(out)], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["gantt.png", "links.png", "memory.png",
                                                     "report.html", "summary.json", "trace.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step_time_s"] > 0
    assert summary["num_devices"] == 8
    for d in summary["devices"]:
        for key in ("rank", "peak_memory_bytes", "compute_s", "communication_s", "idle_s"):
            assert key in d
        assert d["communication_s"] > 0  # gradients are all-reduced
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in complete)
    assert {e["pid"] for e in complete} == set(range(8))
    assert any(e["ph"] == "C" and e["name"] == "memory" for e in events)
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)
    for png in ("gantt.png", "memory.png", "links.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "step time" in stdout.lower()
    page = (out / "report.html").read_text()    # the summary with the charts inlined
    step_ms = summary['step_time_s'] * 1e3
    assert f"{step_ms:,.3f} ms" in page or f"{step_ms:,.1f} ms" in page
    assert page.count('src="data:image/png;base64,') == 3      # Gantt, memory, links


def test_json_flag_prints_summary(tmp_path, capsys):
    code, stdout, _ = run_cli(["simulate", *SMALL, "--dp", "4", "--json", "--no-plots",
                               "--out", str(tmp_path)], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["num_devices"] == 4 and summary["config"]["dp"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "trace.json"]


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_more_devices_is_faster_per_step(tmp_path, capsys, dtype):
    times = {}
    for dp in (4, 8):
        # large enough a batch that halving each device's compute outweighs
        # the all-reduce growing with its team (NCCL's per-step latency)
        code, stdout, _ = run_cli(["simulate", "--layers", "4", "--hidden", "2048",
                                   "--batch", "16384",
                                   "--dp", str(dp), "--dtype", dtype, "--json", "--no-plots",
                                   "--out", str(tmp_path / str(dp))], capsys)
        assert code == 0
        times[dp] = json.loads(stdout)["step_time_s"]
    assert times[8] < times[4]


def test_topology_path(tmp_path, capsys):
    from distsim.paths import topologies_dir
    path = topologies_dir() / "dgx-a100.yaml"
    code, _, err = run_cli(["simulate", *SMALL, "--topology", str(path), "--no-plots",
                            "--out", str(tmp_path)], capsys)
    assert code == 0, err


@pytest.mark.parametrize("args,message", [
    (["--model", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    (["--topology", "/nonexistent/topo.yaml"], "/nonexistent/topo.yaml"),
    (["--batch", "6", "--dp", "4"],
     "batch size 6 of input %x is not divisible by the data-parallel degree 4"),
    (["--dp", "16"], "16 devices"),
    (["--layers", "0"], "layers"),
])
def test_bad_input_one_line_exit_2_no_files(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code, stdout, err = run_cli(["simulate", *args, "--out", str(out)], capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_bad_comm_streams_setting_is_one_line_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:   # argparse's choices, one line (cli.Parser)
        main(["simulate", "--comm-streams", "per-team", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--comm-streams: invalid choice: 'per-team'" in err


def test_malformed_yaml_topology(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndevice: [unclosed\n")
    code, _, err = run_cli(["simulate", "--topology", str(bad), "--out", str(tmp_path / "o")],
                           capsys)
    assert code == 2 and str(bad) in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_malformed_yaml_model(tmp_path, capsys):
    bad = tmp_path / "m.yaml"
    bad.write_text("family: mlp\nlayers: [1,\n")
    code, _, err = run_cli(["simulate", "--model", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "malformed YAML" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("out, message", [
    ("/proc/nope", "--out /proc/nope: cannot create the output folder"),
    ("/proc/nope/deeper", "--out /proc/nope/deeper: cannot create the output folder"),
    ("/proc", "cannot write /proc/summary.json: "),   # a folder nobody may write into
])
def test_an_output_folder_that_cannot_be_written_is_a_config_error(capsys, out, message):
    code, stdout, err = run_cli(["simulate", *SMALL, "--no-plots", "--out", out], capsys)
    assert code == 2, err
    assert err.startswith("distsim: error: " + message) and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and stdout == ""


def test_max_wall_s_bounds_the_whole_run(tmp_path, capsys):
    # a budget of 1 ns is spent before the program is built: the run stops
    # there (the simulator's own bound, which names the blocked ops, is
    # tested in tests/sim/test_liveness_bounds.py)
    out = tmp_path / "out"
    code, stdout, err = run_cli(["simulate", "--no-plots", "--max-wall-s", "1e-9",
                                 "--out", str(out)], capsys)
    assert code == 2
    assert err.startswith("distsim: error: stopped while building the program: the run took ")
    assert err.endswith(" past --max-wall-s 1e-09\n") and len(err.strip().splitlines()) == 1
    assert not out.exists() and stdout == ""


def test_the_simulation_gets_the_time_the_build_left(monkeypatch):
    import distsim
    from distsim import api
    bounds = []
    real = api.simulate_function

    def spy(program, topo, cost, options, values=None):
        bounds.append(options.max_wall_s)
        return real(program, topo, cost, options, values=values)
    monkeypatch.setattr(api, "simulate_function", spy)
    distsim.simulate(layers=1, hidden=64, batch=64, max_wall_s=600)
    distsim.simulate(layers=1, hidden=64, batch=64)
    assert 0 < bounds[0] < 600 and bounds[1] is None


def test_max_wall_s_zero_or_generous_changes_nothing(tmp_path, capsys):
    times = []
    for wall in ("0", "3600"):
        code, stdout, err = run_cli(["simulate", *SMALL, "--json", "--no-plots", "--max-wall-s",
                                     wall, "--out", str(tmp_path / wall)], capsys)
        assert code == 0, err
        times.append(json.loads(stdout)["step_time_s"])
    assert times[0] == times[1] > 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "-inf"])
def test_malformed_max_wall_s_is_a_config_error(tmp_path, capsys, value):
    out = tmp_path / "out"
    code, _, err = run_cli(["simulate", f"--max-wall-s={value}", "--out", str(out)], capsys)
    assert code == 2
    assert err.startswith("distsim: error: --max-wall-s: must be a finite number of seconds >= 0")
    assert not out.exists()


@pytest.mark.parametrize("value", [float("nan"), -1, "10", True, float("inf")])
def test_malformed_max_wall_s_in_python_is_a_config_error(value):
    import distsim
    from distsim.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^--max-wall-s: must be a finite number"):
        distsim.simulate(max_wall_s=value)


def test_max_wall_s_in_python_stops_with_a_simulation_error():
    import distsim
    from distsim.errors import SimulationError
    with pytest.raises(SimulationError, match=r"^stopped while building the program: .* "
                                              r"past --max-wall-s 1e-09$"):
        distsim.simulate(max_wall_s=1e-9)


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--model", "--layers", "--hidden", "--batch", "--dtype", "--dp", "--topology",
                 "--out", "--json", "--network-mode", "--collective-algo", "--comm-streams",
                 "--max-wall-s",
                 "--max-trace-records"):
        assert flag in text


def test_console_script_is_installed(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "distsim", "simulate", *SMALL, "--no-plots",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
