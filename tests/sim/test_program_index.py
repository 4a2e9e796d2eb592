"""The simulator's columnar index of a program (distsim.sim.program_index),
checked op by op against the plain definitions it vectorizes: each op's
cost is the cost model's, each value's category is value_category's, a
block starts at each op that reads from outside its stream, and the values
a stream announces are the ones communication (or another stream) reads."""
import pytest

from distsim.api import build_program
from distsim.cost import CostModel
from distsim.errors import SimulationError
from distsim.ir import DType, FunctionBuilder, Op, TensorType, Value
from distsim.ir.comm import is_communication, members
from distsim.sim import op_costs
from distsim.sim.program_index import index_program, value_category
from distsim.sim.simulator import simulate_function
from distsim.topology import load_topology

F32 = DType.F32

PROGRAMS = {
    "dp-mlp": ("mlp", "dgx-a100", dict(dp=4, layers=3)),
    "tp-pp-gpt": ("tiny", "dgx-a100", dict(dp=2, tp=2, pp=2, dtype="f32")),
    "zero3-coarsened": ("tiny", "dgx-a100-x2", dict(dp=4, tp=2, pp=2, zero=3, coarsen=True)),
}


def odd_program():
    """Well-formed no more: device 1 reads device 0's compute result
    directly, and device 0 reads a value its stream makes later (the run
    would deadlock; the index is still exact). Two ``scale`` ops differ only
    in an attribute that the profile below charges by."""
    t = TensorType((8, 8), F32, 0)
    x, w, a, d, e, s1, s2 = (Value(n, t) for n in ("x", "w", "a", "d", "e", "s1", "s2"))
    c = Value("c", TensorType((8, 8), F32, 1))
    b = FunctionBuilder("odd")
    b.function.inputs += [x, w]
    b.function.ops += [Op("matmul", [x, w], [a]), Op("relu", [a], [c]),
                       Op("matmul", [a, e], [d]), Op("relu", [x], [e]),
                       Op("scale", [d], [s1], {"factor": 2.0}),
                       Op("scale", [d], [s2], {"factor": 3.0})]
    b.function.outputs += [c, s1, s2]
    return b.function


# each program costed op by op (small programs) and by numpy tables (large
# ones: distsim.sim.op_costs.SMALL set to 0 forces that path)
@pytest.fixture(scope="module", params=[(name, path) for name in sorted(PROGRAMS) + ["hand-built"]
                                        for path in ("op-by-op", "tables")],
                ids=lambda p: "-".join(p))
def indexed(request):
    name, path = request.param
    if name == "hand-built":
        program, topo = odd_program(), load_topology("dgx-a100")
        cost = CostModel(topo.device_spec, profile={"scale": lambda op: op.attrs["factor"]})
    else:
        model, topology, strategy = PROGRAMS[name]
        program, _, topo = build_program(model, topology, **strategy)
        cost = CostModel(topo.device_spec)
    small = op_costs.SMALL
    op_costs.SMALL = small if path == "op-by-op" else 0
    try:
        return program, cost, index_program(program, topo, cost, lambda r: True)
    finally:
        op_costs.SMALL = small


def test_values_are_numbered_inputs_first_then_results_in_program_order(indexed):
    program, _, ix = indexed
    assert ix.values == list(program.values())


def test_each_op_costs_what_the_cost_model_says(indexed):
    """Ops are costed once per distinct signature: no two different ops
    may share a cost by mistake."""
    program, cost, ix = indexed
    computes = [op for op in program.ops if not is_communication(op)]
    assert ix.compute == computes
    for k, op in enumerate(computes):
        c = cost.op_cost(op)
        assert (ix.compute_time[k], ix.compute_flops[k], ix.compute_bytes[k]) == \
            (c.time_s, c.flops, c.bytes), op


def test_sizes_devices_and_categories_follow_each_value(indexed):
    program, _, ix = indexed
    roles = program.meta.get("roles", {})
    grads = set(program.meta.get("grads", {}).values())
    updated = set(program.meta.get("updates", {}).values())
    made_by = {v: op for op in program.ops for v in op.outputs}
    for n, v in enumerate(ix.values):
        assert ix.device[n] == v.type.device
        assert ix.size[n] == (0 if v.name in updated else v.type.size_bytes)
        assert ix.categories[ix.category[n]] == value_category(v, made_by.get(v), roles, grads)


