"""Meshes, placements and DTensor types in the text format; bad input."""
import pytest

from distsim.errors import ParseError, VerifyError
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.ir.mesh import DeviceMesh, DTensorType, Partial, Replicate, Shard
from distsim.text import parse_module, print_module
from distsim.text.sharding_syntax import parse_dtensor_type
from distsim.transforms.sharding import (annotate_sharding, lower, propagate, verify_sharded,
                                        verify_teams)

TEXT = '''mesh @m = [2, 4] ("dp", "tp")

mesh @p = [2] ("x") devices [8, 9]

func @main(%x: f32[8,16]<@m, [S(0), S(0)]>, %w: f32[16,16]<@m, [R, P(max)]>, %z: bf16[3]<@p, [S(0)]>) -> (f32[8,16]<@m, [S(0), S(0)]>) {
  %y = relu(%x) : f32[8,16]<@m, [S(0), S(0)]>
  return %y
}
'''  # noqa: E501 (a function signature of the text format is one line)


def test_round_trip():
    module = parse_module(TEXT)
    assert print_module(module) == TEXT
    m = module.meshes["m"]
    assert (m.shape, m.axis_names, m.devices) == ((2, 4), ("dp", "tp"), tuple(range(8)))
    assert module.meshes["p"].devices == (8, 9)
    x, w, z = module.main.inputs
    assert x.type == DTensorType((8, 16), DType.F32, m, (Shard(0), Shard(0)))
    assert w.type.placements == (Replicate(), Partial("max"))
    assert z.type.local_shape((1,)) == (1,) and z.type.local_shape((0,)) == (2,)  # uneven


def test_unknown_mesh_is_a_parse_error():
    with pytest.raises(ParseError, match="3:25: unknown mesh @q"):
        parse_module('mesh @m = [4] ("a")\n\nfunc @main(%x: f32[2,3]<@q, [R]>) -> (f32[2,3]) {\n  '
                     'return %x\n}\n')


def test_type_text_and_placement_spellings():
    m = DeviceMesh("m", (2,), ("a",))
    t = parse_dtensor_type("f16[4,4]<@m, [P]>", {"m": m})
    assert t.placements == (Partial("sum"),) and t.print_text() == "f16[4,4]<@m, [P(sum)]>"


def test_mesh_geometry():
    m = DeviceMesh("m", (2, 3), ("a", "b"))
    assert m.groups(["b"]) == [(0, 1, 2), (3, 4, 5)] and m.groups(["a"]) == [(0, 3), (1, 4), (2, 5)]
    assert m.slice("a", 1).devices == (3, 4, 5) and m.sub_mesh(["a"]).devices == (0, 3)
    assert m.coords_of(4) == (1, 1) and m.rank_at((1, 2)) == 5


@pytest.mark.parametrize("annotation, words", [
    ("<@m, [S(2)]>", ["%x", "shard dim exists"]),                 # a dim that does not exist
    ("<@m, [S(0), R]>", ["%x", "one placement per mesh axis"]),  # an axis that does not exist
    ("<@m, [S(0)]>", ["%x", "dim 0 of size 2", "axis 'a' of size 4"]),  # shard larger than the dim
])
def test_bad_placements_name_the_value_and_rule(annotation, words):
    text = (f'mesh @m = [4] ("a")\n\nfunc @main(%x: f32[2,3]{annotation}) -> '
            f'(f32[2,3]{annotation}) {{\n  return %x\n}}\n')
    with pytest.raises(VerifyError) as info:
        verify_sharded(parse_module(text))
    for w in words:
        assert w in str(info.value)


def test_annotate_errors_name_the_value():
    m = DeviceMesh("m", (4,), ("a",))
    b = FunctionBuilder("main")
    x = b.input("x", TensorType((2, 3), DType.F32))
    with pytest.raises(VerifyError, match=r"%x.*a dim the rank-2 tensor does not have"):
        annotate_sharding(x, m, ["S(5)"])
    with pytest.raises(VerifyError, match="no axis 'zz'"):
        m.axis_index("zz")
    with pytest.raises(VerifyError, match=r"%x.*larger than it"):
        annotate_sharding(x, m, ["S(0)"])


def test_the_builder_annotates_sharding():
    from distsim.ir.builder import annotate_sharding as from_builder
    m = DeviceMesh("m", (2,), ("a",))
    b = FunctionBuilder("main")
    x = b.annotate_sharding(b.input("x", TensorType((4, 3), DType.F32)), m, ["S(0)"])
    assert x.type == DTensorType((4, 3), DType.F32, m, (Shard(0),))
    y = from_builder(b.op("relu", [x], name="y"), m, [Partial()])
    assert y.type.placements == (Partial(),)
    assert from_builder is annotate_sharding  # transforms.sharding re-exports the builder's
    with pytest.raises(VerifyError, match=r"%z: dim 0 of size 1.*larger than it"):
        b.annotate_sharding(b.input("z", TensorType((1, 3), DType.F32)), m, ["S(0)"])


def test_team_outside_the_mesh():
    m = DeviceMesh("m", (2,), ("a",))
    b = FunctionBuilder("main")
    xs = [b.input(f"x{r}", TensorType((4,), DType.F32, r)) for r in (0, 5)]
    b.op("comm.allreduce", xs, {"ranks": [0, 5], "mesh": "m", "axes": ["a"]}, name="y")
    with pytest.raises(VerifyError, match=r"%y.*outside mesh @m.*team in mesh"):
        verify_teams(b.finish([]), {"m": m})
    b2 = FunctionBuilder("main")
    xs = [b2.input(f"x{r}", TensorType((4,), DType.F32, r)) for r in (0, 1)]
    b2.op("comm.allreduce", xs, {"ranks": [0, 1], "mesh": "m", "axes": ["nope"]}, name="y")
    with pytest.raises(VerifyError, match="has no axis 'nope'"):
        verify_teams(b2.finish([]), {"m": m})


def test_op_placements_checked_against_the_rule():
    text = '''mesh @m = [2] ("a")

func @main(%x: f32[4,4]<@m, [P(sum)]>) -> (f32[4,4]<@m, [P(sum)]>) {
  %y = relu(%x) : f32[4,4]<@m, [P(sum)]>
  return %y
}
'''
    with pytest.raises(VerifyError, match=r"%y = relu.*not a sharding of relu"):
        verify_sharded(parse_module(text), propagated=True)
    # propagation resolves the partial before the relu instead
    sharded = verify_sharded(propagate(parse_module(text)), propagated=True)
    assert [op.op_type for op in sharded.main.ops][0] == "redistribute"


def test_lowering_an_unpropagated_program_is_refused():
    text = ('mesh @m = [2] ("a")\n\nfunc @main(%x: f32[4]) -> (f32[4]) {\n'
            '  %y = relu(%x) : f32[4]\n  return %y\n}\n')
    from distsim.errors import PassPreconditionError
    with pytest.raises(PassPreconditionError, match="no placement"):
        lower(parse_module(text))
    with pytest.raises(PassPreconditionError, match="no value of @main has a placement"):
        propagate(parse_module(text))
