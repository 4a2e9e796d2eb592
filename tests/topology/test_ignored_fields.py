"""Topology fields that would be silently ignored are refused by name: an
unknown key in the ``devices`` block (a typo such as ``pernode``), graph
fields beside a builder (the builder makes the whole graph), ``params``
without a builder, and a ``name`` that is not text."""
from __future__ import annotations

import pytest

from distsim.errors import ConfigError
from distsim.topology.loader import topology_from_dict

DEVICE = {"name": "t", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
LINK = {"src": "gpu0", "dst": "gpu1", "bandwidth_GBps": 10, "latency_us": 1}
GRAPH = {"name": "t", "device": DEVICE, "devices": {"count": 2}, "links": [LINK]}
STAR = {"name": "s", "device": DEVICE, "builder": "star", "params": {"devices": 4}}


@pytest.mark.parametrize("data, message", [
    ({**GRAPH, "devices": {"count": 2, "pernode": 1}},
     "bad.yaml: devices.pernode: unknown field (allowed: count, name, per_node)"),
    ({**STAR, "devices": {"count": 2}}, "bad.yaml: devices: not allowed with a builder"),
    ({**STAR, "links": [LINK]}, "bad.yaml: links: not allowed with a builder"),
    ({**GRAPH, "params": {"devices": 4}}, "bad.yaml: params: only with a builder"),
    ({**GRAPH, "name": [1, 2]}, "bad.yaml: name: must be text, got [1, 2]"),
])
def test_ignored_fields_are_refused(data, message):
    with pytest.raises(ConfigError) as info:
        topology_from_dict(data, "bad.yaml")
    assert str(info.value).startswith(message)


def test_the_valid_forms_still_load():
    assert topology_from_dict(GRAPH, "ok.yaml").num_devices == 2
    assert topology_from_dict(STAR, "ok.yaml").num_devices == 4
    assert topology_from_dict({**GRAPH, "name": None}, "ok.yaml").name == "ok"
