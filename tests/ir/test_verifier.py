"""The verifier: one test per error kind, each message names the op."""
import pytest

from distsim.errors import VerifyError
from distsim.ir import DType, Function, FunctionBuilder, Op, TensorType, Value, verify

F32 = DType.F32


def t(*shape, dev=0, dtype=F32):
    return TensorType(tuple(shape), dtype, dev)


def test_valid_function_passes():
    b = FunctionBuilder("f")
    x = b.input("x", t(4, 8))
    w = b.input("w", t(8, 2))
    y = b.op("matmul", [x, w], name="y")
    assert verify(b.finish([y])).outputs[0].type == t(4, 2)


def test_use_before_definition():
    x = Value("x", t(4))
    y = Value("y", t(4))
    z = Value("z", t(4))
    f = Function("f", [x], [Op("add", [x, y], [z]), Op("relu", [x], [y])], [z])
    with pytest.raises(VerifyError, match=r"op %z = add: operand %y is used before it is defined"):
        verify(f)


def test_value_defined_twice():
    x = Value("x", t(4))
    y = Value("y", t(4))
    f = Function("f", [x], [Op("relu", [x], [y]), Op("relu", [x], [y])], [y])
    with pytest.raises(VerifyError, match="defined twice"):
        verify(f)


def test_duplicate_name():
    x = Value("x", t(4))
    y = Value("x", t(4))
    f = Function("f", [x], [Op("relu", [x], [y])], [y])
    with pytest.raises(VerifyError, match="name %x is used for two values"):
        verify(f)


def test_declared_type_differs_from_rule():
    x = Value("x", t(4, 8))
    w = Value("w", t(8, 2))
    y = Value("y", t(4, 3))
    f = Function("f", [x, w], [Op("matmul", [x, w], [y])], [y])
    with pytest.raises(VerifyError, match=r"%y = matmul: result %y is declared .* produces"):
        verify(f)


def test_shape_mismatch_names_op():
    x = Value("x", t(4, 8))
    w = Value("w", t(7, 2))
    y = Value("y", t(4, 2))
    f = Function("f", [x, w], [Op("matmul", [x, w], [y])], [y])
    with pytest.raises(VerifyError, match=r"%y = matmul: contraction dims differ"):
        verify(f)


def test_inputs_on_different_devices():
    x = Value("x", t(4, dev=0))
    z = Value("z", t(4, dev=1))
    y = Value("y", t(4, dev=0))
    f = Function("f", [x, z], [Op("add", [x, z], [y])], [y])
    with pytest.raises(VerifyError, match="inputs on different devices"):
        verify(f)


def test_unknown_op_type():
    x = Value("x", t(4))
    y = Value("y", t(4))
    f = Function("f", [x], [Op("frobnicate", [x], [y])], [y])
    with pytest.raises(VerifyError, match="unknown op type 'frobnicate'"):
        verify(f)


def test_undefined_output():
    x = Value("x", t(4))
    f = Function("f", [x], [], [Value("ghost", t(4))])
    with pytest.raises(VerifyError, match="returned value %ghost is not defined"):
        verify(f)


def test_value_on_unknown_device():
    b = FunctionBuilder("f")
    x = b.input("x", t(4, dev=9))
    f = b.finish([b.op("relu", [x])])
    with pytest.raises(VerifyError, match="device 9"):
        verify(f, known_devices=range(8))


def test_collective_input_on_wrong_device():
    a = Value("a", t(4, dev=0))
    c = Value("c", t(4, dev=2))
    o0, o1 = Value("o0", t(4, dev=0)), Value("o1", t(4, dev=1))
    f = Function("f", [a, c], [Op("comm.allreduce", [a, c], [o0, o1], {"ranks": (0, 1)})], [o0, o1])
    with pytest.raises(VerifyError, match="input on device 2 where team rank 1 was expected"):
        verify(f)


def test_unknown_attribute():
    x = Value("x", t(4))
    y = Value("y", t(4))
    f = Function("f", [x], [Op("relu", [x], [y], {"alpha": 1})], [y])
    with pytest.raises(VerifyError, match="unknown attribute 'alpha'"):
        verify(f)


def test_missing_required_attribute():
    x = Value("x", t(4))
    y = Value("y", t(4))
    f = Function("f", [x], [Op("scale", [x], [y])], [y])
    with pytest.raises(VerifyError, match="missing attribute 'factor'"):
        verify(f)


def test_wrong_arity():
    x = Value("x", t(4))
    y = Value("y", t(4))
    f = Function("f", [x], [Op("add", [x], [y])], [y])
    with pytest.raises(VerifyError, match="expects 2 inputs, got 1"):
        verify(f)


# The first pass (no messages, names checked at the end) against the exact
# pass that words the error: the exact one runs only when the first finds
# something, so the error is always that of the first broken invariant.

def test_a_name_reused_before_a_type_error_is_the_error_reported():
    """The first pass sees the duplicate name only at its end, after the
    type error of a later op: the exact pass reports what comes first."""
    x = Value("x", t(4, 8))
    w = Value("w", t(8, 2))
    a = Value("x", t(4, 8))                  # reuses the input's name
    y = Value("y", t(4, 3))                  # matmul gives (4, 2)
    f = Function("f", [x, w], [Op("relu", [x], [a]), Op("matmul", [a, w], [y])], [y])
    with pytest.raises(VerifyError, match="name %x is used for two values"):
        verify(f)


def test_a_value_too_large_is_reported():
    x = Value("x", t(2 ** 40, 2 ** 40))
    y = Value("y", t(2 ** 40, 2 ** 40))
    f = Function("f", [x], [Op("relu", [x], [y])], [y])
    with pytest.raises(VerifyError, match=r"input: value %x .* more than 2\^60 bytes"):
        verify(f)


def test_a_result_count_differing_from_the_rule_is_reported():
    x = Value("x", t(4))
    f = Function("f", [x], [Op("relu", [x], [Value("y", t(4)), Value("z", t(4))])], [x])
    with pytest.raises(VerifyError, match="has 2 results, its type rule gives 1"):
        verify(f)


@pytest.mark.parametrize("strategy", [dict(dp=4, tp=2, pp=2, dtype="f32"),
                                      dict(tp=2, pp=2, symmetry=True, coarsen=True,
                                           global_batch=16, micro_batch=2)])
def test_valid_programs_pass_the_first_pass_alone(strategy, monkeypatch):
    """Built programs are valid without the exact pass being run."""
    from distsim.api import build_program
    from distsim.ir import verifier

    program, _, topo = build_program("tiny", "dgx-a100-x2", verify_program=False, **strategy)

    def exact(*args):
        raise AssertionError("the exact pass ran on a valid program")

    monkeypatch.setattr(verifier, "_verify", exact)
    assert verify(program, known_devices=topo.ranks) is program
