"""``distsim simulate FILE.dir`` (and ``distsim.simulate("FILE.dir")``): a
DistIR text program is simulated, an annotated one after propagation and
lowering, a per-device one as written; bad input is one line naming the
file, exit status 2."""
import json

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError, DistsimError
from distsim.text import print_function

# A row-parallel matmul on two devices: x split along its columns, w along
# its rows; each device multiplies its halves (a partial sum) and an
# all-reduce makes the product whole on both.
ROW = '''mesh @m = [2] ("tp")

func @main(%x: f32[64,128]<@m, [S(1)]>, %w: f32[128,256]<@m, [S(0)]>) -> (f32[64,256]<@m, [R]>) {
  %y = matmul(%x, %w) : f32[64,256]<@m, [P(sum)]>
  %z = redistribute(%y) : f32[64,256]<@m, [R]>
  return %z
}
'''
# The same step written per device: what the lowering of ROW is.
PER_DEVICE = ("func @main(%x0: f32[64,64]@0, %x1: f32[64,64]@1, %w0: f32[64,256]@0, "
              "%w1: f32[64,256]@1) -> (f32[64,256]@0, f32[64,256]@1) {\n"
              "  %y0 = matmul(%x0, %w0) : f32[64,256]@0\n"
              "  %y1 = matmul(%x1, %w1) : f32[64,256]@1\n"
              '  %z0, %z1 = comm.allreduce(%y0, %y1) {ranks = [0, 1], reduce_op = "sum"} : '
              "f32[64,256]@0, f32[64,256]@1\n"
              "  return %z0, %z1\n}\n")
# 1 TFLOP/s at full efficiency, no launch cost, memory never the bound;
# 1 GB/s links without latency through one switch
UNIT = '''name: unit-pair
device: {name: unit, peak_flops: {f32: 1.0e+12}, memory_bandwidth_Bps: 1.0e+18,
         memory_bytes: 1.0e+9, launch_overhead_s: 0.0, matmul_efficiency: 1.0,
         vector_efficiency: 1.0, memory_efficiency: 1.0}
builder: star
params: {devices: 2, link_GBps: 1.0, latency_us: 0.0}
'''


@pytest.fixture
def files(tmp_path):
    (tmp_path / "row.dir").write_text(ROW)
    (tmp_path / "per_device.dir").write_text(PER_DEVICE)
    (tmp_path / "unit.yaml").write_text(UNIT)
    return tmp_path


@pytest.mark.parametrize("name", ["row.dir", "per_device.dir"])
@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_step_time_and_memory_by_hand(files, name, mode):
    r = distsim.simulate(str(files / name), topology=str(files / "unit.yaml"), network_mode=mode,
                         collective_algo="ring")
    # compute: 2 x 64 x 64 x 256 FLOP = 2,097,152 FLOP at 1e12 FLOP/s = 2.097152 us per
    # device; the all-reduce of 64 x 256 x 4 B = 65,536 B as a ring of two: each device sends
    # half (32,768 B) to reduce and half to gather, 2 x 32.768 us at 1 GB/s
    assert r.step_time_s == pytest.approx(2.097152e-6 + 65.536e-6, rel=1e-12)
    s = r.summary()
    assert s["config"]["family"] == "program" and s["config"]["devices"] == 2
    for d in s["devices"]:
        assert d["flops"] == 2 * 64 * 64 * 256
        assert d["communication_bytes"] == 65536
        # at the matmul: x's shard (16 KiB), w's (64 KiB) and the product (64 KiB); then x
        # and w are dead, and the all-reduce holds the product and its result (128 KiB)
        assert d["peak_memory_bytes"] == 64 * 64 * 4 + 64 * 256 * 4 + 64 * 256 * 4


def test_the_simulated_program_is_the_one_lower_prints(files, capsys):
    assert main(["lower", str(files / "row.dir")]) == 0
    printed = capsys.readouterr().out
    r = distsim.simulate(str(files / "row.dir"), topology=str(files / "unit.yaml"))
    assert print_function(r.program) == printed
    assert [op.op_type for op in r.program.ops] == ["matmul", "matmul", "comm.allreduce"]


