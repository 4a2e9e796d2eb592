"""The verifier's pass over columns (programs whose BuildLog lists their
kinds) against the op-by-op pass: on built programs and on the same
programs broken in each way the verifier knows, both give the same
verdict, and verify() raises the exact pass's error. A program whose ops
break the log's promise (a copy of a kind with other attributes) is not
judged by its kinds: the column pass declines and the exact pass decides.
The ValueTable the verifier shares with the simulator's index is checked
against reading the objects."""
import dataclasses

import numpy as np
import pytest

from distsim.api import build_program
from distsim.errors import VerifyError
from distsim.ir import Op, Value
from distsim.ir.build_log import BuildLog
from distsim.ir.types import TensorType
from distsim.ir.value_table import ValueTable
from distsim.ir.verifier import _looks_valid, _looks_valid_by_columns, _verify, verify
from program_specs import LOGGED_PROGRAMS

PROGRAMS = LOGGED_PROGRAMS


def built(name):
    model, topology, strategy = PROGRAMS[name]
    program, _, topo = build_program(model, topology, verify_program=False, **strategy)
    assert isinstance(program.build_log, BuildLog) and program.build_log.matches(program)
    return program, list(topo.ranks)


def by_columns(f, devices):
    return _looks_valid_by_columns(f, devices, ValueTable(f), f.build_log)


def error_of(fn, *args):
    try:
        fn(*args)
    except VerifyError as e:
        return str(e)
    return None


def same_verdicts(f, devices):
    """Both first passes agree, and verify() says what the exact pass says."""
    columns, objects = by_columns(f, devices), _looks_valid(f, devices)
    assert columns == objects
    assert error_of(verify, f, devices) == error_of(_verify, f, devices)
    return columns


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_built_programs_pass_the_column_pass(name):
    f, devices = built(name)
    assert same_verdicts(f, devices) is True


def _replace_op(f, at, **changes):
    """Op ``at`` replaced in place (its slots rewritten, so that the log,
    which checks ops by identity, still lists it)."""
    op = f.ops[at]
    for field, value in changes.items():
        setattr(op, field, value)


def _middle(f, want=lambda op: True):
    ats = [i for i, op in enumerate(f.ops) if want(op)]
    return ats[len(ats) // 2]


def _wrong_result_type(f):
    at = _middle(f, lambda op: op.outputs and isinstance(op.outputs[0].type, TensorType))
    v = f.ops[at].outputs[0]
    t = v.type
    wrong = Value(v.name, TensorType(tuple(d + 1 for d in t.shape) or (2,), t.dtype, t.device))
    _replace_op(f, at, outputs=(wrong,) + tuple(f.ops[at].outputs[1:]))


def _read_before_made(f):
    at = _middle(f, lambda op: op.inputs)
    later = next(op.outputs[0] for op in f.ops[at + 1:] if op.outputs)
    _replace_op(f, at, inputs=(later,) + tuple(f.ops[at].inputs[1:]))


def _reused_name(f):
    at = _middle(f, lambda op: op.outputs)
    earlier = next(op.outputs[0] for op in f.ops[:at] if op.outputs)
    f.ops[at].outputs[0].name = earlier.name


def _defined_twice(f):
    at = _middle(f, lambda op: op.outputs)
    first = next(op for op in f.ops[:at] if op.outputs)
    _replace_op(f, at, outputs=first.outputs)


def _undefined_output(f):
    f.outputs.append(Value("nowhere", f.outputs[0].type))


def _undefined_operand(f):
    at = _middle(f, lambda op: op.inputs)
    stray = Value("stray", f.ops[at].inputs[0].type)
    _replace_op(f, at, inputs=(stray,) + tuple(f.ops[at].inputs[1:]))


def _too_many_results(f):
    at = _middle(f, lambda op: op.outputs)
    extra = Value("extra_result", f.ops[at].outputs[0].type)
    _replace_op(f, at, outputs=tuple(f.ops[at].outputs) + (extra,))


def _unknown_op_type(f):
    _replace_op(f, _middle(f), op_type="no_such_op")


BREAKS = [_wrong_result_type, _read_before_made, _reused_name, _defined_twice,
          _undefined_output, _undefined_operand, _too_many_results, _unknown_op_type]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("brk", BREAKS, ids=lambda b: b.__name__.strip("_"))
def test_broken_programs_get_the_exact_pass_error(name, brk):
    f, devices = built(name)
    brk(f)
    assert f.build_log.matches(f)
    assert same_verdicts(f, devices) is False
    with pytest.raises(VerifyError):
        verify(f, devices)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_device_missing_from_the_topology_is_found(name):
    f, devices = built(name)
    used = sorted({v.type.device for v in f.values() if getattr(v.type, "device", None)
                   is not None})
    fewer = [d for d in devices if d != used[-1]]
    assert same_verdicts(f, fewer) is False
    assert "not one of the devices" in error_of(verify, f, fewer)


def test_a_copy_with_other_attributes_is_judged_op_by_op():
    """A collective that is logged as a copy of its kind but reduces with
    another operator: a valid program, which the column pass does not
    judge by its kind's template (it declines), so the exact pass accepts
    it."""
    f, devices = built("gpt-tp-pp")
    log = f.build_log
    kind = np.asarray(log.kind)
    at = next(i for i, op in enumerate(f.ops)
              if op.attrs.get("reduce_op") == "sum" and log.firsts[kind[i]] != i)
    _replace_op(f, at, attrs=dict(f.ops[at].attrs, reduce_op="max"))
    assert by_columns(f, devices) is False
    assert _looks_valid(f, devices) is True
    assert verify(f, devices) is f


def test_a_stale_table_is_not_used():
    """verify() reads a new ValueTable when the one given no longer
    describes the function (an op appended after it was read)."""
    f, devices = built("gpt-tp-pp")
    table = ValueTable(f)
    last = f.ops[-1]
    f.ops.append(Op(last.op_type, last.inputs, [Value("again", last.outputs[0].type)],
                    last.attrs, last.subfunctions))
    f.build_log.add(f.ops[-1])
    assert not table.describes(f)
    assert verify(f, devices, values=table) is f


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_value_table_numbers_what_the_objects_say(name):
    f, _ = built(name)
    table = ValueTable(f)
    values = list(f.values())
    number = {id(v): n for n, v in enumerate(values)}
    assert [id(v) for v in table.values] == [id(v) for v in values]
    assert table.types == [v.type for v in values]
    assert table.n_in.tolist() == [len(op.inputs) for op in f.ops]
    assert table.n_out.tolist() == [len(op.outputs) for op in f.ops]
    assert table.reads.tolist() == [number[id(v)] for op in f.ops for v in op.inputs]
    assert table.outputs.tolist() == [number[id(v)] for v in f.outputs]
    assert not table.duplicated and table.describes(f)
    starts = table.out_start().tolist()
    firsts = np.cumsum([0] + [len(op.outputs) for op in f.ops])[:-1] + len(f.inputs)
    assert starts == firsts.tolist()
    renamed = dataclasses.replace(f, outputs=list(f.outputs[:-1]))
    assert not table.describes(renamed)
