"""The nested-call case: main calls a private two-layer mlp twice, only
main's input is annotated; propagation specialises the callee, lowering
inlines it, and the numbers equal the unsharded program's."""
from pathlib import Path

import numpy as np
import pytest

from distsim.interp import NumpyExecutor, random_inputs
from distsim.ir import TensorType
from distsim.ir.ops_call import link_calls
from distsim.ir.mesh import DTensorType, Partial, Replicate, Shard
from distsim.text import parse_module, print_module
from distsim.transforms.sharding import assemble, local_inputs

from sharding_helpers import comm_ops, run_sharded

MODEL = Path(__file__).resolve().parents[2] / "models" / "nested_mlp.dir"

BODY = '''
func @mlp(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %a = relu(%h) : f32[8,32]
  %y = matmul(%a, %w2) : f32[8,16]
  return %y
}

func @main(%x: f32[8,16]XTYPE, %w1: f32[16,32], %w2: f32[32,16], %w3: f32[16,32], %w4: f32[32,16]) -> (f32[8,16]) {
  %h = call(%x, %w1, %w2) {callee = "mlp"} : f32[8,16]
  %y = call(%h, %w3, %w4) {callee = "mlp"} : f32[8,16]
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)


def unsharded_result(module, inputs):
    """The same program with every annotation dropped, run as one device."""
    plain = link_calls(parse_module(print_module(module)))
    for f in plain:
        for v in f.values():
            v.type = TensorType(v.type.shape, v.type.dtype)
    return NumpyExecutor().run(plain.functions["main"], inputs)[0]


def sharded_result(module, local, inputs):
    f = module.functions["main"]
    record = local.meta["sharding"]
    ex = NumpyExecutor()
    outs = ex.run(local,
                  local_inputs(local.inputs, record, {v.name: a for v, a in zip(f.inputs, inputs)}))
    name, t = local.meta["outputs"][0]
    return assemble(dict(zip(t.mesh.all_coords(), outs)), t)


@pytest.mark.parametrize("mesh, xtype", [
    ('mesh @m = [2] ("dp")', "<@m, [S(0)]>"),
    ('mesh @m = [2, 2] ("dp", "tp")', "<@m, [S(0), R]>"),
    ('mesh @m = [2, 2] ("dp", "tp")', "<@m, [S(0), S(1)]>"),
    ('mesh @m = [2, 2] ("dp", "tp")', "<@m, [R, S(1)]>"),
])
def test_nested_mlp_equals_unsharded(mesh, xtype):
    module = parse_module(mesh + "\n" + BODY.replace("XTYPE", xtype))
    sharded, local = run_sharded(module)
    inputs = random_inputs(module.functions["main"], seed=3)
    np.testing.assert_allclose(sharded_result(module, local, inputs),
                               unsharded_result(module, inputs), rtol=1e-4, atol=1e-4)
    # only main's input was annotated: every value of every function now is placed
    for f in sharded:
        for v in f.values():
            assert isinstance(v.type, DTensorType)


def test_model_file_runs_on_two_devices():
    module = parse_module(MODEL.read_text())
    sharded, local = run_sharded(module)
    main = sharded.functions["main"]
    assert [v.type.placements for v in main.inputs] == [(Shard(0),)] + [(Replicate(),)] * 4
    assert set(sharded.functions) == {"main", "mlp"}  # both calls share one specialisation
    assert local.devices() == [0, 1] and comm_ops(local) == []


def test_two_signatures_give_two_specialisations():
    text = '''mesh @m = [2] ("tp")

func @mlp(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %a = relu(%h) : f32[8,32]
  %y = matmul(%a, %w2) : f32[8,16]
  return %y
}

func @main(%x: f32[8,16]<@m, [S(0)]>, %w1: f32[16,32]<@m, [S(1)]>, %w2: f32[32,16]<@m, [S(0)]>, %w3: f32[16,32], %w4: f32[32,16]) -> (f32[8,16]) {
  %h = call(%x, %w1, %w2) {callee = "mlp"} : f32[8,16]
  %y = call(%h, %w3, %w4) {callee = "mlp"} : f32[8,16]
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)
    sharded, local = run_sharded(text)
    assert set(sharded.functions) == {"main", "mlp", "mlp.1"}
    first, second = [op for op in sharded.functions["main"].ops if op.op_type == "call"]
    assert first.attrs["callee"] != second.attrs["callee"]
    # the first callee's result is partial over "tp": it flows back to the caller
    assert first.outputs[0].type.placements == (Partial("sum"),)
    text_out = print_module(sharded)
    assert print_module(parse_module(text_out)) == text_out


def test_a_callees_annotations_reach_its_callers():
    # only the MLP says how its weights lie; main and block annotate nothing
    # (the sweeps skipped a call that knew nothing: "no value of @main has a placement")
    text = '''mesh @m = [2] ("tp")

func @mlp(%x: f32[8,16], %w1: f32[16,32]<@m, [S(1)]>, %w2: f32[32,16]<@m, [S(0)]>) -> (f32[8,16]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %y = matmul(%h, %w2) : f32[8,16]
  return %y
}

func @block(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %y = call(%x, %w1, %w2) {callee = "mlp"} : f32[8,16]
  return %y
}

func @main(%x: f32[8,16], %w1: f32[16,32], %w2: f32[32,16]) -> (f32[8,16]) {
  %y = call(%x, %w1, %w2) {callee = "block"} : f32[8,16]
  return %y
}
'''
    sharded, local = run_sharded(text)
    main = sharded.functions["main"]
    assert [v.type.placements for v in main.inputs] == [(Replicate(),), (Shard(1),), (Shard(0),)]
    assert [op.op_type for op in comm_ops(local)] == ["comm.allreduce"]
