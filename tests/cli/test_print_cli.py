"""``distsim print``: programs as text; parse, verify, print identically."""
import pytest

from distsim.cli import main


def test_print_model_then_file_round_trips(tmp_path, capsys):
    assert main(["print", "--model", "mlp", "--layers", "2", "--hidden", "8", "--batch", "4",
                 "--dp", "2"]) == 0
    text = capsys.readouterr().out
    assert "comm.allreduce" in text and "@1" in text
    path = tmp_path / "prog.dir"
    path.write_text(text)
    assert main(["print", str(path)]) == 0
    assert capsys.readouterr().out == text


def test_print_coarsened_model_then_file_round_trips(tmp_path, capsys):
    """A coarsened program prints its fused segments after the step (they
    were left out, and the file did not read back)."""
    assert main(["print", "--model", "tiny", "--tp", "2", "--pp", "2", "--microbatches", "4",
                 "--coarsen", "--topology", "dgx-a100"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("func @gpt_step(") and "\nfunc @F0.seg" in text
    path = tmp_path / "prog.dir"
    path.write_text(text)
    assert main(["print", str(path)]) == 0
    assert capsys.readouterr().out == text


def test_print_fused_op_without_its_segment(tmp_path, capsys):
    path = tmp_path / "prog.dir"
    path.write_text("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n"
                    "  %y = fused(%x) {ops = 1, segment = \"gone\"} : f32[4]@0\n  return %y\n}\n")
    assert main(["print", str(path)]) == 2
    err = capsys.readouterr().err
    assert "prog.dir:2:8" in err and "@gone" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content,message", [
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[4]@0\n  return %x\n",
     "prog.dir:4:1"),
    ("func @f(%x: f32[4]@0, %w: f32[3,3]@0) -> (f32[4,3]@0) {\n"
     "  %y = matmul(%x, %w) : f32[4,3]@0\n  return %y\n}\n", "matmul needs rank >= 2"),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[5]@0\n  return %x\n}\n",
     "declared f32"),
])
def test_print_bad_file(tmp_path, capsys, content, message):
    path = tmp_path / "prog.dir"
    path.write_text(content)
    assert main(["print", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_print_missing_file(capsys):
    assert main(["print", "/no/such/file.dir"]) == 2
    assert "file not found" in capsys.readouterr().err
