"""Moves between meshes: the cheapest recipe is emitted, its bytes per
device are the hand-computed ones, and the moved tensor is the input.

f32[8,16] is S = 512 B throughout. Costs (bytes per device): send-recv
its message, the send-recvs of one point-to-point stage the most any rank
sends or receives; gather / scatter (p-1)/p * S; broadcast / reduce S;
same-mesh steps as in the DESIGN.md table."""
import numpy as np
import pytest

from distsim.interp import NumpyExecutor
from distsim.ir import DType, verify
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard
from distsim.text import parse_module, print_module
from distsim.transforms.sharding import assemble, distribute, lower
from distsim.transforms.sharding.cross_mesh import recipe_costs

from sharding_helpers import comm_ops

SHAPE = (8, 16)
R, P = Replicate(), Partial("sum")


def move(a, src_pl, b, dst_pl, seed=1):
    """Lower a redistribute from mesh a to mesh b, run it, check the result
    is the input; returns the local function."""
    t_src = DTensorType(SHAPE, DType.F32, a, src_pl)
    t_dst = DTensorType(SHAPE, DType.F32, b, dst_pl)
    text = (f"{a.print_text()}\n{b.print_text()}\n\nfunc @main(%x: {t_src.print_text()}) -> "
            f"({t_dst.print_text()}) {{\n  %y = redistribute(%x) : {t_dst.print_text()}\n"
            "  return %y\n}\n")
    module = parse_module(text)
    assert print_module(module).count("mesh @") == 2
    local = verify(lower(module))
    x = np.random.default_rng(seed).uniform(-1, 1, SHAPE).astype(np.float32)
    # partial terms: the replicated piece times weights that sum to 1 along each partial axis
    pieces = distribute(x,
                        t_src.with_placements([R if isinstance(p, Partial) else p for p in src_pl]))
    for c in pieces:
        for axis, p in enumerate(src_pl):
            n = a.shape[axis]
            if isinstance(p, Partial):
                pieces[c] = pieces[c] * np.float32((c[axis] + 1) / (n * (n + 1) / 2))
    outs = NumpyExecutor().run(local, [pieces[c] for c in a.all_coords()])
    np.testing.assert_allclose(assemble(dict(zip(b.all_coords(), outs)), t_dst), x, rtol=1e-5,
                               atol=1e-6)
    return local, recipe_costs(t_src, t_dst)


def mesh(name, shape, devices):
    return DeviceMesh(name, shape,
                      tuple("xyz"[:len(shape)]) if name == "a" else tuple("uvw"[:len(shape)]),
                      tuple(devices))


def test_overlapping_meshes_move_only_what_is_missing():
    # (0,1,2,3) S(0) -> (1,2) S(0): rank 1 needs rows 0-3 (it holds 2-3, gets 0-1 from rank 0),
    # rank 2 needs rows 4-7 (holds 4-5, gets 6-7 from rank 3): 2 rows x 16 x 4 B = 128 B each
    local, costs = move(mesh("a", (4,), range(4)), (Shard(0),), mesh("b", (2,), (1, 2)),
                        (Shard(0),))
    assert dict(costs) == {"p2p([S(0)] -> [S(0)])": 128.0,
                           "p2p([R] -> [S(0)])": 3 / 4 * 512,   # all-gather, then nothing moves
                           "root": 3 / 4 * 512 + 1 / 2 * 512}   # gather to 1, scatter over (1, 2)
    comms = comm_ops(local)
    assert sorted(tuple(op.attrs["ranks"]) for op in comms) == [(0, 1), (3, 2)]
    assert all(op.op_type == "comm.sendrecv" and op.meta["bytes_per_device"] == 128.0
               for op in comms)


def test_matching_shards_are_one_send_recv_per_device():
    local, costs = move(mesh("a", (2,), (0, 1)), (Shard(0),), mesh("b", (2,), (2, 3)), (Shard(0),))
    assert costs[0] == ("p2p([S(0)] -> [S(0)])", 256.0)  # each half, 4 x 16 x 4 B
    assert sorted(tuple(op.attrs["ranks"]) for op in comm_ops(local)) == [(0, 2), (1, 3)]


