"""Numbers in exponent notation that PyYAML leaves as strings (2.0e12, 1e9)
are read as numbers in topology files; malformed YAML names file and line."""
import pytest
import yaml

from distsim.errors import ConfigError
from distsim.topology import load_topology
from distsim.topology.loader import yaml_number


def test_pyyaml_reads_these_as_strings():
    # the reason for yaml_number: YAML 1.1 wants a dot and a signed exponent
    assert yaml.safe_load("a: 2.0e12")["a"] == "2.0e12"
    assert yaml.safe_load("c: 2.0e+12")["c"] == 2.0e12
    assert yaml.safe_load("b: 1e9")["b"] == "1e9"


@pytest.mark.parametrize("text,value", [("2.0e12", 2.0e12), ("1e9", 1e9), ("-1.5E-3", -1.5e-3),
                                        (".5e2", 50.0), (" 3e0 ", 3.0)])
def test_exponent_strings_become_numbers(text, value):
    assert yaml_number(text) == value and isinstance(yaml_number(text), float)


@pytest.mark.parametrize("value", ["rail", "1e", "e9", "1.0", "12", "0x10", "inf", "nan", True, 7,
                                   None, [1]])
def test_everything_else_is_left_alone(value):
    assert yaml_number(value) == value


def _write(tmp_path, text):
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return str(p)


def test_explicit_file_with_exponent_numbers(tmp_path):
    t = load_topology(_write(tmp_path, """device: {name: toy, peak_flops: {f32: 1e12},
         memory_bandwidth_Bps: 2.0e12, memory_bytes: 8e10}
devices: [a, b]
links:
  - {src: a, dst: b, bandwidth_Bps: 2.5e10, latency_s: 1e-6, cost: 4e2}
"""))
    assert t.device_spec.memory_bandwidth_Bps == 2e12 and t.device_spec.memory_bytes == 80e9
    assert t.device_spec.peak_flops["f32"] == 1e12
    assert t.link("a", "b")["bandwidth_Bps"] == 2.5e10 and t.link("a", "b")["cost"] == 400


def test_builder_params_with_exponent_numbers(tmp_path):
    t = load_topology(_write(tmp_path, """device: {name: toy, peak_flops: {f32: 1e12},
         memory_bandwidth_Bps: 1e12, memory_bytes: 1e9}
builder: star
params: {devices: 4, link_GBps: 1e2, latency_us: 5e-1}
"""))
    assert t.path_bandwidth_Bps(t.route(0, 1)) == 100e9


def test_bad_numbers_still_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml: links\[0\]\.bandwidth_Bps: must be "
                                          r"positive, got 'fast'"):
        load_topology(_write(tmp_path, """device: {name: toy, peak_flops: {f32: 1e12},
         memory_bandwidth_Bps: 1e12, memory_bytes: 1e9}
devices: [a, b]
links: [{src: a, dst: b, bandwidth_Bps: fast, latency_s: 0}]
"""))
    with pytest.raises(ConfigError, match=r"x\.yaml: params\.link_GBps: must be a positive "
                                          r"number, got '1e'"):
        load_topology(_write(tmp_path, """device: {name: toy, peak_flops: {f32: 1e12},
         memory_bandwidth_Bps: 1e12, memory_bytes: 1e9}
builder: star
params: {link_GBps: 1e}
"""))


def test_malformed_yaml_names_file_line_and_problem(tmp_path):
    with pytest.raises(ConfigError, match=r"x\.yaml:2:\d+: malformed YAML: "):
        load_topology(_write(tmp_path, "name: x\n  bad: [\n"))
