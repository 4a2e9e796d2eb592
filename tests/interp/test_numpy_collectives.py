"""Every collective executed by NumpyExecutor: exact numpy semantics."""
import numpy as np
import pytest

from distsim.interp import execute
from distsim.ir import DType, FunctionBuilder, TensorType, verify

RANKS = (0, 1, 2)


def run(kind, attrs, arrays, in_ranks=RANKS):
    b = FunctionBuilder("f")
    xs = [b.input(f"x{r}", TensorType(a.shape, DType.F64, r)) for r, a in zip(in_ranks, arrays)]
    outs = b.op(f"comm.{kind}", xs, {"ranks": RANKS, **attrs})
    f = verify(b.finish(list(outs) if isinstance(outs, tuple) else [outs]))
    return execute(f, arrays)


@pytest.fixture
def xs():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(6, 4)) for _ in RANKS]


@pytest.mark.parametrize("op,fn", [("sum", np.sum), ("max", np.max), ("min", np.min),
                                   ("avg", np.mean), ("prod", np.prod)])
def test_allreduce(xs, op, fn):
    for out in run("allreduce", {"reduce_op": op}, xs):
        np.testing.assert_allclose(out, fn(np.stack(xs), axis=0))


def test_allgather_reducescatter_alltoall(xs):
    for out in run("allgather", {"dim": 1}, xs):
        np.testing.assert_array_equal(out, np.concatenate(xs, axis=1))
    total = sum(xs)
    for r, out in enumerate(run("reducescatter", {"dim": 0}, xs)):
        np.testing.assert_allclose(out, total[2 * r:2 * r + 2])
    outs = run("alltoall", {"split_dim": 0, "concat_dim": 0}, xs)
    for dst, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.concatenate([x[2 * dst:2 * dst + 2] for x in xs]))


def test_rooted_collectives(xs):
    for out in run("broadcast", {"root": 1}, [xs[1]], in_ranks=(1,)):
        np.testing.assert_array_equal(out, xs[1])
    (red,) = run("reduce", {"root": 2}, xs)
    np.testing.assert_allclose(red, sum(xs))
    (gat,) = run("gather", {"root": 0, "dim": 0}, xs)
    np.testing.assert_array_equal(gat, np.concatenate(xs))
    parts = run("scatter", {"root": 0, "dim": 0}, [xs[0]], in_ranks=(0,))
    np.testing.assert_array_equal(np.concatenate(parts), xs[0])


def test_uneven_reduce_scatter_follows_array_split():
    arrays = [np.arange(7.0) + r for r in RANKS]
    outs = run("reducescatter", {"dim": 0}, arrays)
    assert [o.shape[0] for o in outs] == [3, 2, 2]
    np.testing.assert_allclose(np.concatenate(outs), sum(arrays))
