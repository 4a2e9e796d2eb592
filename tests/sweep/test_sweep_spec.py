"""Grid expansion, constraints, and bad specs (one clear error, before any work)."""
from __future__ import annotations

from dataclasses import fields

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.sweep import SweepSpec, config_key, load_spec, simulate_parameters
from distsim.transforms.strategy import Strategy
from sweep_fakes import TINY


def test_parameters_are_the_simulate_options():
    params = simulate_parameters()
    for f in fields(Strategy):                      # every strategy field, present and future
        assert f.name in params and params[f.name].group == "strategy"
    for name in ("model", "topology", "network_mode", "collective_algo", "layers", "hidden",
                 "batch", "dtype"):
        assert name in params
    assert params["tp"].kind == "int" and params["hidden"].kind == "int"
    assert "analytical" in params["network_mode"].choices


def test_grid_expands_in_order_last_option_fastest():
    spec = SweepSpec.create(TINY, {"dp": [1, 2, 4], "hidden": [64, 128]})
    points = spec.points()
    assert spec.size == len(points) == 6
    assert [(p.params["dp"], p.params["hidden"]) for p in points] == [
        (1, 64), (1, 128), (2, 64), (2, 128), (4, 64), (4, 128)]
    assert [p.index for p in points] == list(range(6))
    assert all(p.params["layers"] == 2 for p in points)
    assert len({p.key for p in points}) == 6
    # the key is a hash of the options, independent of their order
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1})


def test_constraints_skip_with_reason():
    def small_enough(config):
        return config["hidden"] * config["dp"] <= 256

    spec = SweepSpec.create(TINY, {"dp": [1, 2, 4, 16], "hidden": [64, 128]},
                            constraints=["dp <= devices",
                                         {"expr": "hidden % 128 == 0 or dp == 1",
                                          "reason": "odd width"},
                                         small_enough])
    reasons = {(p.params["dp"], p.params["hidden"]): p.skip_reason for p in spec.points()}
    assert reasons[(1, 64)] is None and reasons[(2, 128)] is None
    assert reasons[(16, 64)] == "constraint: dp <= devices"      # dgx-a100: 8 devices
    assert reasons[(2, 64)] == "odd width"
    assert reasons[(4, 128)] == "constraint: small_enough"


def test_sweep_rows_record_skipped_and_invalid(tiny_frame):
    df = tiny_frame
    assert len(df) == 10 and list(df["index"]) == list(range(10))
    by = {(r.dp, r.tp): r for r in df.itertuples()}
    assert by[(1, 1)].status == "ok" and by[(1, 1)].step_time_s > 0
    assert by[(2, 3)].status == "invalid" and "--tp 3 does not divide" in by[(2, 3)].reason
    assert by[(16, 1)].status == "skipped" and by[(16, 1)].reason == "constraint: dp <= devices"
    assert df.loc[df["status"] != "ok", "step_time_s"].isna().all()
    for col in ("step_time_s", "samples_per_s", "tokens_per_s", "mfu", "max_peak_memory_bytes",
                "oom", "bubble_fraction", "exposed_communication_s", "reason", "status"):
        assert col in df.columns


@pytest.mark.parametrize("base, grid, constraints, message", [
    (TINY, {"dpp": [1, 2]}, None, "unknown parameter 'dpp'"),
    ({**TINY, "tpp": 2}, {"dp": [1]}, None, "unknown parameter 'tpp'"),
    (TINY, {"dp": [1, "two"]}, None, "grid.dp[1]: dp must be an integer, got 'two'"),
    (TINY, {"tp": [1.5]}, None, "tp must be an integer"),
    ({"model": "mlp"}, {"network_mode": ["fast"]}, None, "network_mode must be one of"),
    (TINY, {}, None, "grid: is empty"),
    (TINY, {"dp": []}, None, "grid.dp: is an empty list"),
    (TINY, {"dp": 4}, None, "grid.dp: must be a list of values"),
    (TINY, {"dp": [1, 1]}, None, "listed twice"),
    (TINY, {"layers": [1]}, None, "also set in base"),
    (TINY, {"dp": [1]}, ["dpx > 1"], "unknown name(s) dpx"),
    (TINY, {"dp": [1]}, ["__import__('os')"], "may be called"),
    (TINY, {"dp": [1]}, ["dp +"], "not a valid expression"),
    (TINY, {"dp": [1]}, ["dp / (tp - 1) > 0"], "ZeroDivisionError"),
    ({"layers": 2}, {"model": ["mlp", "no-such-model"]}, None, "unknown model 'no-such-model'"),
    (TINY, {"topology": ["no-such-topology"]}, None, "topology 'no-such-topology'"),
])
def test_bad_specs_raise_one_config_error(base, grid, constraints, message, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as err:
        distsim.sweep(base, grid, constraints=constraints, out_dir=out, workers=1,
                      progress=False)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not out.exists()                       # nothing written before the error


def test_yaml_spec_round_trip_and_errors(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: demo\nbase: {model: mlp, layers: 2}\ngrid:\n  dp: [1, 2]\n"
                    "constraints: ['dp <= devices']\ncharts: {heatmap: [dp, dp]}\n")
    spec = load_spec(good)
    assert spec.name == "demo" and spec.size == 2 and spec.charts["heatmap"] == ["dp", "dp"]
    cases = {
        "base: {model: mlp}\n": "grid: missing",
        "grid: {dp: [1]}\nworkers: 3\n": "unknown key(s) workers",
        "grid: [1, 2]\n": "grid: must be a mapping",
        "grid: {dp: [1}\n": "malformed YAML",
        "grid: {dp: [1]}\ncharts: {heatmap: [dp, tp]}\n": "'tp' is not a grid option",
        "- 1\n": "must be a mapping",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=None) as err:
            load_spec(path)
        assert message in str(err.value), (text, str(err.value))
        assert str(path) in str(err.value)


def test_cli_bad_spec_exits_2_without_output(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("base: {model: mlp}\ngrid: {tp: [1, two]}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid.tp[1]: tp must be an integer" in err[0]
    assert not out.exists()
    assert main(["sweep", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert not out.exists()


def test_bad_workers_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--workers: must be a positive integer"):
        distsim.sweep(TINY, {"dp": [1, 2]}, workers=0, out_dir=tmp_path / "o", progress=False)
    assert not (tmp_path / "o").exists()
