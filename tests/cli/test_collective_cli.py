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
    # NCCL's Simple protocol (topologies/dgx-a100.yaml): adding GPUs held to
    # 235 GB/s, 8.4 us once, 200 us for the pipeline to fill, 14 steps of a
    # 1 us path and 1.0 us
    t = 8.4e-6 + 200e-6 + 14 * 2.0e-6 + 2 * 7 / 8 * 1e9 / 235e9
    assert out["time_s"] == pytest.approx(t, rel=1e-6)
    assert out["algbw_Bps"] == pytest.approx(1e9 / t, rel=1e-6)
    assert out["busbw_Bps"] == pytest.approx(1e9 / t * 2 * 7 / 8, rel=1e-6)
    assert out["algorithm"] == "ring" and out["ranks"] == 8 and out["protocol"] == "Simple"


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
    with pytest.raises(ConfigError, match="--nodes: must be a positive integer, got 0"):
        run(["allreduce", "--nodes", "0"], capsys)


def test_nodes_past_a_one_server_topology_use_its_cluster(capsys):
    # dgx-a100 --nodes 2 is dgx-a100-x2: 16 ranks, one ring per NIC (NCCL's
    # channels) under NCCL's Simple protocol (topologies/dgx-a100.yaml): in
    # each of 30 steps a rank sends 7/8 of S/16 over NVLink (1 us a path, 1 us
    # a step) and 1/8 over its NIC at 96 % of 25 GB/s (3 us a path within a
    # rail, 5 us from the second server back to the first through the spine;
    # 14 us a step): the NIC binds, and the step waits the mean latency
    # weighted by those shares; 8.4 us once, 200 us for the pipeline to fill
    S = 1e9
    out = json.loads(run(["allreduce", "--bytes", "1GB", "--topology", "dgx-a100",
                          "--nodes", "2", "--json"], capsys))
    assert out["topology"] == "dgx-a100-x2" and out["ranks"] == 16
    assert out["algorithm"] == "ring"
    nic = 0.96 * 25e9
    step = 7 / 8 * (1e-6 + 1.0e-6) + 1 / 8 * (5e-6 + 14e-6)
    assert out["time_s"] == pytest.approx(8.4e-6 + 200e-6 + 30 * step
                                          + 30 * S / 16 / 8 / nic, rel=1e-6)
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


@pytest.mark.parametrize("text, message", [
    # a factor just above 1 asked for ~7e8 sizes, each simulated: a hang
    ("1:1e30:1.0000001", "--sweep-bytes '1:1e30:1.0000001': 690,775,563 sizes, more than "
                         "1,000; use a larger factor or a narrower range"),
    # NaN compared false with `<= 1` and gave a one-row sweep
    ("1KB:1MB:nan", "--sweep-bytes '1KB:1MB:nan': the factor must be a finite number > 1, "
                    "got 'nan'"),
    ("1KB:1MB:inf", "--sweep-bytes '1KB:1MB:inf': the factor must be a finite number > 1, "
                    "got 'inf'"),
    ("1KB:1MB:1", "--sweep-bytes '1KB:1MB:1': the factor must be a finite number > 1, got '1'"),
    ("2KB:1KB", "--sweep-bytes '2KB:1KB': MIN 2000 is larger than MAX 1000"),
    ("0:1KB", "--sweep-bytes '0:1KB': MIN must be at least 1 byte"),
    ("1:1e400", "--sweep-bytes '1:1e400': bad size '1e400': must be a finite number of bytes"),
    ("1:2:3:4", "--sweep-bytes '1:2:3:4': expected MIN:MAX or MIN:MAX:FACTOR"),
])
def test_sweep_bytes_is_bounded_and_checked(text, message, capsys):
    with pytest.raises(ConfigError) as err:
        parse_sweep(text)
    assert str(err.value) == message
    with pytest.raises(ConfigError):
        run(["allreduce", "--sweep-bytes", text], capsys)


def test_sweep_bytes_lists_each_size_once_up_to_the_cap():
    from distsim.sim.collective_bench import MAX_SWEEP_SIZES
    assert parse_sweep("1:10:1.1") == list(range(1, 11))     # no repeated rounded sizes
    assert parse_sweep("5:5") == [5]
    assert len(parse_sweep("1:1e9:1.021")) <= MAX_SWEEP_SIZES
    with pytest.raises(ConfigError, match="1,012 sizes, more than 1,000"):
        parse_sweep("1:1e9:1.0207")
    with pytest.raises(ConfigError, match="must be a finite number of bytes"):
        parse_bytes("1e400")
