"""Blocked shards: a fused weight split block by block (Megatron's layout
of fused query/key/value and gate/up projections), checked device by
device in the reference executor against the one-device program."""
import numpy as np
import pytest

from distsim.errors import PassPreconditionError, VerifyError
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.ir.core import Module
from distsim.ir.mesh import BlockShard, DeviceMesh, DTensorType, Replicate, parse_placement
from distsim.transforms.sharding import annotate_sharding, assemble, distribute
from distsim.transforms.sharding.planner import plan_redistribute

from sharding_helpers import comm_ops, run_sharded

B, D = 4, 6
BLOCKS = (8, 4, 4)          # query, key, value


def fused_projection(n: int, weight_placement: str):
    """``x @ w + b`` split into three blocks, each through its own
    row-parallel layer, summed: an attention block's projections in
    miniature."""
    mesh = DeviceMesh("tp", (n,), ("tp",))
    b = FunctionBuilder("main")
    x = b.input("x", TensorType((B, D), DType.F32))
    w = annotate_sharding(b.input("w", TensorType((D, sum(BLOCKS)), DType.F32)), mesh,
                          [weight_placement])
    bias = b.input("b", TensorType((sum(BLOCKS),), DType.F32))
    outs = [annotate_sharding(b.input(f"o{i}", TensorType((size, D), DType.F32)), mesh,
                              ["S(0)"]) for i, size in enumerate(BLOCKS)]
    y = b.op("add", [b.op("matmul", [x, w], name="y"), bias], name="yb")
    parts = b.op("split", [y], {"axis": 1, "sizes": list(BLOCKS)}, name=["q", "k", "v"])
    total = None
    for i, (part, o) in enumerate(zip(parts, outs)):
        z = b.op("matmul", [b.op("gelu", [part], name=f"a{i}"), o], name=f"z{i}")
        total = z if total is None else b.op("add", [total, z], name=f"s{i}")
    return Module({"main": b.finish([total])}, {mesh.name: mesh})


@pytest.mark.parametrize("n", [2, 4])
def test_a_fused_weight_split_block_by_block_keeps_the_split_local(n):
    sharded, local = run_sharded(fused_projection(n, f"S(1|{','.join(map(str, BLOCKS))})"))
    # the blocks' parts are split on every device; only the final sum talks
    assert [op.op_type for op in comm_ops(local)] == ["comm.allreduce"]
    splits = [op for op in local.ops if op.op_type == "split"]
    assert len(splits) == n and all(list(op.attrs["sizes"]) == [b // n for b in BLOCKS]
                                    for op in splits)
    placed = {v.name: v.type.placements[0] for v in sharded.main.inputs}
    assert placed["b"] == BlockShard(0, BLOCKS)      # the bias follows its layer's blocks


def test_a_contiguous_split_of_the_same_weight_needs_gathers():
    """The same weight split as one block: the split of the product cannot
    stay local (what blocked shards remove)."""
    _, local = run_sharded(fused_projection(2, "S(1)"))
    assert len(comm_ops(local)) > 1


def test_blocked_pieces_round_trip_and_hold_every_blocks_part():
    mesh = DeviceMesh("tp", (2,), ("tp",))
    t = DTensorType((2, 16), DType.F64, mesh, [BlockShard(1, BLOCKS)])
    whole = np.arange(32.0).reshape(2, 16)
    pieces = distribute(whole, t)
    # device 1: columns 4-7 of the query block, 10-11 of the key, 14-15 of the value
    np.testing.assert_array_equal(pieces[(1,)], whole[:, [4, 5, 6, 7, 10, 11, 14, 15]])
    np.testing.assert_array_equal(assemble(pieces, t), whole)


def test_blocked_shards_are_checked_and_never_redistributed():
    mesh = DeviceMesh("tp", (4,), ("tp",))
    assert parse_placement("S(1|8,4,4)") == BlockShard(1, (8, 4, 4))
    with pytest.raises(VerifyError, match=r"S\(1\|8,6,2\).*does not fit dim 1"):
        annotate_sharding(FunctionBuilder("f").input("w", TensorType((6, 16), DType.F32)), mesh,
                          ["S(1|8,6,2)"])
    with pytest.raises(PassPreconditionError, match=r"blocked shard \(S\(1\|8,4,4\)\)"):
        plan_redistribute((6, 16), DType.F32, mesh, [BlockShard(1, BLOCKS)], [Replicate()])
