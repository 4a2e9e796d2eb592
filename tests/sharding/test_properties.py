"""Property-based: random small programs (element-wise ops, matmuls,
reductions, reshapes, transposes, concat/split, calls) with random
placements on random meshes of up to 3 axes, propagated and lowered, agree
with the unsharded program; random redistributions (uneven shapes too) on
random meshes, and random moves between meshes, return the input."""
import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distsim.errors import VerifyError
from distsim.interp import NumpyExecutor
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.core import Module, Value
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard, check_placements
from distsim.ir.ops_call import make_call
from distsim.transforms.sharding import (annotate_sharding, assemble, check_lowering, distribute,
                                         lower, shard_program)
from distsim.transforms.sharding.planner import plan_redistribute

N = 6
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))

meshes = st.one_of(st.tuples(st.integers(1, 4)),
                   st.tuples(st.integers(1, 2), st.integers(1, 3)),
                   st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 2)))
placement = st.sampled_from([Replicate(), Shard(0), Shard(1)])
OPS = ["relu", "neg", "add_x", "mul_prev", "matmul", "transpose", "reduce_add", "softmax", "scale",
       "reduce_mean", "reshape", "concat_split", "call"]


def _mesh(shape) -> DeviceMesh:
    return DeviceMesh("m", shape, tuple("abc"[:len(shape)]))


def _annotate(draw, value, mesh, choices):
    pl = draw(st.lists(st.sampled_from(choices), min_size=mesh.ndim, max_size=mesh.ndim))
    try:
        annotate_sharding(value, mesh, pl)
    except VerifyError:
        assume(False)


def _callee() -> "Function":  # noqa: F821
    """g(x, w) = relu(x @ w) * x: a private function called from main."""
    b = FunctionBuilder("g")
    x = b.input("x", TensorType((N, N), DType.F64))
    w = b.input("w", TensorType((N, N), DType.F64))
    return b.finish([b.op("mul", [b.op("relu", [b.op("matmul", [x, w], name="h")], name="a"), x],
                          name="y")])


@st.composite
def programs(draw):
    mesh = _mesh(draw(meshes))
    b = FunctionBuilder("main")
    x = b.input("x", TensorType((N, N), DType.F64))
    _annotate(draw, x, mesh, [Replicate(), Shard(0), Shard(1), Partial()])
    callee = _callee()
    cur, prev = x, x
    for k, name in enumerate(draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=5))):
        if name in ("relu", "neg", "softmax"):
            nxt = b.op(name, [cur], {"axis": 1} if name == "softmax" else None)
        elif name == "scale":
            nxt = b.op("scale", [cur], {"factor": 0.5})
        elif name == "add_x":
            nxt = b.op("add", [cur, x])
        elif name == "mul_prev":
            nxt = b.op("mul", [cur, prev])
        elif name == "matmul":
            w = b.input(f"w{k}", TensorType((N, N), DType.F64))
            if draw(st.booleans()):
                _annotate(draw, w, mesh, [Replicate(), Shard(0), Shard(1)])
            nxt = b.op("matmul", [cur, w], {"trans_b": draw(st.booleans())})
        elif name == "transpose":
            nxt = b.op("transpose", [cur], {"perm": [1, 0]})
        elif name == "reduce_mean":
            nxt = b.op("add", [b.op("reduce_mean", [cur], {"axes": [0], "keepdims": True}), cur])
        elif name == "reshape":
            shape = draw(st.sampled_from([[N * N], [3, 12], [2, 3, N], [N, 2, 3], [12, 3]]))
            mid = b.op("neg", [b.op("reshape", [cur], {"shape": shape})])
            nxt = b.op("reshape", [mid], {"shape": [N, N]})
        elif name == "concat_split":
            axis = draw(st.integers(0, 1))
            both = b.op("concat", [cur, x], {"axis": axis})
            first, second = b.op("split", [both], {"axis": axis, "sizes": [N, N]})
            nxt = b.op("sub", [first, second])
        elif name == "call":
            w = b.input(f"w{k}", TensorType((N, N), DType.F64))
            if draw(st.booleans()):
                _annotate(draw, w, mesh, [Replicate(), Shard(0), Shard(1)])
            out = Value(b.names.fresh("c"), TensorType((N, N), DType.F64))
            b.append(make_call(callee, [cur, w], [out]))
            nxt = out
        else:
            nxt = b.op("add", [b.op("reduce_sum", [cur], {"axes": [1], "keepdims": True}), x])
        prev, cur = cur, nxt
    return Module({"main": b.finish([cur]), "g": callee}, {"m": mesh})


@SETTINGS
@given(programs())
def test_random_programs_agree_with_the_unsharded_program(module):
    sharded, local = shard_program(module)
    verify(local)
    result = check_lowering(module, local, rtol=1e-9, atol=1e-9)
    assert result.ok, str(result)


