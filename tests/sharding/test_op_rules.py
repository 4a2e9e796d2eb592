"""Sharding rules of the convolution-network ops and the backward ops: for
each, the placements propagation gives the op's results from a few
annotated inputs, and the lowered program equals the unsharded one."""
import numpy as np
import pytest

from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.core import Module
from distsim.ir.mesh import DeviceMesh, Partial, Replicate, Shard
from distsim.transforms.sharding import annotate_sharding, check_lowering, shard_program

F32, I64 = DType.F32, DType.I64
R, P = Replicate(), Partial("sum")
MESH1 = DeviceMesh("m", (2,), ("a",))
MESH2 = DeviceMesh("m", (2, 2), ("a", "b"))
CONV = {"strides": [1, 1], "pads": [1, 1, 1, 1]}
POOL = {"kernel": [2, 2], "strides": [2, 2]}


def _program(mesh, inputs, body):
    """inputs: (name, shape, dtype, placements or None); body(b, values) ->
    the op's result(s), named 'y' (or y.0, y.1, ...)."""
    b = FunctionBuilder("main")
    vals = {}
    for name, shape, dtype, pl in inputs:
        vals[name] = b.input(name, TensorType(shape, dtype))
        if pl is not None:
            annotate_sharding(vals[name], mesh, pl)
    out = body(b, vals)
    outs = list(out) if isinstance(out, tuple) else [out]
    return Module({"main": b.finish(outs)}, {mesh.name: mesh})


def _x(shape, pl=None, name="x", dtype=F32):
    return (name, shape, dtype, pl)


