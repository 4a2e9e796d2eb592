"""``distsim topology``: description, JSON, drawing, listing."""
import argparse
import json

import pytest

from distsim.cli import topology
from distsim.errors import ConfigError


def run(argv, capsys):
    parser = argparse.ArgumentParser()
    topology.add_parser(parser.add_subparsers())
    args = parser.parse_args(["topology"] + argv)
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_describe_text_and_json(capsys):
    text = run(["dgx-a100"], capsys)
    assert "8 x A100-SXM4-80GB" in text and "bisection bandwidth" in text
    info = json.loads(run(["dgx-a100-x2", "--json"], capsys))
    assert info["num_devices"] == 16 and info["num_nodes"] == 2
    # half the ranks = node 0: 8 NICs at 25 GB/s out of it
    assert info["bisection_bandwidth_Bps"] == pytest.approx(8 * 25e9)


def test_draw_writes_a_png(tmp_path, capsys):
    out = tmp_path / "t.png"
    text = run(["dgx-a100", "--draw", str(out)], capsys)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert text.splitlines()[-1] == f"wrote {out}"


def test_draw_with_json_keeps_stdout_one_document(tmp_path, capsys):
    import argparse
    out = tmp_path / "t.png"
    parser = argparse.ArgumentParser()
    topology.add_parser(parser.add_subparsers())
    args = parser.parse_args(["topology", "dgx-a100", "--json", "--draw", str(out)])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_devices"] == 8
    assert captured.err.strip() == f"wrote {out}"


def test_drawing_layers_are_in_natural_order_grouped_by_server():
    from distsim.topology import load_topology
    from distsim.topology.draw import layer_order, natural_key
    assert sorted(["gpu11", "gpu3", "gpu28", "gpu2"], key=natural_key) == \
        ["gpu2", "gpu3", "gpu11", "gpu28"]
    assert sorted(["leaf1.10", "leaf1.2", "leaf0.3"], key=natural_key) == \
        ["leaf0.3", "leaf1.2", "leaf1.10"]
    layers = layer_order(load_topology("dgx-a100-x4"))
    assert layers[0] == [f"gpu{r}" for r in range(32)]
    # row 1: each server's host next to its own NICs, servers left to right
    assert layers[1] == [name for n in range(4)
                         for name in [f"host{n}"] + [f"nic{8 * n + k}" for k in range(8)]]
    assert layers[2][:5] == ["nvswitch0", "pcie0", "pcie1", "pcie2", "pcie3"]
    assert layers[3] == [f"leaf{k}.0" for k in range(8)]


def test_list_and_unknown(capsys):
    assert "dgx-a100-xN" in run([], capsys).split()
    with pytest.raises(ConfigError, match="unknown topology"):
        run(["nope"], capsys)
