"""Every per-axis transition of the DESIGN.md table on 1-D, 2-D and 3-D
meshes: lowered, executed, the gathered result equals the input, and the
collective and its bytes per device are the table's."""
from math import prod

import numpy as np
import pytest

from distsim.interp import NumpyExecutor
from distsim.ir import DType, verify
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard
from distsim.text import parse_module
from distsim.transforms.sharding import assemble, distribute, lower, plan_redistribute

from sharding_helpers import comm_ops

SHAPE = (8, 16, 4)
R, P = Replicate(), Partial("sum")
# (from, to, the collective or local op, bytes per device as a fraction of S)
TABLE = [
    (R, Shard(0), "shard_slice", lambda n: 0.0),
    (Shard(0), R, "comm.allgather", lambda n: (n - 1) / n),
    (Shard(0), Shard(1), "comm.alltoall", lambda n: (n - 1) / n ** 2),
    (P, R, "comm.allreduce", lambda n: 2 * (n - 1) / n),
    (P, Shard(1), "comm.reducescatter", lambda n: (n - 1) / n),
]
MESHES = [(4,), (2, 2), (2, 2, 2)]


def redistribute_module(mesh, src, dst):
    t_src = DTensorType(SHAPE, DType.F32, mesh, src)
    t_dst = DTensorType(SHAPE, DType.F32, mesh, dst)
    text = (f"{mesh.print_text()}\n\nfunc @main(%x: {t_src.print_text()}) -> "
            f"({t_dst.print_text()}) {{\n"
            f"  %y = redistribute(%x) : {t_dst.print_text()}\n  return %y\n}}\n")
    return parse_module(text), t_src, t_dst


def run_redistribute(mesh, src, dst, seed=0):
    module, t_src, t_dst = redistribute_module(mesh, src, dst)
    local = verify(lower(module))
    x = np.random.default_rng(seed).uniform(-1, 1, SHAPE).astype(np.float32)
    pieces = distribute(x, t_src)
    outs = NumpyExecutor().run(local, [pieces[c] for c in mesh.all_coords()])
    got = assemble(dict(zip(mesh.all_coords(), outs)), t_dst)
    np.testing.assert_allclose(got, x, rtol=1e-6, atol=1e-6)
    return local


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("row", TABLE, ids=lambda r: f"{r[0].print_text()}->{r[1].print_text()}")
def test_every_transition_on_every_axis(shape, row):
    src_p, dst_p, op_type, fraction = row
    names = tuple("abc"[:len(shape)])
    mesh = DeviceMesh("m", shape, names)
    for axis in range(mesh.ndim):
        # the other axes shard dim 2 (so S, the bytes the axis group sees, is a part of the whole)
        others = [Shard(2) if i != axis else None for i in range(mesh.ndim)]
        src = tuple(src_p if p is None else p for p in others)
        dst = tuple(dst_p if p is None else p for p in others)
        local = run_redistribute(mesh, src, dst)
        n = mesh.shape[axis]
        group_bytes = prod(SHAPE) * 4 / (mesh.size // n)
        ops = [op for op in local.ops if op.op_type == op_type]
        if op_type == "shard_slice":
            assert len(ops) == mesh.size and comm_ops(local) == []
            continue
        assert comm_ops(local) == ops and len(ops) == mesh.size // n  # one per axis group
        for op in ops:
            assert op.attrs["mesh"] == "m" and op.attrs["axes"] == (names[axis],)
            assert tuple(op.attrs["ranks"]) in mesh.groups([axis])
            assert op.meta["bytes_per_device"] == pytest.approx(fraction(n) * group_bytes)
        steps = plan_redistribute(SHAPE, DType.F32, mesh, src, dst)
        assert len(steps) == 1
        assert steps[0].bytes_per_device == pytest.approx(fraction(n) * group_bytes)


def test_nested_sharding_gathers_the_inner_axis_first():
    mesh = DeviceMesh("m", (2, 2), ("a", "b"))
    local = run_redistribute(mesh, (Shard(0), Shard(0)), (R, R))
    gathers = comm_ops(local, "allgather")
    assert [op.attrs["axes"] for op in gathers] == [("b",)] * 2 + [("a",)] * 2


def test_nested_to_outer_only_takes_a_valid_order():
    mesh = DeviceMesh("m", (2, 2), ("a", "b"))
    # [S(0), S(0)] -> [R, S(0)]: the inner shard must go before the outer one can
    steps = plan_redistribute(SHAPE, DType.F32, mesh, (Shard(0), Shard(0)), (R, Shard(0)))
    run_redistribute(mesh, (Shard(0), Shard(0)), (R, Shard(0)))
    assert steps[0].axis == 1


def test_uneven_shards_round_trip():
    mesh = DeviceMesh("m", (3,), ("a",))
    for src, dst in [((R,), (Shard(0),)), ((Shard(0),), (R,)), ((P,), (Shard(2),)),
                     ((Shard(1),), (Shard(0),))]:
        run_redistribute(mesh, src, dst)


def test_partial_target_and_multi_axis_changes():
    mesh = DeviceMesh("m", (2, 2), ("a", "b"))
    run_redistribute(mesh, (R, R), (P, Shard(1)))
    run_redistribute(mesh, (P, P), (Shard(0), Shard(1)))
    run_redistribute(mesh, (Shard(0), Shard(1)), (Shard(1), Shard(0)))
