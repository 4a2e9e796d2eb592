"""A lowered sharded program runs in the simulator: it finishes, and its
collectives appear in the trace on the ranks of their teams."""
from pathlib import Path

from distsim.sim.simulator import simulate_function
from distsim.text import parse_module
from distsim.topology import load_topology
from distsim.transforms.sharding import shard_program

from sharding_helpers import comm_ops

MODEL = Path(__file__).resolve().parents[2] / "models" / "nested_mlp.dir"


def test_nested_mlp_on_a_2x2_mesh_runs_in_the_simulator():
    text = MODEL.read_text().replace('mesh @m = [2] ("dp")', 'mesh @m = [2, 2] ("dp", "tp")') \
        .replace("<@m, [S(0)]>", "<@m, [S(0), R]>") \
        .replace("%w1: f32[16,32],", "%w1: f32[16,32]<@m, [R, S(1)]>,") \
        .replace("%w2: f32[32,16],", "%w2: f32[32,16]<@m, [R, S(0)]>,")
    _, local = shard_program(parse_module(text))
    comms = comm_ops(local)
    assert comms  # Megatron inside data parallel: all-reduces over 'tp'
    trace = simulate_function(local, load_topology("dgx-a100"))
    assert trace.step_time_s > 0
    records = [r for r in trace.ops if r.category == "communication"]
    # every collective ran on every rank of its team
    want = sorted((rank, op.op_type) for op in comms for rank in op.attrs["ranks"])
    got = sorted((r.rank, r.op_type) for r in records)
    assert got == want
    assert {r.rank for r in trace.ops} == {0, 1, 2, 3}
    assert all(r.end_s <= trace.step_time_s + 1e-12 for r in trace.ops)


def test_a_move_between_overlapping_meshes_runs_in_the_simulator():
    text = '''mesh @a = [4] ("x")
mesh @b = [2] ("y") devices [1, 2]

func @main(%x: f32[64,16]<@a, [S(0)]>) -> (f32[64,16]<@b, [S(0)]>) {
  %y = redistribute(%x) : f32[64,16]<@b, [S(0)]>
  %z = relu(%y) : f32[64,16]<@b, [S(0)]>
  return %z
}
'''
    _, local = shard_program(parse_module(text))
    trace = simulate_function(local, load_topology("dgx-a100"))
    sends = [r for r in trace.ops if r.op_type == "comm.sendrecv"]
    # rows 0-15 move 0 -> 1 and rows 48-63 move 3 -> 2 (16 x 16 x 4 B = 1 KiB each); 1 and 2
    # keep theirs
    assert sorted((r.rank, r.name) for r in sends) == [(0, "y_part_r1"), (1, "y_part_r1"),
                                                        (2, "y_part_r2"), (3, "y_part_r2")]
    moved = [op.inputs[0].type.shape for op in local.ops if op.op_type == "comm.sendrecv"]
    assert moved == [(16, 16)] * 2
    assert trace.step_time_s > 0
    assert {r.rank for r in trace.ops if r.op_type == "relu"} == {1, 2}
