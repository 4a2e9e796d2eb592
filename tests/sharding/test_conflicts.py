"""A conflict is resolved at the cheapest point of the producer chain, by
the planner's bytes per device."""
from distsim.ir.mesh import Replicate, Shard

from sharding_helpers import comm_ops, run_sharded

BROADCAST = '''mesh @m = [4] ("a")

func @main(%x: f32[8]<@m, [S(0)]>, %w: f32[1024,8]<@m, [S(0)]>) -> (f32[1024,8]RESULT) {
  %b = broadcast_to(%x) {shape = [1024, 8]} : f32[1024,8]
  %y = add(%b, %w) : f32[1024,8]
  return %yEXTRA
}
'''


def _ops(sharded):
    return {op.outputs[0].name: op for op in sharded.functions["main"].ops}


def test_gathering_the_small_input_before_the_broadcast():
    sharded, local = run_sharded(BROADCAST.replace("RESULT", "").replace("EXTRA", ""))
    ops = _ops(sharded)
    # x is gathered (R), the broadcast makes each device's S(0) piece, the add runs on S(0)
    assert ops["x_rd"].op_type == "redistribute"
    assert ops["x_rd"].outputs[0].type.placements == (Replicate(),)
    assert ops["b"].outputs[0].type.placements == (Shard(0),)
    assert ops["y"].inputs[0] is ops["b"].outputs[0]
    comms = comm_ops(local)
    assert [op.op_type for op in comms] == ["comm.allgather"]
    # by hand: x is 8 x 4 B = 32 B; an all-gather over 4 devices sends (4-1)/4 * 32 = 24 B per
    # device
    # (the all-to-all of b at the add would be (4-1)/4^2 * 1024*8*4 = 6144 B per device)
    assert comms[0].meta["bytes_per_device"] == 24.0


def test_a_producer_read_elsewhere_is_not_re_placed():
    # b is also returned, so its placement stays; the conflict is resolved at the add
    text = BROADCAST.replace("(f32[1024,8]RESULT)", "(f32[1024,8], f32[1024,8])")
    text = text.replace("EXTRA", ", %b")
    sharded, local = run_sharded(text)
    ops = _ops(sharded)
    assert ops["b"].outputs[0].type.placements == (Shard(1),)
    assert ops["b"].inputs[0].name == "x"
    kinds = [op.op_type for op in comm_ops(local)]
    assert "comm.alltoall" in kinds
    alltoall = next(op for op in comm_ops(local) if op.op_type == "comm.alltoall")
    assert alltoall.meta["bytes_per_device"] == 3 / 16 * 1024 * 8 * 4  # 6144 B


def test_two_producers_back():
    # x -> neg -> broadcast_to -> add: the change is still made on the 8-element tensor
    text = '''mesh @m = [4] ("a")

func @main(%x: f32[8]<@m, [S(0)]>, %w: f32[1024,8]<@m, [S(0)]>) -> (f32[1024,8]) {
  %n = neg(%x) : f32[8]
  %b = broadcast_to(%n) {shape = [1024, 8]} : f32[1024,8]
  %y = add(%b, %w) : f32[1024,8]
  return %y
}
'''
    _, local = run_sharded(text)
    comms = comm_ops(local)
    assert [op.op_type for op in comms] == ["comm.allgather"]
    assert comms[0].inputs[0].type.shape == (2,) and comms[0].meta["bytes_per_device"] == 24.0
