"""Communication ops: shape rules of every collective and structural
equality over every attribute."""
import pytest

from distsim.errors import VerifyError
from distsim.ir import CollectiveType, DType, FunctionBuilder, Op, TensorType, Value

F32 = DType.F32


def inputs(b, shape, ranks):
    return [b.input(f"x{r}", TensorType(shape, F32, r)) for r in ranks]


@pytest.mark.parametrize("kind,attrs,in_shape,n_in,out_shapes", [
    ("allreduce", {}, (4, 6), 3, [(4, 6)] * 3),
    ("allgather", {"dim": 1}, (4, 6), 3, [(4, 18)] * 3),
    ("reducescatter", {"dim": 0}, (6, 2), 3, [(2, 2)] * 3),
    ("reducescatter", {"dim": 0}, (7, 2), 3, [(3, 2), (2, 2), (2, 2)]),
    ("alltoall", {"split_dim": 0, "concat_dim": 1}, (6, 2), 3, [(2, 6)] * 3),
    ("broadcast", {"root": 1}, (5,), 1, [(5,)] * 3),
    ("reduce", {"root": 2}, (5,), 3, [(5,)]),
    ("gather", {"root": 0, "dim": 0}, (2, 5), 3, [(6, 5)]),
    ("scatter", {"root": 0, "dim": 0}, (6, 5), 1, [(2, 5)] * 3),
])
def test_collective_shapes(kind, attrs, in_shape, n_in, out_shapes):
    ranks = (0, 1, 2)
    b = FunctionBuilder("f")
    root = attrs.get("root")
    in_ranks = (root,) if kind in ("broadcast", "scatter") else ranks
    xs = inputs(b, in_shape, in_ranks[:n_in])
    outs = b.op(f"comm.{kind}", xs, {"ranks": ranks, **attrs})
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert [o.type.shape for o in outs] == out_shapes


def test_sendrecv_moves_value():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((3,), F32, 0))
    y = b.op("comm.sendrecv", [x], {"ranks": (0, 5)})
    assert y.type == TensorType((3,), F32, 5)


def test_root_outside_team_rejected():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((3,), F32, 4))
    with pytest.raises(VerifyError, match="root 4 is not in team"):
        b.op("comm.broadcast", [x], {"ranks": (0, 1), "root": 4})


def test_structural_equality_covers_every_attribute():
    x0, x1 = Value("a", TensorType((4, 4), F32, 0)), Value("b", TensorType((4, 4), F32, 1))

    def gather(dim):
        shape = (8, 4) if dim == 0 else (4, 8)
        outs = [Value(f"o{i}", TensorType(shape, F32, i)) for i in range(2)]
        return Op("comm.allgather", [x0, x1], outs, {"ranks": (0, 1), "dim": dim})

    assert gather(0).structurally_equal(gather(0))
    assert not gather(0).structurally_equal(gather(1))
    assert hash(gather(0).structural_key()) == hash(gather(0).structural_key())
    def ar(op):
        return Op("comm.allreduce", [x0, x1], [x0, x1], {"ranks": (0, 1), "reduce_op": op})
    assert not ar("sum").structurally_equal(ar("max"))
    assert CollectiveType.from_op_type("comm.alltoall") is CollectiveType.ALL_TO_ALL
    assert len(CollectiveType) == 9
