"""Property-based: random small programs with random placements on random
meshes, propagated and lowered, agree with the unsharded program; random
redistributions return the input."""
import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distsim.interp import NumpyExecutor
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.core import Module
from distsim.errors import VerifyError
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard, check_placements
from distsim.transforms.sharding import (annotate_sharding, assemble, check_lowering, distribute,
                                         lower, shard_program)
from distsim.transforms.sharding.planner import plan_redistribute

N = 6
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))

meshes = st.one_of(st.tuples(st.integers(1, 4)), st.tuples(st.integers(1, 2), st.integers(1, 3)))
placement = st.sampled_from([Replicate(), Shard(0), Shard(1)])
OPS = ["relu", "neg", "add_x", "mul_prev", "matmul", "transpose", "reduce_add", "softmax", "scale",
       "reduce_mean"]


@st.composite
def programs(draw):
    shape = draw(meshes)
    mesh = DeviceMesh("m", shape, tuple("ab"[:len(shape)]))
    b = FunctionBuilder("main")
    x = b.input("x", TensorType((N, N), DType.F64))
    x_pl = draw(st.lists(st.sampled_from([Replicate(), Shard(0), Shard(1), Partial()]),
                         min_size=len(shape), max_size=len(shape)))
    annotate_sharding(x, mesh, x_pl)
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
                annotate_sharding(w, mesh, draw(st.lists(placement, min_size=len(shape),
                                                         max_size=len(shape))))
            nxt = b.op("matmul", [cur, w], {"trans_b": draw(st.booleans())})
        elif name == "transpose":
            nxt = b.op("transpose", [cur], {"perm": [1, 0]})
        elif name == "reduce_mean":
            nxt = b.op("add", [b.op("reduce_mean", [cur], {"axes": [0], "keepdims": True}), cur])
        else:
            nxt = b.op("add", [b.op("reduce_sum", [cur], {"axes": [1], "keepdims": True}), x])
        prev, cur = cur, nxt
    return Module({"main": b.finish([cur])}, {"m": mesh})


@SETTINGS
@given(programs())
def test_random_programs_agree_with_the_unsharded_program(module):
    sharded, local = shard_program(module)
    verify(local)
    result = check_lowering(module, local, rtol=1e-9, atol=1e-9)
    assert result.ok, str(result)


@SETTINGS
@given(meshes, st.data())
def test_random_redistributions_return_the_input(shape, data):
    mesh = DeviceMesh("m", shape, tuple("ab"[:len(shape)]))
    any_pl = st.sampled_from([Replicate(), Shard(0), Shard(1), Partial()])
    src = tuple(data.draw(st.lists(any_pl, min_size=len(shape), max_size=len(shape))))
    dst = tuple(data.draw(st.lists(any_pl, min_size=len(shape), max_size=len(shape))))
    for pl in (src, dst):
        try:
            check_placements((N, 4), mesh, pl, "x")
        except VerifyError:
            assume(False)
    t_src = DTensorType((N, 4), DType.F64, mesh, src)
    t_dst = DTensorType((N, 4), DType.F64, mesh, dst)
    b = FunctionBuilder("main")
    x = b.input("x", t_src)
    y = b.op("redistribute", [x])
    y.type = t_dst
    local = verify(lower(Module({"main": b.finish([y])}, {"m": mesh})))
    arr = np.random.default_rng(0).normal(size=(N, 4))
    pieces = distribute(arr, t_src)
    outs = NumpyExecutor().run(local, [pieces[c] for c in mesh.all_coords()])
    np.testing.assert_allclose(assemble(dict(zip(mesh.all_coords(), outs)), t_dst), arr, atol=1e-12)
    steps = plan_redistribute((N, 4), DType.F64, mesh, src, dst)
    assert len(steps) <= 2 * len(shape) + 1