def test_cli_runs_the_example_program(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["simulate", "models/nested_mlp.dir", "--topology", "dgx-a100", "--no-plots",
                 "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"]["model"] == "nested_mlp"
    # data parallel over two devices: each runs its half of the batch (4 rows) through both
    # MLPs: four matmuls of 4 x 16 x 32 (2 FLOP per multiply-add) and two relus of 4 x 32
    # elements (1 FLOP each); nothing is communicated
    assert summary["total_flops"] == 2 * (4 * 2 * 4 * 16 * 32 + 2 * 4 * 32)
    assert all(d["communication_bytes"] == 0 for d in summary["devices"])
    assert sorted(d["rank"] for d in summary["devices"]) == [0, 1]
    assert json.loads((out / "summary.json").read_text())["step_time_s"] == \
        summary["step_time_s"] > 0
    # by its stem, as the other example programs are named
    assert distsim.simulate("nested_mlp").step_time_s == summary["step_time_s"]


def _error(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("text, message", [
    ("func @main(%x: f32[4]@12) -> (f32[4]@12) {\n  %y = relu(%x) : f32[4]@12\n"
     "  return %y\n}\n", "value %x is on device 12"),
    ("func @main(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x, %x) : f32[4]@0\n"
     "  return %y\n}\n", ":2: function 'main', op %y = relu: expects 1 inputs, got 2"),
    ("func @main(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x : f32[4]@0\n  return %y\n}\n",
     ":2:16: expected ','"),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[4]@0\n  return %y\n}\n"
     "func @g(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[4]@0\n  return %y\n}\n",
     "no function @main to simulate, and the file has several (@f, @g): name the step @main"),
])
def test_a_bad_program_is_one_line_naming_the_file(tmp_path, capsys, text, message):
    path = tmp_path / "bad.dir"
    path.write_text(text)
    out = tmp_path / "out"
    err = _error(["simulate", str(path), "--no-plots", "--out", str(out)], capsys)
    assert err.startswith(f"distsim: error: {path}:"), err
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize("fusion", ["none", "megatron"])
def test_a_printed_step_simulates_as_the_model_does(tmp_path, capsys, fusion):
    """``distsim print``'s output (the step, named after the model, and,
    under a fusion, the functions of its fused kernels beside it) is
    simulated as it is: the same step time as the model's."""
    assert main(["print", "--model", "tiny", "--dp", "8", "--topology", "dgx-a100",
                 "--fusion", fusion]) == 0
    text = capsys.readouterr().out
    assert text.startswith("func @gpt_step(")
    assert (text.count("\nfunc @") > 0) == (fusion == "megatron")
    path = tmp_path / "tiny_dp8.dir"
    path.write_text(text)
    printed = distsim.simulate(str(path), topology="dgx-a100")
    model = distsim.simulate("tiny", dp=8, topology="dgx-a100", fusion=fusion)
    assert printed.step_time_s == model.step_time_s


def test_a_missing_file_is_named(tmp_path, capsys):
    path = tmp_path / "absent.dir"
    err = _error(["simulate", str(path), "--no-plots", "--out", str(tmp_path / "o")], capsys)
    assert f"{path}: file not found" in err


@pytest.mark.parametrize("flags, said", [
    (["--tp", "2"], "--tp 2"), (["--dp", "2"], "--dp 2"), (["--zero", "1"], "--zero 1"),
    (["--layers", "3"], "--layers 3"), (["--sp"], "--sp"),
])
def test_strategy_and_model_options_are_refused_by_name(tmp_path, capsys, flags, said):
    err = _error(["simulate", "models/nested_mlp.dir", *flags, "--no-plots",
                  "--out", str(tmp_path / "o")], capsys)
    assert f"models/nested_mlp.dir: {said}: a DistIR text program fixes its own" in err


def test_a_program_and_a_model_together_are_refused(tmp_path, capsys):
    err = _error(["simulate", "models/nested_mlp.dir", "--model", "gpt2", "--no-plots",
                  "--out", str(tmp_path / "o")], capsys)
    assert "models/nested_mlp.dir: give a program file or --model gpt2, not both" in err


def test_the_api_refuses_the_same(tmp_path):
    with pytest.raises(ConfigError, match=r"nested_mlp.dir: --pp 2: a DistIR text program"):
        distsim.simulate("models/nested_mlp.dir", pp=2)
    with pytest.raises(DistsimError, match=r"absent.dir: file not found"):
        distsim.simulate(str(tmp_path / "absent.dir"))


def test_a_positional_model_that_is_no_program_is_refused(tmp_path, capsys):
    err = _error(["simulate", "gpt2", "--no-plots", "--out", str(tmp_path / "o")], capsys)
    assert "gpt2: not a DistIR text program" in err and "--model" in err