def test_two_senders_spread_over_four_receivers():
    # rank 0 holds rows 0-3, rank 1 rows 4-7; each of 2..5 needs 2 rows (128 B): each sender
    # sends 256 B
    local, costs = move(mesh("a", (2,), (0, 1)), (Shard(0),), mesh("b", (4,), (2, 3, 4, 5)),
                        (Shard(0),))
    assert dict(costs)["p2p([S(0)] -> [S(0)])"] == 256.0
    assert dict(costs)["root"] == 1 / 2 * 512 + 512 + 3 / 4 * 512  # gather, send, scatter: 1152
    assert [op.op_type for op in comm_ops(local)] == ["comm.sendrecv"] * 4
    assert {op.meta["bytes_per_device"] for op in comm_ops(local)} == {128.0}


def test_2d_source_to_replicated_target():
    # 2x2 [S(0), S(1)] -> 4 devices replicated: each receives the 4 blocks of 128 B (512 B),
    # each source block goes to 4 receivers (512 B)
    local, costs = move(mesh("a", (2, 2), range(4)), (Shard(0), Shard(1)),
                        mesh("b", (4,), range(4, 8)), (R,))
    assert dict(costs) == {"p2p([S(0), S(1)] -> [R])": 512.0,
                           # all-gathers on A (1/2 * 256 + 1/2 * 512), then 512
                           "p2p([R, R] -> [R])": 384.0 + 512.0,
                           "root": 384.0 + 512 + 512}                   # + send + broadcast
    assert len(comm_ops(local, "sendrecv")) == 16 and len(comm_ops(local)) == 16


def test_a_shared_rank_broadcasts_without_a_send():
    # one device (rank 0) to 4 replicated devices including rank 0: a broadcast from 0 (512 B)
    # beats 3 sends of 512 B from rank 0 (1536 B)
    local, costs = move(mesh("a", (1,), (0,)), (R,), mesh("b", (4,), range(4)), (R,))
    assert dict(costs) == {"p2p([R] -> [R])": 1536.0, "root": 512.0}
    assert [op.op_type for op in comm_ops(local)] == ["comm.broadcast"]
    assert comm_ops(local)[0].attrs["root"] == 0


def test_partial_source_is_reduce_scattered_first():
    # [P] on (0,1) -> [S(0)] on (2,3): reduce-scatter (1/2 * 512 = 256) then one half each (256)
    local, costs = move(mesh("a", (2,), (0, 1)), (P,), mesh("b", (2,), (2, 3)), (Shard(0),))
    assert dict(costs)["p2p([S(0)] -> [S(0)])"] == 512.0
    assert dict(costs)["p2p([R] -> [S(0)])"] == 2 * 1 / 2 * 512 + 256  # all-reduce first
    assert dict(costs)["root"] == 512 + 512 + 256                         # reduce, send, scatter
    assert [op.op_type for op in comm_ops(local)] == ["comm.reducescatter"] + ["comm.sendrecv"] * 2


@pytest.mark.parametrize("a_shape, a_dev, src, b_shape, b_dev, dst", [
    ((2,), (0, 1), (Shard(0),), (4,), (8, 9, 10, 11), (Shard(1),)),
    ((4,), (0, 1, 2, 3), (Shard(0),), (2, 2), (8, 9, 10, 11), (Shard(1), R)),
    ((2, 2), (0, 1, 2, 3), (Shard(1), P), (3,), (2, 3, 4), (Shard(0),)),
    ((3,), (0, 1, 2), (Shard(1),), (2, 2), (1, 2, 3, 4), (P, Shard(0))),
    ((2, 2), (0, 1, 2, 3), (Shard(0), Shard(0)), (2, 2), (3, 2, 1, 0), (Shard(1), Shard(0))),
])
def test_moves_return_the_input(a_shape, a_dev, src, b_shape, b_dev, dst):
    local, costs = move(mesh("a", a_shape, a_dev), src, mesh("b", b_shape, b_dev), dst)
    assert costs and all("bytes_per_device" in op.meta for op in comm_ops(local))
