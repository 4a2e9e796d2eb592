"""Topology size caps and duplicate names: one ConfigError before any
graph is built; identical re-declarations stay allowed."""
from __future__ import annotations

import textwrap

import pytest

from distsim.errors import ConfigError
from distsim.topology import load_topology
from distsim.topology.builders import MAX_DEVICES, build_star, check_device_count

DEVICE = ("device: {name: t, peak_flops: {f16: 1.0e+12}, memory_bandwidth_Bps: 1.0e+12, "
          "memory_bytes: 1.0e+9}")


def _write(tmp_path, body: str):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\n" + DEVICE + "\n" + textwrap.dedent(body))
    return str(path)


def test_device_cap_boundary():
    check_device_count(MAX_DEVICES, "here")
    with pytest.raises(ConfigError, match=r"^here: 65,537 devices is more than the 65,536"):
        check_device_count(MAX_DEVICES + 1, "here")


def test_builders_check_before_building():
    with pytest.raises(ConfigError, match="params.devices: 100,000,000 devices"):
        build_star({"devices": 10**8}, "params")


@pytest.mark.parametrize("name", ["dgx-a100-x8193", "dgx-a100-x0000000000000000000000001000000"])
def test_cluster_names_past_the_cap(name):
    with pytest.raises(ConfigError, match="devices distsim simulates"):
        load_topology(name)


def test_leading_zeros_are_still_a_node_count():
    assert load_topology("dgx-a100-x0002").num_devices == 16
    # the same cluster, named canonically whichever spelling was loaded first
    # (the cache used to hand "dgx-a100-x2" the name "dgx-a100-x0002")
    assert load_topology("dgx-a100-x0002").name == load_topology("dgx-a100-x2").name \
        == "dgx-a100-x2"


def test_identical_redeclared_link_is_allowed(tmp_path):
    topo = load_topology(_write(tmp_path, """\
        devices: [a, b]
        links:
          - {src: a, dst: b, bandwidth_GBps: 10, latency_us: 1}
          - {src: b, dst: a, bandwidth_GBps: 10, latency_us: 1}
        """))
    assert topo.num_devices == 2


def test_one_way_links_in_both_directions_are_not_duplicates(tmp_path):
    topo = load_topology(_write(tmp_path, """\
        devices: [a, b]
        links:
          - {src: a, dst: b, bandwidth_GBps: 10, latency_us: 1, duplex: false}
          - {src: b, dst: a, bandwidth_GBps: 20, latency_us: 1, duplex: false}
        """))
    assert topo.num_devices == 2


def test_duplex_then_conflicting_reverse_link(tmp_path):
    with pytest.raises(ConfigError, match=r"links\[1\]: link b -> a is declared twice with "
                                          r"different bandwidth or latency \(also by links\[0\]\)"):
        load_topology(_write(tmp_path, """\
            devices: [a, b]
            links:
              - {src: a, dst: b, bandwidth_GBps: 10, latency_us: 1}
              - {src: b, dst: a, bandwidth_GBps: 10, latency_us: 2, duplex: false}
            """))


def test_range_cap_counts_every_range_of_a_field(tmp_path):
    with pytest.raises(ConfigError, match="more than the 262,144 a topology may have"):
        load_topology(_write(tmp_path, """\
            devices: [a, b]
            switches: ["s{0..200000}", "t{0..200000}"]
            links: [{src: a, dst: b, bandwidth_GBps: 1, latency_us: 1}]
            """))
