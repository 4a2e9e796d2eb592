"""Errors about a DistIR text file name the file, whichever stage finds
them: parse errors (file:line:column) and verifier errors (file:line of
the op, then the function and op) alike, for ``distsim print``, ``check`` and ``lower``."""
from __future__ import annotations

import pytest

from distsim.cli import main

BAD_TYPE = ("func @f(%x: f32[4]@0) -> (f32[5]@0) {\n  %y = relu(%x) : f32[5]@0\n"
            "  return %y\n}\n")
UNKNOWN_OP = ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = frobnicate(%x) : f32[4]@0\n"
              "  return %y\n}\n")
SYNTAX = "func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[4]@0 $\n  return %y\n}\n"


@pytest.mark.parametrize("command", ["print", "check", "lower"])
@pytest.mark.parametrize("content, message", [
    (BAD_TYPE, "function 'f', op %y = relu: result %y is declared f32[5]@0 but the op "
               "produces f32[4]@0"),
    (UNKNOWN_OP, "function 'f', op %y = frobnicate: unknown op type 'frobnicate'"),
])
def test_verifier_errors_name_the_file(tmp_path, capsys, command, content, message):
    path = tmp_path / "prog.dir"
    path.write_text(content)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"distsim: error: {path}:2: {message}\n"


def test_parse_errors_keep_their_line_and_column(tmp_path, capsys):
    path = tmp_path / "prog.dir"
    path.write_text(SYNTAX)
    assert main(["print", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distsim: error: {path}:2:")
    assert err.count(str(path)) == 1           # named once, not twice
