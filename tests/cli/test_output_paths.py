"""Output paths that cannot work are refused up front, by flag, exit 2:
``simulate --out ''`` (it would write into the current folder) or a file,
checked before the simulation rather than after it; ``topology --draw``
onto a folder or ''."""
from __future__ import annotations

import pytest

from distsim.cli import main

SMALL = ["simulate", "--layers", "1", "--hidden", "8", "--batch", "8", "--dp", "1",
         "--no-plots"]


@pytest.mark.parametrize("target, message", [
    ("", "--out: must name a folder, got ''"),
    ("FILE", "--out {file}: exists and is not a directory"),
])
def test_simulate_refuses_bad_out(tmp_path, capsys, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "a-file"
    file.write_text("keep")
    out = str(file) if target == "FILE" else target
    assert main(SMALL + ["--out", out]) == 2
    assert capsys.readouterr().err == f"distsim: error: {message.format(file=file)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]   # nothing written
    assert file.read_text() == "keep"


def test_simulate_refuses_bad_out_before_simulating(tmp_path, capsys, monkeypatch):
    import distsim.cli.simulate_cmd as cmd
    monkeypatch.setattr(cmd, "simulate", lambda **kw: pytest.fail("simulated first"))
    assert main(SMALL + ["--out", ""]) == 2


@pytest.mark.parametrize("target, message", [
    ("", "--draw: must name a .png file, got ''"),
    ("DIR", "--draw {dir}: is a directory, expected a .png file name"),
])
def test_draw_refuses_a_folder(tmp_path, capsys, target, message):
    where = str(tmp_path) if target == "DIR" else target
    assert main(["topology", "dgx-a100", "--draw", where]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == f"distsim: error: {message.format(dir=tmp_path)}"
    assert list(tmp_path.iterdir()) == []


def test_draw_without_a_topology_name_is_refused(tmp_path, capsys):
    target = tmp_path / "g.png"
    assert main(["topology", "--draw", str(target)]) == 2
    assert capsys.readouterr().err == (f"distsim: error: --draw {target}: give the topology "
                                       "NAME to draw\n")