# -- redistributions -------------------------------------------------------------
tensor_shapes = st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple)


def _placements(data, mesh, rank):
    choices = [Replicate(), Partial()] + [Shard(d) for d in range(rank)]
    return tuple(data.draw(st.lists(st.sampled_from(choices), min_size=mesh.ndim,
                                    max_size=mesh.ndim)))


def _accepted(shape, mesh, pl) -> bool:
    try:
        check_placements(shape, mesh, pl, "x")
    except VerifyError:
        return False
    return True


def _run_move(shape, t_src, t_dst):
    meshes = {t_src.mesh.name: t_src.mesh, t_dst.mesh.name: t_dst.mesh}
    b = FunctionBuilder("main")
    x = b.input("x", t_src)
    y = b.op("redistribute", [x])
    y.type = t_dst
    local = verify(lower(Module({"main": b.finish([y])}, meshes)))
    arr = np.random.default_rng(0).normal(size=shape)
    pieces = distribute(arr, t_src)
    outs = NumpyExecutor().run(local, [pieces[c] for c in t_src.mesh.all_coords()])
    np.testing.assert_allclose(assemble(dict(zip(t_dst.mesh.all_coords(), outs)), t_dst), arr,
                               atol=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(meshes, tensor_shapes, st.data())
def test_every_accepted_redistribution_returns_the_input(mesh_shape, shape, data):
    mesh = _mesh(mesh_shape)
    src, dst = _placements(data, mesh, len(shape)), _placements(data, mesh, len(shape))
    assume(_accepted(shape, mesh, src) and _accepted(shape, mesh, dst))
    _run_move(shape, DTensorType(shape, DType.F64, mesh, src),
              DTensorType(shape, DType.F64, mesh, dst))
    steps = plan_redistribute(shape, DType.F64, mesh, src, dst)
    assert len(steps) <= 2 * mesh.ndim + 1


def test_the_audited_3d_redistributions_all_lower():
    """Every valid [R|S|P]^3 pair on mesh [2,3,2] for f64[12,6,5] (the
    audit found 3 of 101 failing), and the nested uneven one on [2,3]."""
    rng = np.random.default_rng(0)
    mesh = _mesh((2, 3, 2))
    shape = (12, 6, 5)
    choices = [Replicate(), Partial(), Shard(0), Shard(1), Shard(2)]
    done = 0
    while done < 40:
        src = tuple(choices[i] for i in rng.integers(0, 5, 3))
        dst = tuple(choices[i] for i in rng.integers(0, 5, 3))
        if _accepted(shape, mesh, src) and _accepted(shape, mesh, dst):
            _run_move(shape, DTensorType(shape, DType.F64, mesh, src),
                      DTensorType(shape, DType.F64, mesh, dst))
            done += 1
    assert not _accepted((5, 4), _mesh((2, 3)), (Shard(0), Shard(0)))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(meshes, meshes, tensor_shapes, st.data())
def test_random_moves_between_meshes_return_the_input(shape_a, shape_b, shape, data):
    size_a, size_b = int(np.prod(shape_a)), int(np.prod(shape_b))
    # ranks of b: a random choice out of 0..11, possibly overlapping a's 0..size_a-1
    devices_b = tuple(data.draw(st.permutations(range(12)))[:size_b])
    a = DeviceMesh("a", shape_a, tuple("xyz"[:len(shape_a)]), tuple(range(size_a)))
    b = DeviceMesh("b", shape_b, tuple("uvw"[:len(shape_b)]), devices_b)
    src, dst = _placements(data, a, len(shape)), _placements(data, b, len(shape))
    assume(_accepted(shape, a, src) and _accepted(shape, b, dst))
    _run_move(shape, DTensorType(shape, DType.F64, a, src), DTensorType(shape, DType.F64, b, dst))


def test_a_plan_does_not_add_collectives_to_save_a_few_bytes():
    # found by the property above: on uneven shards, re-slicing another dim
    # makes later gathers smaller, and a bytes-only search took 8 steps (6
    # collectives) to save 4 bytes of 480 over a 5-step plan; a collective
    # costs its latency too
    mesh = _mesh((2, 2, 2))
    src, dst = [Partial("sum"), Shard(0), Shard(0)], [Shard(0), Replicate(), Partial("sum")]
    steps = plan_redistribute((4, 3, 5), DType.F64, mesh, src, dst)
    assert len(steps) <= 2 * mesh.ndim + 1
    assert sum(s.collective is not None for s in steps) <= 4
    _run_move((4, 3, 5), DTensorType((4, 3, 5), DType.F64, mesh, src),
              DTensorType((4, 3, 5), DType.F64, mesh, dst))
