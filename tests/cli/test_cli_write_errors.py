"""Writes the system refuses are the user's environment, not a bug: an
output file under a folder that cannot be made, or a stdout that cannot
take the output (a full disk), give one line and exit status 2, no
traceback, and nothing left under the final name."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distsim.cli import main


def test_drawing_into_a_folder_that_cannot_be_made(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "graph.png"
    assert main(["topology", "dgx-a100", "--draw", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == f"distsim: error: --draw {target}: the folder {blocker} is not a folder\n"
    assert err.count("\n") == 1
    assert not target.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["models"], ["topology", "dgx-a100", "--json"]])
def test_a_full_stdout_is_one_line_and_status_2(argv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "distsim", *argv], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2
    assert proc.stderr == "distsim: error: cannot write <stdout>: No space left on device\n"
