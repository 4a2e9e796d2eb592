"""Errors found while sharding a program name the op the user wrote, with
the file and line it was read from, and the calls it was reached through:
not an op the propagator made (``%x_rd = redistribute``) nor a lowered
value (``%mlp.a_r0``). From the CLI they are one line, exit status 2."""
import pytest

from distsim.cli import main
from distsim.errors import PassPreconditionError, VerifyError
from distsim.ir import DType
from distsim.ir.mesh import DTensorType
from distsim.text import parse_module
from distsim.transforms.sharding import LOCAL_RULES, RULES, propagate, shard_program, verify_sharded

NEST = '''mesh @m = [2] ("tp")

func @mlp(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %a = gelu(%h) : f32[8,32]
  %y = matmul(%a, %w2) : f32[8,16]
  return %y
}

func @block(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %h = call(%x, %w1, %w2) {callee = "mlp"} : f32[8,16]
  %y = add(%x, %h) : f32[8,16]
  return %y
}

func @main(%x: f32[8,16]<@m, [R]>, %w1: f32[16,32]<@m, [S(1)]>, %w2: f32[32,16]<@m, [S(0)]>) -> (f32[8,16]) {
  %y = call(%x, %w1, %w2) {callee = "block"} : f32[8,16]
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)

GELU = "case.dir:5: function 'mlp', op %a = gelu"
CALLS = ("(called from case.dir:11: function 'block', op %h = call) "
         "(called from case.dir:17: function 'main', op %y = call)")


def _refuse(ctx):
    raise PassPreconditionError("this rule refuses the op")


def test_an_error_while_placing_an_op_names_it_and_the_calls_to_it(monkeypatch):
    monkeypatch.setitem(RULES, "gelu", _refuse)
    with pytest.raises(PassPreconditionError) as info:
        propagate(parse_module(NEST, source="case.dir"))
    assert str(info.value) == f"{GELU}: this rule refuses the op {CALLS}"


def test_an_error_about_an_op_the_propagator_made_names_the_users_op():
    sharded = propagate(parse_module(NEST, source="case.dir"))
    block = sharded.functions["block"]
    # the residual add takes %x as P(sum): a redistribute made for the add
    made = next(op for op in block.ops if op.op_type == "redistribute")
    assert made.outputs[0].name == "x_rd"
    t = made.outputs[0].type
    made.outputs[0].type = DTensorType(t.shape, DType.F16, t.mesh, t.placements)
    with pytest.raises(VerifyError) as info:
        verify_sharded(sharded, propagated=True)
    assert str(info.value).startswith(
        "case.dir:12: function 'block', op %y = add (as %x_rd = redistribute in @block): "
        "turns f32[8,16] into f16[8,16]")


def test_an_error_while_lowering_names_the_users_op(monkeypatch):
    def refuse(lb, op, c, ins, hints):
        raise VerifyError("no per-device form")

    monkeypatch.setitem(LOCAL_RULES, "gelu", refuse)
    with pytest.raises(VerifyError) as info:
        shard_program(parse_module(NEST, source="case.dir"))
    # (in the lowered program the value is %mlp.a_r0: the message names the user's %a)
    assert str(info.value) == f"{GELU}: no per-device form {CALLS}"


@pytest.mark.parametrize("command", ["check", "lower"])
def test_the_cli_says_it_in_one_line_naming_the_file(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setitem(RULES, "gelu", _refuse)
    path = tmp_path / "case.dir"
    path.write_text(NEST)
    assert main([command, str(path)]) == 2
    out, err = capsys.readouterr()
    expected = f"{GELU}: this rule refuses the op {CALLS}".replace("case.dir", str(path))
    assert out == "" and err == f"distsim: error: {expected}\n"


def test_an_error_about_no_op_names_the_file(tmp_path, capsys):
    path = tmp_path / "case.dir"
    path.write_text('mesh @m = [2] ("tp")\n\nfunc @main(%x: f32[4]) -> (f32[4]) {\n'
                    '  %y = relu(%x) : f32[4]\n  return %y\n}\n')
    assert main(["lower", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"distsim: error: {path}: sharding: no value of @main has a placement "
        "(annotate an input with a DTensor type)\n")


def test_a_redistribute_that_changes_the_dtype_is_refused_where_it_is_written(tmp_path, capsys):
    # it passed the verifier; lowering kept f32 pieces, and check failed in the executor
    path = tmp_path / "case.dir"
    path.write_text('mesh @m = [2] ("dp")\n\n'
                    'func @main(%x: f32[8,16]<@m, [S(0)]>) -> (f16[8,16]) {\n'
                    '  %y = redistribute(%x) : f16[8,16]<@m, [R]>\n'
                    '  %z = relu(%y) : f16[8,16]\n  return %z\n}\n')
    for command in ("print", "check", "lower"):
        assert main([command, str(path)]) == 2
        assert capsys.readouterr().err == (
            f"distsim: error: {path}:4: function 'main', op %y = redistribute: turns f32[8,16] "
            "into f16[8,16]: only placements may change (rule: redistribute keeps the tensor)\n")


def test_a_callee_without_values_has_nothing_to_place():
    # it was refused with "no value of @g has a placement", naming neither the call nor the file
    text = '''mesh @m = [2] ("dp")

func @g() -> () {
  return
}

func @main(%x: f32[8,16]<@m, [S(0)]>) -> (f32[8,16]) {
  call() {callee = "g"}
  %z = relu(%x) : f32[8,16]
  return %z
}
'''
    sharded, local = shard_program(parse_module(text))
    assert [op.op_type for op in local.ops] == ["relu", "relu"]
