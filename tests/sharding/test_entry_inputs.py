"""An unannotated input of the entry function takes the cheapest placement
the planner finds: of the one the sweeps give it and that one with some of
its axes replicated, the one whose sharded program costs least (a tie keeps
the sweeps' placement). Three-level nests: main calls a block, the block
calls a column/row-parallel MLP pair and adds its input back."""
import pytest

from distsim.ir.mesh import Partial, Replicate, Shard
from distsim.text import parse_module
from distsim.transforms.sharding import check_lowering, shard_program

from sharding_helpers import comm_ops

BODY = '''
func @mlp(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %a = gelu(%h) : f32[8,32]
  %y = matmul(%a, %w2) : f32[8,16]
  return %y
}

func @block(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %n = tanh(%x) : f32[8,16]
  %h = call(%n, %w1, %w2) {callee = "mlp"} : f32[8,16]
  %y = add(%x, %h) : f32[8,16]
  return %y
}
'''

TP = 'mesh @m = [2] ("tp")\n' + BODY + '''
func @main(%x: f32[8,16]XTYPE, %w1: f32[16,32]<@m, [S(1)]>, %w2: f32[32,16]<@m, [S(0)]>) -> (f32[8,16]) {
  %y = call(%x, %w1, %w2) {callee = "block"} : f32[8,16]
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)

DP_TP = 'mesh @m = [2, 2] ("dp", "tp")\n' + BODY + '''
func @main(%x: f32[8,16], %w1: f32[16,32]<@m, [R, S(1)]>, %w2: f32[32,16]<@m, [R, S(0)]>, %d: f32[8,16]<@m, [S(0), R]>) -> (f32[8,16]) {
  %y = call(%x, %w1, %w2) {callee = "block"} : f32[8,16]
  %z = add(%y, %d) : f32[8,16]
  return %z
}
'''  # noqa: E501 (a function signature of the text format is one line)


def _shard(text):
    module = parse_module(text)
    sharded, local = shard_program(module)
    assert check_lowering(module, local).ok
    return sharded.functions["main"], local


def _comms(local):
    return [(op.op_type, list(op.attrs["ranks"])) for op in comm_ops(local)]


def test_an_unannotated_input_is_replicated_where_that_is_cheapest():
    # the sweeps made %x P(sum) (the residual add meets the row-parallel result
    # first): a reduce-scatter before tanh, an all-gather before the column-
    # parallel matmul, then the all-reduce of the result
    main, local = _shard(TP.replace("XTYPE", ""))
    assert main.inputs[0].type.placements == (Replicate(),)
    assert _comms(local) == [("comm.allreduce", [0, 1])]


def test_an_annotated_input_keeps_its_placement_whatever_it_costs():
    main, local = _shard(TP.replace("XTYPE", '<@m, [P(sum)]>'))
    assert main.inputs[0].type.placements == (Partial(),)
    assert _comms(local) == [("comm.reducescatter", [0, 1]), ("comm.allgather", [0, 1]),
                             ("comm.allreduce", [0, 1])]


def test_only_the_axes_that_cost_are_replicated():
    # on a 2 x 2 mesh the sweeps gave [S(0), P(sum)]: dp stays sharded, tp replicated
    main, local = _shard(DP_TP)
    assert main.inputs[0].type.placements == (Shard(0), Replicate())
    assert _comms(local) == [("comm.allreduce", [0, 1]), ("comm.allreduce", [2, 3])]


@pytest.mark.parametrize("mesh, placements", [('[2] ("dp")', "[S(0)]"),
                                              ('[2, 2] ("dp", "tp")', "[S(0), S(1)]")])
def test_on_a_tie_the_sweeps_placement_stays(mesh, placements):
    # %b as sharded as %x costs nothing; replicated, it would cost a local slice
    text = f'''mesh @m = {mesh}

func @main(%x: f32[8,16]<@m, {placements}>, %b: f32[8,16]) -> (f32[8,16]) {{
  %y = add(%x, %b) : f32[8,16]
  return %y
}}
'''
    main, local = _shard(text)
    assert main.inputs[1].type == main.inputs[0].type
    assert [op.op_type for op in local.ops] == ["add"] * len(local.devices())
