"""Megatron's MLP derived purely from annotating the two weights."""
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.ir.core import Module
from distsim.ir.mesh import DeviceMesh
from distsim.transforms.sharding import annotate_sharding, shard_program

from sharding_helpers import comm_ops, run_sharded

B, D, H = 8, 16, 64


def global_mlp(mesh):
    b = FunctionBuilder("main")
    x = b.input("x", TensorType((B, D), DType.F32))
    w1 = annotate_sharding(b.input("w1", TensorType((D, H), DType.F32)), mesh,
                           ["R"] * (mesh.ndim - 1) + ["S(1)"])
    w2 = annotate_sharding(b.input("w2", TensorType((H, D), DType.F32)), mesh,
                           ["R"] * (mesh.ndim - 1) + ["S(0)"])
    h = b.op("matmul", [x, w1], name="h")
    a = b.op("gelu", [h], name="a")
    y = b.op("matmul", [a, w2], name="y")
    return Module({"main": b.finish([y])}, {mesh.name: mesh})


def hand_written(n):
    """Column-parallel then row-parallel, one all-reduce: as Megatron writes it."""
    b = FunctionBuilder("main")
    xs = [b.input(f"x_r{r}", TensorType((B, D), DType.F32, r)) for r in range(n)]
    w1 = [b.input(f"w1_r{r}", TensorType((D, H // n), DType.F32, r)) for r in range(n)]
    w2 = [b.input(f"w2_r{r}", TensorType((H // n, D), DType.F32, r)) for r in range(n)]
    hs = [b.op("matmul", [xs[r], w1[r]]) for r in range(n)]
    acts = [b.op("gelu", [hs[r]]) for r in range(n)]
    ys = [b.op("matmul", [acts[r], w2[r]]) for r in range(n)]
    out = b.op("comm.allreduce", ys, {"ranks": list(range(n)), "reduce_op": "sum",
                                      "mesh": "tp", "axes": ["tp"]})
    return b.finish(list(out))


def test_megatron_mlp_has_one_all_reduce_and_is_the_hand_written_program():
    for n in (2, 4):
        mesh = DeviceMesh("tp", (n,), ("tp",))
        sharded, local = run_sharded(global_mlp(mesh))
        assert [op.op_type for op in comm_ops(local)] == ["comm.allreduce"]
        assert local.structural_key() == hand_written(n).structural_key()


def test_megatron_inside_data_parallel_2x2():
    mesh = DeviceMesh("m", (2, 2), ("dp", "tp"))
    module = global_mlp(mesh)
    annotate_sharding(module.main.inputs[0], mesh, ["S(0)", "R"])
    sharded, local = run_sharded(module)
    reduces = comm_ops(local)
    assert [op.op_type for op in reduces] == ["comm.allreduce"] * 2  # one per dp replica
    assert all(op.attrs["axes"] == ("tp",) for op in reduces)
    assert sorted(tuple(op.attrs["ranks"]) for op in reduces) == [(0, 1), (2, 3)]


def test_conflicting_annotations_insert_a_redistribute_instead_of_failing():
    mesh = DeviceMesh("tp", (2,), ("tp",))
    module = global_mlp(mesh)
    # the hidden activation is wanted replicated: a gather is inserted after the column matmul
    h = module.main.ops[0].outputs[0]
    annotate_sharding(h, mesh, ["R"])
    sharded, local = shard_program(module)
    assert "redistribute" in [op.op_type for op in sharded.main.ops]
    run_sharded(module)
