"""Rewrites on communication ops, and the lower / check commands."""
from pathlib import Path

import numpy as np

from distsim.cli import main
from distsim.interp import NumpyExecutor
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.transforms.sharding import LOCAL_RULES
from distsim.transforms.sharding.rewrites import (dedup_comms, drop_gather_slice,
                                                  fuse_reduce_scatter_all_gather, simplify_comms,
                                                  split_all_reduce)

MODEL = str(Path(__file__).resolve().parents[2] / "models" / "nested_mlp.dir")


def inputs(n=2, shape=(4, 6)):
    b = FunctionBuilder("f")
    xs = [b.input(f"x{r}", TensorType(shape, DType.F32, r)) for r in range(n)]
    return b, xs


def run(f, seed=0):
    rng = np.random.default_rng(seed)
    return NumpyExecutor().run(f,
                               [rng.normal(size=v.type.shape).astype(np.float32) for v in f.inputs])


def test_identical_collectives_are_computed_once():
    b, xs = inputs()
    a = b.op("comm.allreduce", xs, {"ranks": [0, 1]})
    c = b.op("comm.allreduce", xs, {"ranks": [0, 1]})
    d = b.op("comm.allreduce", xs, {"ranks": [0, 1], "reduce_op": "max"})
    f = b.finish([b.op("add", [a[0], c[0]]), d[0]])
    before = run(f)
    dedup_comms(f)
    assert [op.op_type for op in f.ops].count("comm.allreduce") == 2  # max differs from sum
    np.testing.assert_allclose(run(verify(f))[0], before[0])


def test_reduce_scatter_then_all_gather_is_an_all_reduce():
    b, xs = inputs(3, (5, 2))  # uneven pieces too
    rs = b.op("comm.reducescatter", xs, {"ranks": [0, 1, 2], "dim": 0})
    ag = b.op("comm.allgather", list(rs), {"ranks": [0, 1, 2], "dim": 0})
    f = b.finish(list(ag))
    before = run(f)
    fuse_reduce_scatter_all_gather(f)
    assert [op.op_type for op in f.ops] == ["comm.allreduce"]
    for x, y in zip(run(verify(f)), before):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def _all_reduce_then(chain, n=4, shape=(8, 6), also_return=False):
    b, xs = inputs(n, shape)
    ar = b.op("comm.allreduce", xs, {"ranks": list(range(n)), "mesh": "m", "axes": ["a"]})
    outs = []
    for r in range(n):
        v = ar[r]
        for op_type, attrs in chain:
            v = b.op(op_type, [v], attrs)
        outs.append(b.op("add", [v, xs[r]]))
    if also_return:
        outs.append(ar[0])
    return b.finish(outs)


def test_all_reduce_before_an_element_wise_chain_is_split():
    f = _all_reduce_then([("relu", None), ("scale", {"factor": 0.5})])
    before = run(f)
    split_all_reduce(f)
    kinds = [op.op_type for op in f.ops]
    assert kinds == (["comm.reducescatter"] + ["relu"] * 4 + ["scale"] * 4 + ["comm.allgather"]
                     + ["add"] * 4)
    # the chain runs on each rank's piece: 8 rows over 4 ranks
    assert all(op.outputs[0].type.shape == (2, 6) for op in f.ops
               if op.op_type in ("relu", "scale"))
    rs, ag = f.ops[0], f.ops[9]
    assert rs.attrs["dim"] == 0 and rs.attrs["mesh"] == "m" and ag.attrs["axes"] == ("a",)
    # bytes by the table: f32[8,6] = 192 B; (4-1)/4 * 192 = 144 each, 288 as the all-reduce's
    # 2(4-1)/4 * 192
    assert rs.meta["bytes_per_device"] == 144.0 and ag.meta["bytes_per_device"] == 144.0
    for x, y in zip(run(verify(f)), before):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_all_reduce_is_kept_where_splitting_does_not_pay():
    for f in (_all_reduce_then([]),                                  # nothing to run on the piece
              _all_reduce_then([("relu", None)], also_return=True),    # the full value is returned
              _all_reduce_then([("relu", None)], n=4, shape=(3, 2))):  # no dim with a row per rank
        split_all_reduce(f)
        assert [op.op_type for op in f.ops].count("comm.allreduce") == 1
        assert "comm.reducescatter" not in [op.op_type for op in f.ops]


def test_gather_then_own_slice_is_removed():
    b, xs = inputs(2, (3, 4))
    ag = b.op("comm.allgather", xs, {"ranks": [0, 1], "dim": 1})
    ys = [b.op("shard_slice", [ag[i]], {"dim": 1, "index": i, "parts": 2}) for i in range(2)]
    f = b.finish([b.op("relu", [y]) for y in ys])
    before = run(f)
    simplify_comms(f)
    assert [op.op_type for op in f.ops] == ["relu", "relu"]
    for x, y in zip(run(verify(f)), before):
        np.testing.assert_allclose(x, y)
    # a slice of another piece is kept
    b, xs = inputs(2, (3, 4))
    ag = b.op("comm.allgather", xs, {"ranks": [0, 1], "dim": 1})
    ys = [b.op("shard_slice", [ag[i]], {"dim": 1, "index": 1 - i, "parts": 2}) for i in range(2)]
    f = drop_gather_slice(b.finish(ys))
    assert "comm.allgather" in [op.op_type for op in f.ops]


def test_lower_prints_the_local_view(capsys):
    assert main(["lower", MODEL]) == 0
    out = capsys.readouterr().out
    assert "func @main(%x_r0: f32[4,16]@0, %x_r1: f32[4,16]@1" in out and "call" not in out
    assert main(["lower", "--global", MODEL]) == 0
    assert "func @mlp(%x: f32[8,16]<@m, [S(0)]>" in capsys.readouterr().out


def test_check_agrees_and_reports_the_first_difference(capsys, monkeypatch):
    assert main(["check", MODEL]) == 0
    assert "ok" in capsys.readouterr().out

    def wrong_relu(lb, op, c, ins, hints):
        return lb.emit("neg", ins, {}, hints)

    monkeypatch.setitem(LOCAL_RULES, "relu", wrong_relu)
    assert main(["check", MODEL]) == 1
    assert "differ: first at %h" in capsys.readouterr().out


def test_bad_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.dir"
    bad.write_text('mesh @m = [4] ("a")\n\n'
                   'func @main(%x: f32[2]<@m, [S(0)]>) -> (f32[2]<@m, [S(0)]>) {\n'
                   '  return %x\n}\n')
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "%x" in err and "rule" in err
