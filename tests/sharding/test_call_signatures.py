"""Every call is checked against its callee's signature before anything
reads it: argument and result counts, shapes and dtypes (placements may
differ before propagation: a redistribute reconciles them). A mismatch is
one error naming the call op, with the file and line it was read from; the
CLI's print, check, lower and lower --global all refuse it with status 2."""
import pytest

from distsim.cli import main
from distsim.errors import VerifyError
from distsim.text import parse_module
from distsim.transforms.sharding import propagate, shard_program, verify_sharded

CALLEE = '''mesh @m = [2] ("dp")

func @f(%x: f32[8,16], %w: f32[16,16]) -> (f32[8,16]) {
  %y = matmul(%x, %w) : f32[8,16]
  return %y
}

'''

# (main, the error after "case.dir:9: function 'main', op %y = call: ")
CASES = {
    "argument shape": (
        '''func @main(%x: f32[8,32]<@m, [S(0)]>, %w: f32[16,16]) -> (f32[8,16]) {
  %y = call(%x, %w) {callee = "f"} : f32[8,16]
  return %y
}
''', "argument 0 %x is f32[8,32], but @f takes f32[8,16] (parameter %x)"),
    "argument dtype": (
        '''func @main(%x: f32[8,16]<@m, [S(0)]>, %w: f16[16,16]) -> (f32[8,16]) {
  %y = call(%x, %w) {callee = "f"} : f32[8,16]
  return %y
}
''', "argument 1 %w is f16[16,16], but @f takes f32[16,16] (parameter %w)"),
    "argument count": (
        '''func @main(%x: f32[8,16]<@m, [S(0)]>) -> (f32[8,16]) {
  %y = call(%x) {callee = "f"} : f32[8,16]
  return %y
}
''', "@f takes 2 arguments, the call passes 1"),
    "result shape": (
        '''func @main(%x: f32[8,16]<@m, [S(0)]>, %w: f32[16,16]) -> (f32[8,32]) {
  %y = call(%x, %w) {callee = "f"} : f32[8,32]
  return %y
}
''', "result 0 %y is declared f32[8,32], but @f returns f32[8,16]"),
    "result count": (
        '''func @main(%x: f32[8,16]<@m, [S(0)]>, %w: f32[16,16]) -> (f32[8,16]) {
  %y, %z = call(%x, %w) {callee = "f"} : f32[8,16], f32[8,16]
  return %y
}
''', "@f returns 1 values, the call declares 2 results"),
}


def _message(path, case):
    return f"{path}:9: function 'main', op %y{', %z' if case == 'result count' else ''} = call: " \
           f"{CASES[case][1]} (rule: call signature)"


@pytest.mark.parametrize("case", CASES)
def test_the_verifier_refuses_a_call_that_does_not_match_its_callee(case):
    module = parse_module(CALLEE + CASES[case][0], source="case.dir")
    with pytest.raises(VerifyError) as info:
        verify_sharded(module)
    assert str(info.value) == _message("case.dir", case)


@pytest.mark.parametrize("case", CASES)
def test_propagation_checks_the_calls_first(case):
    # a module nobody verified: propagation refuses it with the same error
    for run in (propagate, shard_program):
        with pytest.raises(VerifyError) as info:
            run(parse_module(CALLEE + CASES[case][0], source="case.dir"))
        assert str(info.value) == _message("case.dir", case)


@pytest.mark.parametrize("command", [["print"], ["check"], ["lower"], ["lower", "--global"]])
@pytest.mark.parametrize("case", ["argument shape", "result shape"])
def test_every_command_refuses_it_in_one_line(tmp_path, capsys, command, case):
    path = tmp_path / "case.dir"
    path.write_text(CALLEE + CASES[case][0])
    assert main(command + [str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"distsim: error: {_message(path, case)}\n"


def test_placements_may_differ_from_the_callee_before_propagation():
    # the callee takes %x replicated; main passes it sharded: a redistribute, not an error
    text = CALLEE.replace("%x: f32[8,16], %w", "%x: f32[8,16]<@m, [R]>, %w") + \
        '''func @main(%x: f32[8,16]<@m, [S(0)]>, %w: f32[16,16]) -> (f32[8,16]<@m, [S(0)]>) {
  %y = call(%x, %w) {callee = "f"} : f32[8,16]<@m, [S(0)]>
  return %y
}
'''
    sharded, _ = shard_program(verify_sharded(parse_module(text)))
    assert [op.op_type for op in sharded.functions["main"].ops] == ["call", "redistribute"]
    assert [op.op_type for op in sharded.functions["f"].ops] == ["redistribute", "matmul"]
