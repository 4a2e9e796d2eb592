"""What builders log (distsim.ir.build_log) against the objects it stands
for: the simulator's index of a program built by DataParallel or the
transformer lowering is the same, field by field, whether it comes from
the builder's log (kinds of op; DataParallel's columns: value numbers,
types, operands, gradients, in-place updates) or from reading every op and
value; the ops of a kind agree on what a kind promises; and a log that no
longer describes its function (an op appended, replaced, moved or taken
away, an input or output changed) is not used."""
import dataclasses

import numpy as np
import pytest

from distsim.api import build_program
from distsim.cost import CostModel
from distsim.ir import Op, Value
from distsim.ir.comm import members
from distsim.models import MLPConfig, mlp_training_step
from distsim.sim.program_columns import ProgramColumns
from distsim.sim.program_index import index_program
from distsim.topology import load_topology
from distsim.transforms.data_parallel import DataParallel
from program_specs import LOGGED_PROGRAMS

# (model, topology, strategy): DataParallel, and the transformer lowering
# across schedules, ZeRO stages, recomputation, coarsening and symmetry
PROGRAMS = dict(LOGGED_PROGRAMS, **{
    "gpt-gpipe-zero1": ("tiny", "dgx-a100", dict(dp=4, tp=1, pp=2, zero=1, schedule="gpipe")),
    "gpt-zero2-recompute": ("tiny", "dgx-a100", dict(dp=4, tp=2, zero=2, recompute="full")),
    "gpt-sp-selective": ("tiny", "dgx-a100", dict(tp=4, pp=2, sp=True,
                                                  recompute="selective")),
})


def built(name):
    model, topology, strategy = PROGRAMS[name]
    return build_program(model, topology, **strategy)


#: how kinds are told apart: compared through what they give each collective
KIND_FIELDS = ("collective_kinds", "collective_kind", "kind_members")


def assert_same_index(a, b):
    """Every field of two ProgramIndex objects is equal (the kinds of
    collective through each collective's kind's members and facts)."""
    for ix in (a, b):
        ix.per_collective = [(ix.kind_members[k], same_facts(ix.collective_kinds[k]))
                             for k in ix.collective_kind.tolist()]
    assert a.per_collective == b.per_collective
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in KIND_FIELDS:
            continue
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        elif f.name == "compute_streams":
            assert x.keys() == y.keys()
            assert [dataclasses.astuple(s) for s in x.values()] == \
                [dataclasses.astuple(s) for s in y.values()], f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_index_with_the_builders_kinds_is_the_index_with_a_kind_per_op(name):
    program, _, topo = built(name)
    cost = CostModel(topo.device_spec)
    assert len(ProgramColumns(program).kinds) < len(program.ops)   # the log is used
    logged = index_program(program, topo, cost, lambda r: True)
    log, program.build_log = program.build_log, None
    assert ProgramColumns(program).kinds is program.ops
    read = index_program(program, topo, cost, lambda r: True)
    program.build_log = log
    assert_same_index(logged, read)


