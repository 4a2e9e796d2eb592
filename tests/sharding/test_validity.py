"""Combinations of per-axis strategies that do not work on a mesh: a
reshape whose pieces do not line up, a nested uneven shard whose inner
pieces are smaller than the axis splitting them."""
import pytest

from distsim.cli import main
from distsim.errors import VerifyError
from distsim.ir import DType
from distsim.ir.mesh import (DeviceMesh, DTensorType, Partial, Replicate, Shard, check_placements,
                             dtensor)
from distsim.text import parse_module
from distsim.transforms.sharding import verify_sharded
from distsim.transforms.sharding.validity import reshape_error

from sharding_helpers import run_sharded

R = Replicate()


def reshape_module(mesh_shape, src, dst, placements):
    names = ", ".join(f'"{a}"' for a in "abc"[:len(mesh_shape)])
    pl = ", ".join(placements)
    return (f"mesh @m = [{', '.join(map(str, mesh_shape))}] ({names})\n\n"
            f"func @main(%x: f32[{','.join(map(str, src))}]<@m, [{pl}]>) -> "
            f"(f32[{','.join(map(str, dst))}]) {{\n"
            f"  %y = reshape(%x) {{shape = [{', '.join(map(str, dst))}]}} : "
            f"f32[{','.join(map(str, dst))}]\n"
            f"  return %y\n}}\n")


@pytest.mark.parametrize("mesh_shape, src, dst, placements", [
    ((2,), (6, 4), (3, 8), ["S(0)"]),        # rows 0-2 = elements 0-11; [3,8] has no row cut there
    ((4,), (6, 4), (24,), ["S(0)"]),         # pieces of 8, 8, 4, 4 elements vs 6 each
    ((2, 3), (6, 4), (3, 8), ["S(0)", "S(1)"]),
    ((3,), (6, 4), (2, 12), ["S(0)"]),       # 6 rows over 3 = 8 elements each, 2 rows over 3: no
])
def test_reshape_whose_pieces_do_not_line_up_is_lowered_correctly(mesh_shape, src, dst, placements,
                                                                    tmp_path, capsys):
    text = reshape_module(mesh_shape, src, dst, placements)
    sharded, _ = run_sharded(text)  # propagates, verifies, lowers and checks the numbers
    op = next(op for op in sharded.functions["main"].ops if op.op_type == "reshape")
    assert reshape_error(op.inputs[0].type, op.outputs[0].type) is None
    path = tmp_path / "r.dir"
    path.write_text(text)
    assert main(["check", str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_reshape_that_lines_up_keeps_the_shard():
    # [6,4] -> [24] on 2 devices: rows 0-2 are elements 0-11, exactly the first half of [24]
    sharded, local = run_sharded(reshape_module((2,), (6, 4), (24,), ["S(0)"]))
    y = next(op for op in sharded.functions["main"].ops if op.op_type == "reshape").outputs[0]
    assert y.type.placements == (Shard(0),)
    assert not [op for op in local.ops if op.op_type.startswith("comm.")]
    # [4,6] -> [2,2,6] on 2 devices: a split of the sharded major dim
    sharded, _ = run_sharded(reshape_module((2,), (4, 6), (2, 2, 6), ["S(0)"]))
    y = next(op for op in sharded.functions["main"].ops if op.op_type == "reshape").outputs[0]
    assert y.type.placements == (Shard(0),)


def test_verifier_rejects_a_reshape_whose_pieces_do_not_line_up():
    text = ('mesh @m = [2] ("a")\n\n'
            'func @main(%x: f32[6,4]<@m, [S(0)]>) -> (f32[3,8]<@m, [S(0)]>) {\n'
            '  %y = reshape(%x) {shape = [3, 8]} : f32[3,8]<@m, [S(0)]>\n  return %y\n}\n')
    with pytest.raises(VerifyError, match=r"%y = reshape.*elements.*rule: pieces line up"):
        verify_sharded(parse_module(text), propagated=True)


def test_reshape_error_names_the_coordinate():
    mesh = DeviceMesh("m", (2,), ("a",))
    x = DTensorType((6, 4), DType.F32, mesh, (Shard(0),))
    assert "[0, 12)" in reshape_error(x, DTensorType((3, 8), DType.F32, mesh, (Shard(0),)))
    assert reshape_error(x, DTensorType((24,), DType.F32, mesh, (Shard(0),))) is None
    assert reshape_error(x, DTensorType((3, 8), DType.F32, mesh, (R,))) is not None
    assert reshape_error(x.with_placements((Partial(),)),
                         DTensorType((3, 8), DType.F32, mesh, (Partial(),))) is None


# -- nested uneven shards ------------------------------------------------------
def test_nested_uneven_shard_checks_every_piece():
    mesh = DeviceMesh("m", (2, 3), ("a", "b"))
    # 5 rows over 'a' -> pieces of 3 and 2; the piece of 2 cannot be split over 'b' (3)
    with pytest.raises(VerifyError, match=r"%x: dim 0 of size 5 has a piece of size 2 \(after axes "
                                          r"'a'\).*axis 'b' of size 3 \(rule: shard size >= 1"):
        check_placements((5, 4), mesh, (Shard(0), Shard(0)), "value %x")
    check_placements((6, 4), mesh, (Shard(0), Shard(0)), "value %x")  # 3 and 3: fine
    mesh3 = DeviceMesh("m", (2, 2, 2), ("a", "b", "c"))
    # 7 -> 4, 3 -> (2, 2), (2, 1) -> the piece of 1 cannot be split over 'c'
    with pytest.raises(VerifyError, match="piece of size 1"):
        dtensor((7,), DType.F32, mesh3, ["S(0)", "S(0)", "S(0)"], "value %x")
    dtensor((8,), DType.F32, mesh3, ["S(0)", "S(0)", "S(0)"], "value %x")


def test_nested_uneven_redistribute_is_a_verify_error_in_the_cli(tmp_path, capsys):
    path = tmp_path / "n.dir"
    path.write_text('mesh @m = [2, 3] ("a", "b")\n\n'
                    'func @main(%x: f32[5,4]<@m, [R, R]>) -> (f32[5,4]<@m, [S(0), S(0)]>) {\n'
                    '  %y = redistribute(%x) : f32[5,4]<@m, [S(0), S(0)]>\n  return %y\n}\n')
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "%y" in err and "rule: shard size" in err
