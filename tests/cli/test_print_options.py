"""``distsim print``: a model or strategy flag beside a file is refused
(the file is printed as it is, the flag would be silently ignored); ONNX
models take ``--input-shape`` / ``--train`` as in ``simulate`` (the error
for a symbolic batch tells the user to give ``--input-shape``)."""
from __future__ import annotations

from pathlib import Path

import pytest

from distsim.cli import main

NESTED = str(Path(__file__).resolve().parents[2] / "models" / "nested_mlp.dir")


@pytest.mark.parametrize("flags, named", [
    (["--tp", "2"], "--tp"),
    (["--model", "tiny"], "--model"),
    (["--global-batch", "4"], "--global-batch"),
    (["--topology", "dgx-a100-x2"], "--topology"),
])
def test_flags_beside_a_file_are_refused(capsys, flags, named):
    assert main(["print", NESTED] + flags) == 2
    assert capsys.readouterr().err.startswith(f"distsim: error: {named}: a model or strategy "
                                              "option does not apply to a file")


def test_a_file_alone_still_prints(capsys):
    assert main(["print", NESTED]) == 0
    assert capsys.readouterr().out.startswith('mesh @m = [2] ("dp")')


def test_onnx_input_shape_is_an_option_of_print(capsys):
    onnx = str(Path(NESTED).parent / "gpt2-tiny.onnx")
    assert main(["print", "--model", onnx, "--input-shape", "input_ids=4x16", "--dp", "4",
                 "--topology", "pcie-tree-4gpu"]) == 0
    assert capsys.readouterr().out.startswith("func @main_graph(")

