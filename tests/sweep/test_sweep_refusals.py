"""Bad inputs to sweep, search and collective: each is one ConfigError (CLI:
one line, exit 2) raised before any point runs, never a hang, a traceback
or a file written first."""
from __future__ import annotations

from dataclasses import fields

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.report.sweep_charts import write_sweep_charts
from distsim.sweep import load_spec
from distsim.sweep.constraints import make_constraints
from distsim.sweep.search import search
from distsim.transforms import strategy as strategy_module
from distsim.transforms.strategy import Strategy
from sweep_fakes import TINY


# -- constraints --------------------------------------------------------------------
@pytest.mark.parametrize("expr, message", [
    ("10 ** 10 ** 10 > dp", "exponent"),                 # a 10-billion-digit power
    ("len('a' * 10000000000) > dp", "more than 10000 items"),   # a 10 GB string
    ("len((1, 2) * 10000000000) > dp", "more than 10000 items"),
    ("2 ** 4000 * 2 ** 4000 > dp", "bits"),
])
def test_constraints_cannot_compute_without_bound(expr, message):
    (c,) = make_constraints([expr], ["dp"])
    with pytest.raises(ConfigError, match=message):
        c({"dp": 1})


def test_small_powers_and_repeats_still_work():
    (c,) = make_constraints(["2 ** 3 >= dp * 2 and len((1,) * dp) == dp and 1 ** 10**9 == 1"],
                            ["dp"])
    assert c({"dp": 4}) and not c({"dp": 8})


def test_constraint_error_shows_only_the_names_it_reads():
    (c,) = make_constraints(["1 / (dp - 1) > 0"], ["dp", "tp", "model"])
    with pytest.raises(ConfigError) as err:
        c({"dp": 1, "tp": 2, "model": "mlp", "topology": "dgx-a100"})
    assert "failed on {dp=1}" in str(err.value)
    assert "topology" not in str(err.value) and "tp=" not in str(err.value)


# -- the spec file ------------------------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    # not silently ignored
    ("charts: {hue: nope}\n", "charts.hue: must be the name of a grid option"),
    ("charts: {hue: [1, 2]}\n", "charts.hue"),                                   # not a traceback
    ("name: [a, b]\n", "name: must be a string"),
    ("description: {a: 1}\n", "description: must be a string"),
])
def test_spec_charts_hue_and_name_are_checked(tmp_path, extra, message):
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {model: mlp}\ngrid: {dp: [1, 2]}\n" + extra)
    with pytest.raises(ConfigError, match=message):
        load_spec(spec)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--quiet"]) == 2
    assert not out.exists()


def test_write_sweep_charts_refuses_a_hue_that_is_not_a_column(tiny_frame, tmp_path):
    with pytest.raises(ConfigError, match="hue"):
        write_sweep_charts(tiny_frame, tmp_path, hue=["dp"])  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, 0.0, True])
def test_bad_connect_timeout_is_a_config_error(tmp_path, timeout):
    with pytest.raises(ConfigError, match="--connect-timeout"):
        distsim.sweep(TINY, {"dp": [1]}, workers=1, scheduler="tcp://127.0.0.1:1",
                      connect_timeout_s=timeout, out_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()


def test_out_under_a_file_names_out(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="--out .*cannot create the folder"):
        distsim.sweep(TINY, {"dp": [1]}, workers=1, out_dir=tmp_path / "afile" / "sub",
                      progress=False)
    with pytest.raises(ConfigError, match="--out: must be a path"):
        distsim.sweep(TINY, {"dp": [1]}, workers=1, out_dir=5, progress=False)


# -- strategy values ----------------------------------------------------------------
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


# -- search and collective ----------------------------------------------------------
def test_search_refuses_repeated_or_empty_space_values():
    with pytest.raises(ConfigError, match="--space zero: value 0 is listed twice"):
        search("tiny", "dgx-a100", 8, space={"zero": [0, 0]})
    with pytest.raises(ConfigError, match="--space zero: no values"):
        search("tiny", "dgx-a100", 8, space={"zero": []})


def test_search_cli_checks_top_and_out_before_searching(tmp_path, capsys, monkeypatch):
    import distsim.cli.search_cmd as cmd

    def no_search(*a, **k):
        raise AssertionError("searched before checking the flags")

    monkeypatch.setattr(cmd, "search", no_search)
    (tmp_path / "afile").write_text("")
    for flags, message in ((["--top", "-1"], "--top: must be a positive integer"),
                           (["--out", str(tmp_path / "afile")], "is not a directory"),
                           (["--out", str(tmp_path / "afile" / "x")], "is not a directory")):
        assert main(["search", "--model", "tiny", "--topology", "dgx-a100", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_collective_empty_devices_is_an_error_not_every_device(capsys):
    assert main(["collective", "allreduce", "--bytes", "1MB", "--devices", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad device list ''" in err[0], err
