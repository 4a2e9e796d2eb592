"""``distsim collective``: the table, JSON, sweeps and bad input."""
import json

import pytest

from distsim.cli import collective
from distsim.errors import ConfigError, TopologyError
from distsim.sim.collective_bench import parse_bytes, parse_ranks, parse_sweep


def run(argv, capsys):
    import argparse
    parser = argparse.ArgumentParser()
    collective.add_parser(parser.add_subparsers())
    args = parser.parse_args(["collective"] + argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_allreduce_json_has_nccl_tests_fields(capsys):
    out = json.loads(run(["allreduce", "--bytes", "1GB", "--topology", "dgx-a100",
                          "--devices", "0-7", "--algo", "ring", "--json"], capsys))
    t = 2 * 7 / 8 * 1e9 / 300e9 + 14e-6
    assert out["time_s"] == pytest.approx(t, rel=1e-6)
    assert out["algbw_Bps"] == pytest.approx(1e9 / t, rel=1e-6)
    assert out["busbw_Bps"] == pytest.approx(1e9 / t * 2 * 7 / 8, rel=1e-6)
    assert out["algorithm"] == "ring" and out["ranks"] == 8


def test_sweep_prints_one_row_per_size(capsys):
    out = run(["all-gather", "--sweep-bytes", "1KB:1MB:4", "--topology", "dgx-a100-x2",
               "--nodes", "2"], capsys)
    lines = out.strip().splitlines()
    assert lines[0].startswith("# allgather on dgx-a100-x2, 16 ranks")
    assert len(lines) == 2 + 5          # 1K 4K 16K 64K 256K


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter", "alltoall",
                                  "broadcast", "reduce", "gather", "scatter", "sendrecv"])
def test_every_kind_runs(kind, capsys):
    out = json.loads(run([kind, "--bytes", "1MB", "--json"], capsys))
    assert out["time_s"] > 0


def test_parsers():
    assert parse_bytes("1GB") == 10 ** 9 and parse_bytes("1GiB") == 2 ** 30
    assert parse_bytes("4096") == 4096 and parse_bytes("1.5KB") == 1500
    assert parse_sweep("1KB:8KB") == [1000, 2000, 4000, 8000]
    assert parse_ranks("0-2,8") == (0, 1, 2, 8)
    for bad in ("1XB", "-1", "GB"):
        with pytest.raises(ConfigError, match="bad size"):
            parse_bytes(bad)


def test_bad_input(capsys):
    with pytest.raises(ConfigError, match="unknown collective 'allsum'"):
        run(["allsum"], capsys)
    with pytest.raises(TopologyError, match="team rank 8"):
        run(["allreduce", "--devices", "0-8"], capsys)
    with pytest.raises(ConfigError, match="--nodes 0: topology 'dgx-a100' has 1 node"):
        run(["allreduce", "--nodes", "0"], capsys)


def test_nodes_past_a_one_server_topology_use_its_cluster(capsys):
    # dgx-a100 --nodes 2 is dgx-a100-x2: 16 ranks, hierarchical over the
    # rails: 2 x 7 NVSwitch steps of S/8 (1 us) + 2 rail steps of S/16 (3 us)
    S = 1e9
    out = json.loads(run(["allreduce", "--bytes", "1GB", "--topology", "dgx-a100",
                          "--nodes", "2", "--json"], capsys))
    assert out["topology"] == "dgx-a100-x2" and out["ranks"] == 16
    assert out["algorithm"] == "hierarchical"
    assert out["time_s"] == pytest.approx(2 * 7 * (1e-6 + S / 8 / 300e9)
                                          + 2 * (3e-6 + S / 16 / 25e9), rel=0.01)
    lines = run(["allgather", "--sweep-bytes", "1KB:4KB", "--topology", "dgx-h100",
                 "--nodes", "4"], capsys).splitlines()
    assert lines[0].startswith("# allgather on dgx-h100-x4, 32 ranks")


@pytest.mark.parametrize("topology, message", [
    ("dgx-a100-x2", "--nodes 4: topology 'dgx-a100-x2' has 2 node(s); pass a cluster with "
                    "enough servers, e.g. --topology dgx-a100-x4"),
    ("pcie-tree-4gpu", "--nodes 2: topology 'pcie-tree-4gpu' has 1 node(s)"),
])
def test_nodes_past_a_cluster_or_a_non_dgx_topology_say_what_to_pass(topology, message, capsys):
    nodes = "4" if topology.endswith("x2") else "2"
    with pytest.raises(ConfigError) as err:
        run(["allreduce", "--topology", topology, "--nodes", nodes], capsys)
    assert str(err.value) == message
