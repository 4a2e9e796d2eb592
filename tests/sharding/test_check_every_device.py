"""``distsim check`` compares every device's piece of every value -- each
replica, not the first only -- and feeds a partial input as random terms on
every device, not as the value on one device and zeros on the others."""
import numpy as np
import pytest

from distsim.cli import main
from distsim.interp import random_inputs
from distsim.ir import Op, verify
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard
from distsim.ir.types import DType
from distsim.text import parse_module
from distsim.transforms.sharding import (LOCAL_RULES, assemble, check_lowering, distribute,
                                        shard_program)

TANH = '''mesh @m = [2, 4] ("dp", "tp")

func @main(%x: f32[8,16]<@m, [S(0), R]>) -> (f32[8,16]<@m, [S(0), R]>) {
  %y = tanh(%x) : f32[8,16]<@m, [S(0), R]>
  return %y
}
'''


def _sigmoid_on_rank_5(lb, op, c, ins, hints):
    rank = op.outputs[0].type.mesh.rank_at(c)
    return lb.emit("sigmoid" if rank == 5 else op.op_type, ins, op.attrs, hints)


def test_a_wrong_replica_on_rank_5_is_reported(tmp_path, capsys, monkeypatch):
    # rank 5 = coords (1, 1): rows 4-7, replicated over "tp" with ranks 4, 6, 7
    path = tmp_path / "tanh.dir"
    path.write_text(TANH)
    monkeypatch.setitem(LOCAL_RULES, "tanh", _sigmoid_on_rank_5)
    x = random_inputs(parse_module(TANH).main, seed=0)[0][4:]
    err = np.max(np.abs(1 / (1 + np.exp(-x)) - np.tanh(x)))
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().out == (f"{path}: differ: first at %y on rank 5 "
                                       f"(max abs error {err:.3g}, 2 values compared)\n")


PARTIAL = '''mesh @m = [4] ("a")

func @main(%x: f32[8,16]<@m, [P(sum)]>) -> (f32[8,16]<@m, [R]>) {
  %y = redistribute(%x) : f32[8,16]<@m, [R]>
  return %y
}
'''


def test_a_lowering_that_reads_one_partial_term_is_reported():
    module = parse_module(PARTIAL)
    _, local = shard_program(module)
    assert check_lowering(module, local).ok
    # a wrong lowering: rank 0's term broadcast instead of the terms summed
    (ar,) = local.ops
    assert ar.op_type == "comm.allreduce"
    local.ops[0] = Op("comm.broadcast", ar.inputs[:1], ar.outputs,
                      {"ranks": [0, 1, 2, 3], "root": 0})
    verify(local)
    result = check_lowering(module, local)
    assert not result.ok and (result.first_difference, result.rank) == ("y", 0)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.I32])
def test_partial_terms_are_random_on_every_device_and_reduce_to_the_value(op, dtype):
    mesh = DeviceMesh("m", (2, 3), ("a", "b"))
    rng = np.random.default_rng(0)
    value = (rng.uniform(-1, 1, (6, 4)) * (1 if dtype is DType.F32 else 8)).astype(dtype.numpy_name)
    for placements in ([Partial(op), Shard(0)], [Shard(1), Partial(op)]):
        t = DTensorType(value.shape, dtype, mesh, placements)
        pieces = distribute(value, t, np.random.default_rng(1))
        np.testing.assert_allclose(assemble(pieces, t), value, rtol=1e-5, atol=1e-6)
        fixed = distribute(value, t)   # the value on one device, the identity elsewhere
        if dtype is DType.I32 and op == "prod":
            continue                   # (integer factors: kept as without a generator)
        partial_axis = placements.index(Partial(op))
        for c, piece in pieces.items():
            if c[partial_axis] != 0:
                assert not np.array_equal(piece, fixed[c]), (c, op)
        if op in ("max", "min"):   # every term on the far side of the value
            sign = 1 if op == "max" else -1
            whole = distribute(value, t.with_placements(
                [Replicate() if isinstance(p, Partial) else p for p in placements]))
            for c, piece in pieces.items():
                assert (sign * (whole[c].astype(np.int64 if dtype is DType.I32 else np.float64)
                                - piece) >= 0).all()


@pytest.mark.parametrize("seed", range(4))
def test_correct_lowerings_of_partial_inputs_pass(seed):
    text = '''mesh @m = [2, 2] ("a", "b")

func @main(%x: f32[8,16]<@m, [P(sum), S(0)]>, %m: f32[8,16]<@m, [P(max), R]>, %v: f32[8,16]<@m, [R, P(avg)]>) -> (f32[8,16]) {
  %s = add(%x, %m) : f32[8,16]
  %y = mul(%s, %v) : f32[8,16]
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)
    module = parse_module(text)
    _, local = shard_program(module)
    result = check_lowering(module, local, seed=seed)
    assert result.ok, str(result)


F16 = '''mesh @m = [2] ("k")

func @main(%x: f16[8,64]<@m, [S(1)]>, %w: f16[64,16]<@m, [S(0)]>) -> (f16[8,16]) {
  %y = matmul(%x, %w) : f16[8,16]
  return %y
}
'''


def test_half_precision_is_compared_at_its_own_precision(monkeypatch):
    # the two halves of the contraction round before they are summed: an
    # error of one unit at the values' scale (0.004 at 4), over a tolerance of 1e-4
    module = parse_module(F16)
    _, local = shard_program(module)
    assert check_lowering(module, local).ok

    def wrong(lb, op, c, ins, hints):   # the contraction with one input negated
        return lb.emit(op.op_type, [lb.emit("neg", ins[:1], {}, [hints[0] + "_neg"])[0], ins[1]],
                       op.attrs, hints)

    monkeypatch.setitem(LOCAL_RULES, "matmul", wrong)
    _, local = shard_program(module)
    assert not check_lowering(module, local).ok