NCHW = (4, 4, 6, 6)
CASES = {
    # id: (mesh, inputs, body, expected placements of the op's results)
    "conv/batch": (MESH1, [_x(NCHW, [Shard(0)]), _x((6, 4, 3, 3), None, "w")],
                   lambda b, v: b.op("conv", [v["x"], v["w"]], CONV, name="y"), [[Shard(0)]]),
    "conv/out-channels": (MESH1, [_x(NCHW), _x((6, 4, 3, 3), [Shard(0)], "w")],
                          lambda b, v: b.op("conv", [v["x"], v["w"]], CONV, name="y"),
                          [[Shard(1)]]),
    "conv/in-channels": (MESH1, [_x(NCHW, [Shard(1)]), _x((6, 4, 3, 3), [Shard(1)], "w")],
                         lambda b, v: b.op("conv", [v["x"], v["w"]], CONV, name="y"), [[P]]),
    "conv/2-D batch x out-channels": (
        MESH2, [_x(NCHW, [Shard(0), R]), _x((6, 4, 3, 3), [R, Shard(0)], "w")],
        lambda b, v: b.op("conv", [v["x"], v["w"]], CONV, name="y"), [[Shard(0), Shard(1)]]),
    "conv_grad_input/batch": (
        MESH1,
        [_x((4, 6, 6, 6), [Shard(0)], "dy"), _x((6, 4, 3, 3), None, "w"), _x(NCHW, None, "like")],
        lambda b, v: b.op("conv_grad_input", [v["dy"], v["w"], v["like"]], CONV, name="y"),
        [[Shard(0)]]),
    "conv_grad_input/out-channels": (
        MESH1,
        [_x((4, 6, 6, 6), [Shard(1)], "dy"), _x((6, 4, 3, 3), [Shard(0)], "w"),
         _x(NCHW, None, "like")],
        lambda b, v: b.op("conv_grad_input", [v["dy"], v["w"], v["like"]], CONV, name="y"), [[P]]),
    "conv_grad_weight/batch": (
        MESH1,
        [_x((4, 6, 6, 6), [Shard(0)], "dy"), _x(NCHW, [Shard(0)]), _x((6, 4, 3, 3), None, "like")],
        lambda b, v: b.op("conv_grad_weight", [v["dy"], v["x"], v["like"]], CONV, name="y"), [[P]]),
    "conv_grad_weight/out-channels": (
        MESH1, [_x((4, 6, 6, 6), [Shard(1)], "dy"), _x(NCHW), _x((6, 4, 3, 3), None, "like")],
        lambda b, v: b.op("conv_grad_weight", [v["dy"], v["x"], v["like"]], CONV, name="y"),
        [[Shard(0)]]),
    "maxpool/channels": (MESH1, [_x(NCHW, [Shard(1)])],
                         lambda b, v: b.op("maxpool", [v["x"]], POOL, name="y"), [[Shard(1)]]),
    "averagepool/batch": (MESH1, [_x(NCHW, [Shard(0)])],
                          lambda b, v: b.op("averagepool", [v["x"]], POOL, name="y"), [[Shard(0)]]),
    "averagepool/partial": (MESH1, [_x(NCHW, [P])],
                            lambda b, v: b.op("averagepool", [v["x"]], POOL, name="y"), [[P]]),
    "maxpool_grad/batch": (
        MESH1, [_x((4, 4, 3, 3), [Shard(0)], "dy"), _x(NCHW)],
        lambda b, v: b.op("maxpool_grad", [v["dy"], v["x"]], POOL, name="y"), [[Shard(0)]]),
    "averagepool_grad/channels": (
        MESH1, [_x((4, 4, 3, 3), [Shard(1)], "dy"), _x(NCHW)],
        lambda b, v: b.op("averagepool_grad", [v["dy"], v["x"]], POOL, name="y"), [[Shard(1)]]),
    "lrn/batch": (MESH1, [_x(NCHW, [Shard(0)])],
                  lambda b, v: b.op("lrn", [v["x"]], {"size": 3}, name="y"), [[Shard(0)]]),
    "lrn_grad/batch": (MESH1, [_x(NCHW, [Shard(0)], "dy"), _x(NCHW)],
                       lambda b, v: b.op("lrn_grad", [v["dy"], v["x"]], {"size": 3}, name="y"),
                       [[Shard(0)]]),
    "batchnorm/batch": (
        MESH1, [_x(NCHW, [Shard(0)])] + [_x((4,), None, n) for n in ("s", "bias", "mean", "var")],
        lambda b, v: b.op("batchnorm", [v[n] for n in ("x", "s", "bias", "mean", "var")], name="y"),
        [[Shard(0)]]),
    "batchnorm/channels": (
        MESH1, [_x(NCHW, [Shard(1)])] + [_x((4,), None, n) for n in ("s", "bias", "mean", "var")],
        lambda b, v: b.op("batchnorm", [v[n] for n in ("x", "s", "bias", "mean", "var")], name="y"),
        [[Shard(1)]]),
    "batchnorm_grad/batch": (
        MESH1,
        [_x(NCHW, [Shard(0)], "dy"), _x(NCHW)] + [_x((4,), None, n) for n in ("s", "mean", "var")],
        lambda b, v: b.op("batchnorm_grad", [v[n] for n in ("dy", "x", "s", "mean", "var")],
                          name="y"),
        [[Shard(0)], [P], [P]]),
    "batchnorm_grad/channels": (
        MESH1,
        [_x(NCHW, [Shard(1)], "dy"), _x(NCHW)] + [_x((4,), None, n) for n in ("s", "mean", "var")],
        lambda b, v: b.op("batchnorm_grad", [v[n] for n in ("dy", "x", "s", "mean", "var")],
                          name="y"),
        [[Shard(1)], [Shard(0)], [Shard(0)]]),
    "trilu/batch": (MESH1, [_x((4, 5, 5), [Shard(0)])],
                    lambda b, v: b.op("trilu", [v["x"]], {"k": 1}, name="y"), [[Shard(0)]]),
    "strided_slice/unsliced dim": (
        MESH1, [_x((4, 9), [Shard(0)])],
        lambda b, v: b.op("strided_slice", [v["x"]], {"starts": [1], "ends": [8], "axes": [1],
                                                      "steps": [2]}, name="y"), [[Shard(0)]]),
    "strided_slice_grad/unsliced dim": (
        MESH1, [_x((4, 4), [Shard(0)], "dy"), _x((4, 9), None, "like")],
        lambda b, v: b.op("strided_slice_grad", [v["dy"], v["like"]],
                          {"starts": [1], "ends": [8], "axes": [1], "steps": [2]}, name="y"),
        [[Shard(0)]]),
    "layernorm_grad/rows": (
        MESH1, [_x((4, 3, 8), [Shard(1)], "dy"), _x((4, 3, 8)), _x((8,), None, "g")],
        lambda b, v: b.op("layernorm_grad", [v["dy"], v["x"], v["g"]], name="y"),
        [[Shard(1)], [P], [P]]),
    "rmsnorm_grad/rows": (
        MESH2, [_x((4, 6, 8), [Shard(0), Shard(1)], "dy"), _x((4, 6, 8)), _x((8,), None, "g")],
        lambda b, v: b.op("rmsnorm_grad", [v["dy"], v["x"], v["g"]], name="y"),
        [[Shard(0), Shard(1)], [P, P]]),
    "embedding_grad/ids": (
        MESH1, [_x((4, 3, 6), [Shard(0)], "dy"), _x((4, 3), None, "ids", I64)],
        lambda b, v: b.op("embedding_grad", [v["dy"], v["ids"]], {"num_embeddings": 10}, name="y"),
        [[P]]),
    "embedding_grad/features": (
        MESH1, [_x((4, 3, 6), [Shard(2)], "dy"), _x((4, 3), None, "ids", I64)],
        lambda b, v: b.op("embedding_grad", [v["dy"], v["ids"]], {"num_embeddings": 10}, name="y"),
        [[Shard(1)]]),
    "gather_grad/indices": (
        MESH1,
        [_x((4, 3, 5), [Shard(1)], "dy"), _x((4, 3), None, "idx", I64), _x((10, 5), None, "like")],
        lambda b, v: b.op("gather_grad", [v["dy"], v["idx"], v["like"]], {"axis": 0}, name="y"),
        [[P]]),
    "gather_grad/data dim": (
        MESH1,
        [_x((4, 3, 6), [Shard(2)], "dy"), _x((4, 3), None, "idx", I64), _x((10, 6), None, "like")],
        lambda b, v: b.op("gather_grad", [v["dy"], v["idx"], v["like"]], {"axis": 0}, name="y"),
        [[Shard(1)]]),
    "select_label/batch": (
        MESH1, [_x((4, 10), [Shard(0)]), _x((4,), None, "labels", I64)],
        lambda b, v: b.op("select_label", [v["x"], v["labels"]], name="y"), [[Shard(0)]]),
    "select_label_grad/batch": (
        MESH1, [_x((4,), [Shard(0)], "dy"), _x((4, 10)), _x((4,), None, "labels", I64)],
        lambda b, v: b.op("select_label_grad", [v["dy"], v["x"], v["labels"]], name="y"),
        [[Shard(0)]]),
    # vocabulary parallelism: each device holds some rows of the table (some
    # classes of the logits), looks up / picks the ids in its range, zeros
    # elsewhere: partial sums (random ids lie in [0, 8), so every piece of
    # the 2-way split is hit, and of the nested 3/2/3/2 split all but the last)
    "embedding/vocabulary rows": (
        MESH1, [_x((10, 4), [Shard(0)], "t"), _x((3, 5), None, "ids", I64)],
        lambda b, v: b.op("embedding", [v["t"], v["ids"]], name="y"), [[P]]),
    "embedding/vocabulary rows, nested": (
        MESH2, [_x((10, 4), [Shard(0), Shard(0)], "t"), _x((3, 5), None, "ids", I64)],
        lambda b, v: b.op("embedding", [v["t"], v["ids"]], name="y"), [[P, P]]),
    "embedding/batch x vocabulary rows": (
        MESH2, [_x((10, 4), [R, Shard(0)], "t"), _x((4, 5), [Shard(0), R], "ids", I64)],
        lambda b, v: b.op("embedding", [v["t"], v["ids"]], name="y"), [[Shard(0), P]]),
    "select_label/vocabulary": (
        MESH1, [_x((4, 10), [Shard(1)]), _x((4,), None, "labels", I64)],
        lambda b, v: b.op("select_label", [v["x"], v["labels"]], name="y"), [[P]]),
    "select_label_grad/vocabulary": (
        MESH2,
        [_x((4,), None, "dy"), _x((4, 10), [Shard(1), Shard(1)]), _x((4,), None, "labels", I64)],
        lambda b, v: b.op("select_label_grad", [v["dy"], v["x"], v["labels"]], name="y"),
        [[Shard(1), Shard(1)]]),
    # a weight's gradient from a batch of sequences: the batch is contracted
    "matmul sum_batch/batch": (
        MESH1, [_x((4, 3, 6), [Shard(0)]), _x((4, 3, 5), [Shard(0)], "g")],
        lambda b, v: b.op("matmul", [v["x"], v["g"]], {"trans_a": True, "sum_batch": True},
                          name="y"), [[P]]),
    "matmul sum_batch/rows": (
        MESH1, [_x((4, 3, 6), [Shard(2)]), _x((4, 3, 5), None, "g")],
        lambda b, v: b.op("matmul", [v["x"], v["g"]], {"trans_a": True, "sum_batch": True},
                          name="y"), [[Shard(0)]]),
    "matmul sum_batch/batch x columns": (
        MESH2, [_x((4, 3, 6), [Shard(0), R]), _x((4, 3, 6), [Shard(0), Shard(2)], "g")],
        lambda b, v: b.op("matmul", [v["x"], v["g"]], {"trans_a": True, "sum_batch": True},
                          name="y"), [[P, Shard(1)]]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_propagates_and_lowering_equals_unsharded(case):
    mesh, inputs, body, expected = CASES[case]
    module = _program(mesh, inputs, body)
    sharded, local = shard_program(module)
    verify(local)
    main = sharded.functions["main"]
    op = next(o for o in main.ops if o.op_type not in ("redistribute",)
              and o.outputs[0].name.split(".")[0] == "y")
    assert [list(v.type.placements) for v in op.outputs] == expected
    overrides = {"var": np.linspace(0.5, 2.0, 4).astype(np.float32)}
    result = check_lowering(module, local, overrides=overrides)
    assert result.ok, str(result)
    # the op itself runs on pieces or partial terms, not on a replicated copy
    assert any(not isinstance(p, Replicate) for v in op.inputs for p in v.type.placements)


@pytest.mark.parametrize("mesh, rows", [(MESH1, [Shard(0)]), (MESH2, [Shard(0), Shard(0)])])
def test_embedding_grad_computes_only_the_rows_each_device_holds(mesh, rows):
    """A table gradient wanted row-sharded (as the table it updates) is
    computed row-sharded from replicated inputs: each device accumulates
    the ids of its rows (``num_embeddings`` its rows, ``offset`` their
    start), no reduction and no slicing afterwards."""
    module = _program(mesh, [_x((4, 3, 6), None, "dy"), _x((4, 3), None, "ids", I64)],
                      lambda b, v: b.op("embedding_grad", [v["dy"], v["ids"]],
                                        {"num_embeddings": 10}, name="y"))
    annotate_sharding(module.functions["main"].outputs[0], mesh, rows)
    sharded, local = shard_program(module)
    verify(local)
    op = next(o for o in sharded.functions["main"].ops if o.op_type == "embedding_grad")
    assert list(op.outputs[0].type.placements) == rows
    assert not [o for o in local.ops if o.op_type.startswith("comm.")]
    pieces = sorted((o.attrs["offset"], o.attrs["num_embeddings"]) for o in local.ops
                    if o.op_type == "embedding_grad")
    assert pieces == ([(0, 5), (5, 5)] if mesh is MESH1 else [(0, 3), (3, 2), (5, 3), (8, 2)])
    result = check_lowering(module, local)
    assert result.ok, str(result)
