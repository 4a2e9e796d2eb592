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
    run(["dgx-a100", "--draw", str(out)], capsys)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list_and_unknown(capsys):
    assert "dgx-a100-xN" in run([], capsys).split()
    with pytest.raises(ConfigError, match="unknown topology"):
        run(["nope"], capsys)
