"""Device meshes, placements and sharded tensor types (the global view).

A :class:`DeviceMesh` is an N-D grid of device ranks with named axes
(``mesh @m = [2, 4] ("dp", "tp")``); ranks are laid out row-major unless
given. A :class:`DTensorType` is a tensor of a global ``shape`` laid out
over a mesh with one placement per mesh axis:

- ``Shard(d)``: tensor dim ``d`` is split over the axis (``S(d)`` in text);
- ``BlockShard(d, blocks)``: dim ``d`` is several tensors side by side (a
  fused weight's blocks, e.g. query, key and value), each block split over
  the axis: a device holds its part of every block, in block order
  (``S(d|16,8,8)``; Megatron's layout of a fused projection);
- ``Replicate()``: every device of the axis holds the whole (``R``);
- ``Partial(op)``: every device holds a term; the value is their reduction
  (``P(sum)``, ``P(max)``, ...).

Conventions:

- *Uneven shards* follow ``numpy.array_split``: the first ``size % n``
  pieces are one larger (as :func:`distsim.ir.ops_comm.split_sizes`).
- *Nested sharding* (one tensor dim on several axes, e.g. ``[S(0), S(0)]``)
  splits in mesh-axis order: the dim is split over the first such axis, and
  each piece again over the next. The outer axis is the major index of a
  shard; the innermost axis is the last one listed. So a shard's index along
  the dim is ``i_a * n_b + i_b`` for axes ``a`` before ``b`` (even sizes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from math import prod
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import VerifyError
from .comm import REDUCE_OPS
from .ops_comm import split_sizes
from .types import DType, TensorType

AxisRef = Union[int, str]


@dataclass(frozen=True)
class DeviceMesh:
    """An N-D grid of ranks. ``devices`` is the row-major list of ranks
    (default ``0 .. size-1``)."""

    name: str
    shape: Tuple[int, ...]
    axis_names: Tuple[str, ...]
    devices: Tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "axis_names", tuple(str(a) for a in self.axis_names))
        if not self.devices:
            object.__setattr__(self, "devices", tuple(range(prod(self.shape))))
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        where = f"mesh @{self.name}"
        if not self.shape or any(s < 1 for s in self.shape):
            raise VerifyError(f"{where}: shape {self.shape} must list positive axis sizes")
        if len(self.axis_names) != len(self.shape):
            raise VerifyError(f"{where}: {len(self.shape)} axes but {len(self.axis_names)} names")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise VerifyError(f"{where}: axis names {self.axis_names} repeat")
        if len(self.devices) != prod(self.shape):
            raise VerifyError(f"{where}: {len(self.devices)} devices for shape {self.shape}")
        if len(set(self.devices)) != len(self.devices):
            raise VerifyError(f"{where}: devices {self.devices} repeat")

    # -- geometry ------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return len(self.devices)

    def axis_index(self, axis: AxisRef) -> int:
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise VerifyError(f"mesh @{self.name} has no axis '{axis}' "
                                  f"(axes: {', '.join(self.axis_names)})")
            return self.axis_names.index(axis)
        if not 0 <= axis < self.ndim:
            raise VerifyError(f"mesh @{self.name} has no axis {axis} ({self.ndim} axes)")
        return axis

    def axis_size(self, axis: AxisRef) -> int:
        return self.shape[self.axis_index(axis)]

    def all_coords(self) -> Iterator[Tuple[int, ...]]:
        """Every coordinate, row-major (the order of ``devices``)."""
        return product(*(range(s) for s in self.shape))

    def rank_at(self, coords: Sequence[int]) -> int:
        index = 0
        for c, s in zip(coords, self.shape):
            index = index * s + c
        return self.devices[index]

    def coords_of(self, rank: int) -> Tuple[int, ...]:
        try:
            index = self.devices.index(rank)
        except ValueError:
            raise VerifyError(f"rank {rank} is not in mesh @{self.name}") from None
        out = []
        for s in reversed(self.shape):
            index, c = divmod(index, s)
            out.append(c)
        return tuple(reversed(out))

    def groups(self, axes: Sequence[AxisRef]) -> List[Tuple[int, ...]]:
        """The teams along ``axes``: one tuple of ranks per coordinate of the
        other axes, each team in row-major order of ``axes``."""
        idx = [self.axis_index(a) for a in axes]
        others = [i for i in range(self.ndim) if i not in idx]
        teams = []
        for fixed in product(*(range(self.shape[i]) for i in others)):
            team = []
            for moving in product(*(range(self.shape[i]) for i in idx)):
                coords = [0] * self.ndim
                for i, c in zip(others, fixed):
                    coords[i] = c
                for i, c in zip(idx, moving):
                    coords[i] = c
                team.append(self.rank_at(coords))
            teams.append(tuple(team))
        return teams

    def sub_mesh(self, axes: Sequence[AxisRef], at: Optional[Dict[AxisRef, int]] = None,
                 name: Optional[str] = None) -> "DeviceMesh":
        """The mesh of ``axes`` with every other axis fixed at ``at``
        (default coordinate 0)."""
        idx = [self.axis_index(a) for a in axes]
        fixed = {self.axis_index(k): v for k, v in (at or {}).items()}
        for i in range(self.ndim):
            if i not in idx:
                fixed.setdefault(i, 0)
        devices = []
        for moving in product(*(range(self.shape[i]) for i in idx)):
            coords = [0] * self.ndim
            for i, c in fixed.items():
                coords[i] = c
            for i, c in zip(idx, moving):
                coords[i] = c
            devices.append(self.rank_at(coords))
        return DeviceMesh(name or self.name, tuple(self.shape[i] for i in idx),
                          tuple(self.axis_names[i] for i in idx), tuple(devices))

    def slice(self, axis: AxisRef, index: int, name: Optional[str] = None) -> "DeviceMesh":
        """The mesh without ``axis``, at coordinate ``index`` along it."""
        i = self.axis_index(axis)
        if not 0 <= index < self.shape[i]:
            raise VerifyError(f"mesh @{self.name}: index {index} out of axis "
                              f"'{self.axis_names[i]}' "
                              f"of size {self.shape[i]}")
        rest = [a for a in range(self.ndim) if a != i]
        return self.sub_mesh(rest, {i: index}, name)

    # -- text ----------------------------------------------------------
    def print_text(self) -> str:
        names = ", ".join(f'"{a}"' for a in self.axis_names)
        text = f"mesh @{self.name} = [{', '.join(map(str, self.shape))}] ({names})"
        if self.devices != tuple(range(self.size)):
            text += " devices [" + ", ".join(map(str, self.devices)) + "]"
        return text


# -- placements ------------------------------------------------------------
class Placement:
    """How a tensor lies along one mesh axis."""

    def print_text(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Shard(Placement):
    dim: int

    def print_text(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class BlockShard(Shard):
    """Dim ``dim`` made of ``blocks`` (sizes, summing to the dim), each split
    evenly over the axis; a device's piece is its part of every block, in
    block order. Its local length is that of an even ``Shard``; only ops
    that keep the dim's coordinates (and a ``split`` into the blocks) read
    it, and it is never redistributed."""

    blocks: Tuple[int, ...] = ()

    def print_text(self) -> str:
        return f"S({self.dim}|{','.join(map(str, self.blocks))})"


@dataclass(frozen=True)
class Replicate(Placement):
    def print_text(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial(Placement):
    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in REDUCE_OPS:
            raise VerifyError(f"Partial({self.op!r}): reduce op must be one of "
                              f"{', '.join(REDUCE_OPS)}")

    def print_text(self) -> str:
        return f"P({self.op})"


Placements = Tuple[Placement, ...]


def shard_dims(placements: Sequence[Placement], dim: int) -> List[int]:
    """The mesh axes sharding tensor dim ``dim``, outer first."""
    return [i for i, p in enumerate(placements) if isinstance(p, Shard) and p.dim == dim]


@dataclass(frozen=True, init=False)
class DTensorType(TensorType):
    """A global-view tensor of ``shape`` laid out on ``mesh`` with one
    placement per mesh axis. A :class:`TensorType` (``device`` is None), so
    everything that reads ``shape``/``dtype`` works on the global view."""

    mesh: DeviceMesh
    placements: Placements

    def __init__(self, shape: Sequence[int], dtype: DType, mesh: DeviceMesh,
                 placements: Sequence[Placement]) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "device", None)
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "placements", tuple(placements))

    # a key of the sharding layer's remembered answers, hashed many times: the
    # hash is computed once per object (and not pickled: the mesh's names
    # hash differently in another process)
    def __hash__(self) -> int:
        h = self.__dict__.get("_dhash")
        if h is None:
            h = hash((self.shape, self.dtype, self.mesh, self.placements))
            object.__setattr__(self, "_dhash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_dhash"}

    def print_text(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        pl = ", ".join(p.print_text() for p in self.placements)
        return f"{self.dtype.value}[{dims}]<@{self.mesh.name}, [{pl}]>"

    def __str__(self) -> str:
        return self.print_text()

    @property
    def local(self) -> TensorType:
        """The global shape as a plain tensor type (no placement)."""
        return TensorType(self.shape, self.dtype)

    def with_placements(self, placements: Sequence[Placement]) -> "DTensorType":
        return DTensorType(self.shape, self.dtype, self.mesh, placements)

    def local_shape(self, coords: Sequence[int]) -> Tuple[int, ...]:
        return local_shape(self.shape, self.mesh, self.placements, coords)

    def local_type(self, coords: Sequence[int]) -> TensorType:
        return TensorType(self.local_shape(coords), self.dtype, self.mesh.rank_at(coords))

    @property
    def max_local_bytes(self) -> int:
        return max(prod(self.local_shape(c)) for c in self.mesh.all_coords()) * self.dtype.itemsize


def shard_range(size: int, placements: Sequence[Placement], mesh_shape: Sequence[int],
                dim: int, coords: Sequence[int]) -> Tuple[int, int]:
    """(start, length) of the piece of a dim of ``size`` at ``coords``
    under the nested array_split convention."""
    start, length = 0, size
    for axis in shard_dims(placements, dim):
        sizes = split_sizes(length, mesh_shape[axis])
        start += sum(sizes[:coords[axis]])
        length = sizes[coords[axis]]
    return start, length


def local_shape(shape: Sequence[int], mesh: DeviceMesh, placements: Sequence[Placement],
                coords: Sequence[int]) -> Tuple[int, ...]:
    return tuple(shard_range(s, placements, mesh.shape, d, coords)[1] for d, s in enumerate(shape))


def check_placements(shape: Sequence[int], mesh: DeviceMesh, placements: Sequence[Placement],
                     what: str) -> None:
    """Raise VerifyError naming ``what`` (e.g. the value) and the rule
    broken: one placement per mesh axis, dims that exist, every shard at
    least one element."""
    if len(placements) != mesh.ndim:
        raise VerifyError(f"{what}: {len(placements)} placements for the {mesh.ndim} axes of "
                          f"mesh @{mesh.name} (rule: one placement per mesh axis)")
    for axis, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise VerifyError(f"{what}: {p!r} is not a placement (rule: Shard, Replicate, Partial)")
        if isinstance(p, Shard) and not 0 <= p.dim < len(shape):
            raise VerifyError(f"{what}: Shard({p.dim}) on axis '{mesh.axis_names[axis]}' names a "
                              f"dim the rank-{len(shape)} tensor does not have "
                              "(rule: shard dim exists)")
        if isinstance(p, BlockShard):
            n = mesh.shape[axis]
            if sum(p.blocks) != shape[p.dim] or any(b % n for b in p.blocks) \
                    or len(shard_dims(placements, p.dim)) != 1:
                raise VerifyError(f"{what}: {p.print_text()} on axis '{mesh.axis_names[axis]}' "
                                  f"(size {n}) does not fit dim {p.dim} of size {shape[p.dim]} "
                                  "(rule: blocks sum to the dim, each divisible by the axis, "
                                  "one axis per blocked dim)")
    for d, size in enumerate(shape):
        # every piece at every nesting level: with uneven splits the smallest
        # piece of one level is what the next axis must still cover
        lengths = {int(size)}
        outer: List[str] = []
        for axis in shard_dims(placements, d):
            n = mesh.shape[axis]
            smallest = min(lengths)
            if smallest < n:
                piece = (f"dim {d} of size {size}" if not outer else
                         f"dim {d} of size {size} has a piece of size {smallest} (after axes "
                         f"{', '.join(outer)}) that")
                raise VerifyError(f"{what}: {piece} is sharded over axis "
                                  f"'{mesh.axis_names[axis]}' of size {n} (rule: shard size >= 1, "
                                  f"a dim cannot be split over an axis larger than it)")
            lengths = {s for length in lengths for s in split_sizes(length, n)}
            outer.append(f"'{mesh.axis_names[axis]}'")


def dtensor(shape: Sequence[int], dtype: DType, mesh: DeviceMesh,
            placements: Sequence[Union[Placement, str]], what: str = "type") -> DTensorType:
    """A checked DTensorType; placements may be given as text (``"S(0)"``)."""
    pl = tuple(parse_placement(p) if isinstance(p, str) else p for p in placements)
    check_placements(shape, mesh, pl, what)
    return DTensorType(shape, dtype, mesh, pl)


def parse_placement(text: str) -> Placement:
    t = text.replace(" ", "")
    if t in ("R", "Replicate()"):
        return Replicate()
    if t in ("P", "Partial()"):
        return Partial()
    if t.startswith("P(") and t.endswith(")"):
        return Partial(t[2:-1])
    if t.startswith("S(") and t.endswith(")") and t[2:-1].lstrip("-").isdigit():
        return Shard(int(t[2:-1]))
    if t.startswith("S(") and t.endswith(")") and "|" in t:
        dim, _, blocks = t[2:-1].partition("|")
        sizes = blocks.split(",")
        if dim.isdigit() and sizes and all(b.isdigit() for b in sizes):
            return BlockShard(int(dim), tuple(int(b) for b in sizes))
    raise VerifyError(f"bad placement '{text}' (expected S(d), S(d|blocks), R or P(op))")
