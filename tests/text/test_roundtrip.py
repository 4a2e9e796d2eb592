"""The text format: print(parse(text)) == text, and errors with line:column."""
import pytest

from distsim.errors import ParseError
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.models import MLPConfig, mlp_training_step
from distsim.text import parse_function, parse_module, print_function
from distsim.transforms.data_parallel import DataParallel


def roundtrip(f):
    text = print_function(f)
    g = parse_function(text)
    verify(g)
    assert print_function(g) == text
    return text


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_mlp_programs_round_trip(dp):
    step = mlp_training_step(MLPConfig(layers=3, hidden=16, batch=8, dtype="f32"))
    roundtrip(DataParallel(dp)(step))


def test_every_collective_and_attribute_kind_round_trips():
    b = FunctionBuilder("all_kinds")
    xs = [b.input(f"x{r}", TensorType((4, 4), DType.F32, r)) for r in range(2)]
    b.op("comm.allreduce", xs, {"ranks": (0, 1), "reduce_op": "max"})
    b.op("comm.allgather", xs, {"ranks": (0, 1), "dim": 1})
    b.op("comm.reducescatter", xs, {"ranks": (0, 1), "dim": 0})
    b.op("comm.alltoall", xs, {"ranks": (0, 1), "split_dim": 0, "concat_dim": 1})
    b.op("comm.broadcast", [xs[0]], {"ranks": (0, 1), "root": 0})
    b.op("comm.reduce", xs, {"ranks": (0, 1), "root": 1})
    b.op("comm.gather", xs, {"ranks": (0, 1), "root": 0, "dim": 0})
    b.op("comm.scatter", [xs[1]], {"ranks": (0, 1), "root": 1, "dim": 0})
    s = b.op("scale", [xs[0]], {"factor": 1e-30})
    c = b.op("cast", [s], {"dtype": "bf16"})
    y = b.op("comm.sendrecv", [c], {"ranks": (0, 1)})
    text = roundtrip(b.finish([y]))
    assert "factor = 1e-30" in text and "bf16[4,4]@0" in text


def test_scalar_and_unplaced_types():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((3,), DType.F64, None))
    t = b.input("t", TensorType((3,), DType.F64, None))
    text = roundtrip(b.finish([b.op("mse_loss", [x, t])]))
    assert "f64[]" in text and "%x: f64[3]," in text


@pytest.mark.parametrize("text,message,line,col", [
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%z) : f32[4]@0\n  return %y\n}\n",
     "use of undefined value %z", 2, 13),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f99[4]@0\n  return %y\n}\n",
     "unknown dtype 'f99'", 2, 19),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) f32[4]@0\n  return %y\n}\n",
     "expected ':'", 2, 17),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = relu(%x) : f32[4]@0\n", "missing 'return'",
     3, 1),
    ("func @f(%x: f32[-4]@0) -> () {\n  return\n}\n", "negative dimension", 1, 17),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %x = relu(%x) : f32[4]@0\n  return %x\n}\n",
     "defined twice", 2, 3),
    ("func @f() -> () {\n  return\n}\n$", "unexpected character '$'", 4, 1),
    ("func @f(%x: f32[4]@0) -> (f32[4]@0) {\n  %y = fused(%x) {ops = 1, segment = \"s\"} : "
     "f32[4]@0\n  return %y\n}\n", "its segment @s is not a function of this input", 2, 8),
])
def test_parse_errors_have_line_and_column(text, message, line, col):
    with pytest.raises(ParseError) as info:
        parse_module(text, source="prog.dir")
    assert message in str(info.value)
    assert (info.value.line, info.value.column) == (line, col)
    assert str(info.value).startswith(f"prog.dir:{line}:{col}: ")


def test_return_type_mismatch_is_reported():
    text = "func @f(%x: f32[4]@0) -> (f32[5]@0) {\n  return %x\n}\n"
    with pytest.raises(ParseError, match="declared result types"):
        parse_module(text)


def test_a_coarsened_program_round_trips_with_its_segments():
    """print_program writes the fused segments (with their pack and unpack)
    after the step; parsing links each fused op to its segment, and the
    parsed program verifies and takes the same step time as the built one.
    (Its memory is not compared: the text carries no meta, so neither the
    in-place updates nor the roles, for any program.)"""
    from distsim.api import build_program
    from distsim.ir import verify_module
    from distsim.sim.simulator import simulate_function
    from distsim.text import print_program

    program, _, topo = build_program("tiny", "dgx-a100", tp=2, pp=2, microbatches=4,
                                     coarsen=True)
    text = print_program(program)
    module = parse_module(text)
    verify_module(module)
    main = module.main
    assert main.name == program.name and len(module.functions) > 1
    fused = [op for op in main.ops if op.op_type == "fused"]
    assert fused and all(op.subfunctions[0] is module.functions[op.attrs["segment"]]
                         for op in fused)
    assert "pack(" in text and "unpack(" in text
    assert print_program(main) == text
    built, parsed = simulate_function(program, topo), simulate_function(main, topo)
    assert parsed.step_time_s == built.step_time_s