def same_facts(op):
    """What the ops of one kind share (see distsim.ir.build_log)."""
    m = op.meta
    return (op.op_type, op.attrs, tuple(map(id, op.subfunctions)),
            m.get("category"), m.get("role"), m.get("phase"), m.get("detail"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_ops_of_a_kind_share_what_a_kind_promises(name):
    program, _, _ = built(name)
    col = ProgramColumns(program)
    for k, op in zip(col.kind.tolist(), program.ops):
        assert same_facts(col.kinds[k]) == same_facts(op), op


def test_data_parallel_logs_the_copies_of_a_template_op_as_one_kind():
    """As many kinds as template ops, and one for the gradient all-reduces;
    each kind stands as its first op, in program order."""
    step = mlp_training_step(MLPConfig(layers=2, hidden=16, batch=8, dtype="f32"))
    program = DataParallel(4)(step)
    col = ProgramColumns(program)
    assert len(col.kinds) == len(step.ops) + 1
    firsts = [program.ops.index(op) for op in col.kinds]
    assert firsts == sorted(firsts)
    for k, op in zip(col.kind.tolist(), program.ops):
        assert program.ops.index(op) >= firsts[k]


def _dp_program(n=2, step=None):
    step = step or mlp_training_step(MLPConfig(layers=2, hidden=16, batch=8, dtype="f32"))
    return DataParallel(n)(step)


def read_from_objects(program):
    """The program's columns read from its objects (the log set aside)."""
    log, program.build_log = program.build_log, None
    try:
        return ProgramColumns(program)
    finally:
        program.build_log = log


@pytest.mark.parametrize("n", [1, 2, 4])
def test_data_parallel_columns_are_those_of_its_objects(n):
    program = _dp_program(n)
    logged = ProgramColumns(program)
    assert logged.in_place is not None and logged.gradients is not None   # the columns are used
    read = read_from_objects(program)
    assert logged.values == read.values and logged.types == read.types
    for name in ("n_in", "n_out", "reads", "outputs", "maker", "is_comm"):
        assert np.array_equal(getattr(logged, name), getattr(read, name)), name
    # gradients and in-place updates: what the meta tables name
    names = read.names()
    grads = set(program.meta["grads"].values())
    assert sorted(logged.gradients.tolist()) == \
        [k for k, v in enumerate(names) if v in grads and k >= read.n_inputs]
    number = {v: k for k, v in enumerate(names)}
    updates = {number[a]: number.get(b, -1) for a, b in program.meta["updates"].items()
               if a in number}
    old, new = logged.in_place
    assert dict(zip(old.tolist(), new.tolist())) == updates and (n == 1 or len(updates) > 0)


def test_a_template_name_that_a_copy_also_has_leaves_gradients_and_updates_to_names():
    """A step value named like another value's copy (``w_r0``): only a
    lookup by name says which value the meta tables name, so the log gives
    no gradients or updates, and the index is still the objects' one."""
    step = mlp_training_step(MLPConfig(layers=2, hidden=16, batch=8, dtype="f32"))
    grad = step.meta["grads"]["w0"]
    renamed = grad + "_r0"       # the copy of another value would be called that
    for v in step.values():
        if v.name == grad:
            v.name = renamed
    step.meta["grads"] = {p: (renamed if g == grad else g) for p, g in step.meta["grads"].items()}
    step.meta["updates"] = {k: v for k, v in step.meta.get("updates", {}).items()}
    other = next(v for v in step.values() if v.name not in (renamed,) and v in
                 {o for op in step.ops for o in op.outputs})
    other.name = grad           # its copy on rank 0 is named like the gradient's template
    program = DataParallel(2)(step)
    col = ProgramColumns(program)
    assert col.gradients is None and col.in_place is None
    topo = load_topology("dgx-a100")
    cost = CostModel(topo.device_spec)
    logged = index_program(program, topo, cost, lambda r: True)
    program.build_log = None
    assert_same_index(logged, index_program(program, topo, cost, lambda r: True))


def numbers_by_name(col, updates):
    """(old, new) numbers of ``updates`` found by name, as the index finds
    them without a log (the last value of a name; -1: none)."""
    number = {v: k for k, v in enumerate(col.names())}
    return ([number.get(a, -1) for a in updates], [number.get(b, -1) for b in updates.values()])


@pytest.mark.parametrize("name", sorted(n for n in PROGRAMS if n.startswith("gpt")))
def test_the_lowerings_logged_updates_are_the_values_meta_updates_names(name):
    program, _, _ = built(name)
    updates = program.meta["updates"]
    col = ProgramColumns(program)
    assert col.in_place is not None and len(updates) > 0       # the log is used
    old, new = col.in_place
    assert sorted(zip(old.tolist(), new.tolist())) == \
        sorted(zip(*numbers_by_name(col, updates)))
    assert (old >= 0).all() and (new >= 0).all()


def test_logged_updates_are_not_used_once_meta_updates_is_another_dict():
    """meta["updates"] replaced (even by an equal copy, which could have
    been edited): the updates are found by name, and the index is the same."""
    program, _, topo = built("gpt-tp-pp")
    cost = CostModel(topo.device_spec)
    logged = index_program(program, topo, cost, lambda r: True)
    program.meta["updates"] = dict(program.meta["updates"])
    assert ProgramColumns(program).in_place is None
    assert_same_index(logged, index_program(program, topo, cost, lambda r: True))
    first = next(iter(program.meta["updates"]))
    del program.meta["updates"][first]
    assert ProgramColumns(program).in_place is None


def test_an_old_value_updated_twice_counts_with_its_last_new_value():
    """A builder that updates one value twice writes the dict entry twice
    (the last stays) and logs two pairs: the last pair counts."""
    program, _, _ = built("gpt-tp-pp")
    updates, pairs = program.build_log.updated
    old, other = pairs[0][0], pairs[1][1]
    pairs.append((old, other))
    updates[old.name] = other.name
    col = ProgramColumns(program)
    assert col.in_place is not None
    olds, news = col.in_place
    assert len(olds) == len(updates)
    assert news[olds.tolist().index(col.values.index(old))] == col.values.index(other)
    assert sorted(zip(olds.tolist(), news.tolist())) == \
        sorted(zip(*numbers_by_name(col, updates)))


def _change_input(f):
    f.inputs.append(Value("unused", f.inputs[0].type))


def _change_output(f):
    f.outputs = f.outputs[1:]


def _append_op(f):
    v = f.ops[0].outputs[0]
    f.ops.append(Op("relu", [v], [Value("extra", v.type)]))


def _replace_op(f):
    old = f.ops[3]
    f.ops[3] = Op(old.op_type, old.inputs, old.outputs, old.attrs, old.subfunctions, old.meta)


def _drop_op(f):
    del f.ops[-1]


def _reorder(f):
    f.ops = f.ops[1:] + f.ops[:1]


@pytest.mark.parametrize("edit", [_append_op, _replace_op, _drop_op, _reorder])
def test_a_log_that_no_longer_describes_its_function_is_not_used(edit):
    program = _dp_program()
    assert program.build_log.matches(program)
    edit(program)
    assert not program.build_log.matches(program)
    assert ProgramColumns(program).kinds is program.ops


@pytest.mark.parametrize("edit", [_change_input, _change_output])
def test_columns_that_no_longer_describe_the_inputs_or_outputs_are_not_used(edit):
    program = _dp_program()
    assert program.build_log.columns_match(program)
    edit(program)
    assert program.build_log.matches(program)             # the kinds still hold
    assert not program.build_log.columns_match(program)
    assert ProgramColumns(program).in_place is None       # read from the objects


def test_a_copy_of_the_function_does_not_use_the_original_log():
    """The log belongs to the function it was made for, even where a copy
    has the same ops (a copy may be edited apart from the original)."""
    program = _dp_program()
    copy = dataclasses.replace(program, ops=list(program.ops))
    assert copy.build_log is program.build_log and not copy.build_log.matches(copy)
    assert program.build_log.matches(program)


@pytest.mark.parametrize("name", ["dp-mlp", "gpt-zero3-coarsened", "gpt-interleaved-symmetry"])
def test_each_collective_gets_the_plan_of_its_own_op(name):
    """Plans are worked out once per (kind, bytes): each is the one the
    collective's own op gives."""
    from distsim.sim.simulator import SimulationOptions, Simulator
    program, _, topo = built(name)
    sim = Simulator(program, topo, options=SimulationOptions(symmetry=True))
    sim._prepare()
    planned = [c for c in sim._collectives if c.simulated]
    assert planned
    for coll in planned:
        assert coll.plan == sim._collective_plan(coll.op)
        assert coll.members == members(coll.op)


@pytest.mark.parametrize("name", ["dp-mlp", "gpt-zero3-coarsened"])
def test_a_pickled_program_leaves_its_log_behind_and_simulates_the_same(name):
    import pickle

    from distsim.sim.simulator import simulate_function
    program, _, topo = built(name)
    copy = pickle.loads(pickle.dumps(program))
    assert copy.build_log is None
    assert copy.structural_key() == program.structural_key()
    assert simulate_function(copy, topo).step_time_s == simulate_function(program, topo).step_time_s