def test_streams_blocks_and_exports_match_a_per_op_walk(indexed):
    """The reference: walk the ops; a value is inside a stream once that
    device's compute op made it; an op reading anything else (not a
    function input) starts a block; collectives' operands and outside reads
    made by a compute op are announced by the stream that made them."""
    program, _, ix = indexed
    inputs = set(program.inputs)
    made_on = {}          # value -> (device, position in its stream)
    blocks, exports, length = {}, {}, {}
    announced = set()
    for op in program.ops:
        if is_communication(op):
            announced.update(op.inputs)
            continue
        dev = (op.outputs or op.inputs)[0].type.device
        pos = length.get(dev, 0)
        length[dev] = pos + 1
        outside = tuple(v for v in op.inputs
                        if v not in inputs and made_on.get(v, (None,))[0] != dev)
        if outside or pos == 0:
            blocks.setdefault(dev, []).append((pos, outside))
        announced.update(outside)
        for v in op.outputs:
            made_on[v] = (dev, pos)
    number = {v: n for n, v in enumerate(ix.values)}
    for v in announced:
        if v in made_on:
            dev, pos = made_on[v]
            exports.setdefault(dev, []).append((pos, number[v]))
    assert set(ix.compute_streams) == set(length)
    for dev, stream in ix.compute_streams.items():
        assert len(stream.ops) == length[dev]
        assert [(p, tuple(ix.values[n] for n in vals)) for p, vals in stream.block_starts] \
            == blocks[dev]
        assert stream.exports == sorted(exports.get(dev, []))


def test_comm_streams_list_each_members_collectives(indexed):
    program, _, ix = indexed
    expected = {}
    for c, op in enumerate(op for op in program.ops if is_communication(op)):
        for r in members(op):
            expected.setdefault(r, []).append(c)
    assert ix.comm_streams == expected
    number = {v: n for n, v in enumerate(ix.values)}
    assert ix.collective_inputs == [tuple(number[v] for v in op.inputs)
                                    for op in program.ops if is_communication(op)]
    assert ix.collective_reads.tolist() == [n for t in ix.collective_inputs for n in t]
    assert ix.collective_read_counts.tolist() == [len(t) for t in ix.collective_inputs]
    # each member's own operands: those of the collective on its device
    colls = [op for op in program.ops if is_communication(op)]
    assert ix.comm_inputs == {
        r: [tuple(number[v] for v in colls[c].inputs if v.type.device == r) for c in cs]
        for r, cs in expected.items()}


def _two_ops(first_out: Value, second_out: Value, x: Value):
    b = FunctionBuilder("f")
    b.function.inputs.append(x)
    b.function.ops.append(Op("relu", [x], [first_out]))
    b.function.ops.append(Op("relu", [first_out], [second_out]))
    b.function.outputs.append(second_out)
    return b.function


def test_a_value_defined_twice_is_named():
    t = TensorType((4,), F32, 0)
    x, y = Value("x", t), Value("y", t)
    program = _two_ops(y, y, x)
    with pytest.raises(SimulationError, match=r"value %y is defined twice"):
        simulate_function(program, load_topology("dgx-a100"))


def test_an_op_with_neither_operands_nor_results_is_named():
    b = FunctionBuilder("f")
    b.function.ops.append(Op("barrier", [], []))
    with pytest.raises(SimulationError, match=r"%barrier \(barrier\) has neither operands"):
        simulate_function(b.function, load_topology("dgx-a100"))


def test_a_read_of_a_value_nobody_defines_is_named():
    t = TensorType((4,), F32, 0)
    x, ghost, y = Value("x", t), Value("ghost", t), Value("y", t)
    b = FunctionBuilder("f")
    b.function.inputs.append(x)
    b.function.ops.append(Op("add", [x, ghost], [y]))
    with pytest.raises(SimulationError, match=r"%y \(add\) reads %ghost, which no op"):
        simulate_function(b.function, load_topology("dgx-a100"))
