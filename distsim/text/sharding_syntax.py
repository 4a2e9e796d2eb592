"""Text syntax of meshes and sharded tensor types.

    mesh @m = [2, 4] ("dp", "tp")                    # ranks 0..7, row-major
    mesh @pp1 = [2] ("tp") devices [4, 5]            # explicit ranks
    %x: f32[8,16]<@m, [S(0), R]>                     # one placement per mesh axis
    %y: f32[8,16]<@m, [P(sum), S(1)]>

Placements: ``S(d)`` (shard tensor dim d), ``R`` (replicate), ``P(op)``
(partial; ``P`` alone is ``P(sum)``). Meshes are declared before use.
"""
from __future__ import annotations

from typing import List, Mapping, Optional

from ..errors import VerifyError
from ..ir.core import Module
from ..ir.mesh import DeviceMesh, DTensorType, Partial, Placement, Replicate, Shard
from ..ir.types import TensorType
from .parser import Parser, register_declaration, register_type_suffix


def parse_placement(p: Parser) -> Placement:
    tok = p.expect_kind("ident", "a placement S(d), R or P(op)")
    if tok.text == "R":
        return Replicate()
    if tok.text == "S":
        p.expect("(")
        dim = p.parse_int("a tensor dim")
        p.expect(")")
        return Shard(dim)
    if tok.text == "P":
        if not p.accept("("):
            return Partial()
        op = p.expect_kind("ident", "a reduce op such as sum")
        p.expect(")")
        try:
            return Partial(op.text)
        except VerifyError as e:
            raise p.error(str(e), op) from None
    raise p.error(f"expected a placement S(d), R or P(op), found {tok.text!r}", tok)


def parse_placements(p: Parser) -> List[Placement]:
    p.expect("[")
    out: List[Placement] = []
    if p.accept("]"):
        return out
    while True:
        out.append(parse_placement(p))
        if p.accept("]"):
            return out
        p.expect(",")


def _meshes(p: Parser, meshes: Optional[Mapping[str, DeviceMesh]]) -> Mapping[str, DeviceMesh]:
    if meshes is not None:
        return meshes
    return p.module.meshes if p.module is not None else {}


def parse_dtensor_suffix(p: Parser, base: TensorType,
                         meshes: Optional[Mapping[str, DeviceMesh]] = None) -> DTensorType:
    start = p.expect("<")
    if base.device is not None:
        raise p.error("a sharded type has no @device (its mesh places it)", start)
    tok = p.expect_kind("symbol", "a mesh name such as @m")
    known = _meshes(p, meshes)
    mesh = known.get(tok.text[1:])
    if mesh is None:
        raise p.error(f"unknown mesh {tok.text} (declare it first: mesh {tok.text} = [2] (\"x\"))",
                      tok)
    p.expect(",")
    placements = parse_placements(p)
    p.expect(">")
    # placements are checked against the shape by the sharding verifier,
    # whose errors name the value (the parser builds what is written)
    return DTensorType(base.shape, base.dtype, mesh, placements)


def parse_mesh_declaration(p: Parser, module: Module) -> None:
    p.expect("mesh")
    tok = p.expect_kind("symbol", "a mesh name such as @m")
    name = tok.text[1:]
    if name in module.meshes:
        raise p.error(f"mesh @{name} declared twice", tok)
    p.expect("=")
    shape = _int_list(p, "an axis size")
    p.expect("(")
    names: List[str] = []
    if not p.accept(")"):
        while True:
            names.append(p.parse_attr_value() if p.peek.kind == "string"
                         else p.expect_kind("string", 'an axis name such as "dp"').text)
            if p.accept(")"):
                break
            p.expect(",")
    devices: List[int] = []
    if p.peek.kind == "ident" and p.peek.text == "devices":
        p.next()
        devices = _int_list(p, "a device rank")
    try:
        module.meshes[name] = DeviceMesh(name, tuple(shape), tuple(names), tuple(devices))
    except VerifyError as e:
        raise p.error(str(e), tok) from None


def _int_list(p: Parser, what: str) -> List[int]:
    p.expect("[")
    out: List[int] = []
    if p.accept("]"):
        return out
    while True:
        out.append(p.parse_int(what))
        if p.accept("]"):
            return out
        p.expect(",")


def parse_dtensor_type(text: str, meshes: Mapping[str, DeviceMesh]) -> TensorType:
    """Parse one (possibly sharded) type against the given meshes."""
    p = Parser(text)
    p.module = Module(meshes=dict(meshes))
    t = p.parse_type()
    if p.peek.kind != "eof":
        raise p.error(f"unexpected {p.describe(p.peek)} after type")
    return t


def print_placements(placements) -> str:
    return "[" + ", ".join(pl.print_text() for pl in placements) + "]"


register_type_suffix("<", parse_dtensor_suffix)
register_declaration("mesh", parse_mesh_declaration)
