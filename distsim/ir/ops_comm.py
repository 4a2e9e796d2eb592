"""Shape rules of the communication ops ``comm.<kind>``.

Inputs and outputs follow :func:`distsim.ir.comm.io_ranks`: the i-th input
lives on the i-th providing rank, the i-th output on the i-th receiving
rank. Uneven splits (a dim not divisible by the team) follow
``numpy.array_split``: the first ``d % n`` pieces are one larger.
"""
from __future__ import annotations

from typing import List, Sequence

from .comm import REDUCE_OPS, CollectiveType, io_ranks
from .registry import REQUIRED, OpSpec, ShapeError, register
from .types import TensorType


def split_sizes(total: int, parts: int) -> List[int]:
    """Sizes of ``numpy.array_split(range(total), parts)``."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _check_dim(t: TensorType, dim: int, what: str) -> int:
    if not -t.rank <= dim < t.rank:
        raise ShapeError(f"{what} {dim} out of range for shape {t.shape}")
    return dim % t.rank


def _team(kind: CollectiveType, types: Sequence[TensorType], attrs):
    ranks = tuple(attrs["ranks"])
    if len(ranks) < 1 or len(set(ranks)) != len(ranks):
        raise ShapeError(f"team {ranks} must be non-empty with distinct ranks")
    root = attrs.get("root")
    if kind in (CollectiveType.BROADCAST, CollectiveType.SCATTER, CollectiveType.REDUCE,
                CollectiveType.GATHER):
        if root not in ranks:
            raise ShapeError(f"root {root} is not in team {ranks}")
    if kind is CollectiveType.SEND_RECV and len(ranks) != 2:
        raise ShapeError(f"sendrecv needs ranks [src, dst], got {ranks}")
    if "reduce_op" in attrs and attrs["reduce_op"] not in REDUCE_OPS:
        raise ShapeError(f"reduce_op '{attrs['reduce_op']}' is not one of {', '.join(REDUCE_OPS)}")
    in_ranks, out_ranks = io_ranks(kind, ranks, root)
    present = attrs.get("present")
    if present is not None:
        # A reduced program: only the ``present`` members' data is in it;
        # the others mirror a present member (see distsim.sim.symmetry).
        if not set(present) <= set(ranks) or not present:
            raise ShapeError(f"present {tuple(present)} must be a non-empty subset of the team "
                             f"{ranks}")
        in_ranks = tuple(r for r in in_ranks if r in present)
        out_ranks = tuple(r for r in out_ranks if r in present)
    if len(types) != len(in_ranks):
        raise ShapeError(f"expects {len(in_ranks)} inputs (one per rank of {in_ranks}), got "
                         f"{len(types)}")
    for t, r in zip(types, in_ranks):
        if t.device != r:
            raise ShapeError(f"input on device {t.device} where team rank {r} was expected")
    return ranks, in_ranks, out_ranks


def _all_same(types: Sequence[TensorType]) -> TensorType:
    first = types[0]
    for t in types[1:]:
        if (t.shape, t.dtype) != (first.shape, first.dtype):
            raise ShapeError(f"team inputs differ: {first.shape} {first.dtype} vs {t.shape} "
                             f"{t.dtype}")
    return first


def _make(kind: CollectiveType):
    def rule(types: Sequence[TensorType], attrs) -> List[TensorType]:
        ranks, in_ranks, out_ranks = _team(kind, types, attrs)
        n = len(ranks)
        if kind in (CollectiveType.ALL_REDUCE, CollectiveType.REDUCE):
            t = _all_same(types)
            return [t.with_device(r) for r in out_ranks]
        if kind in (CollectiveType.BROADCAST, CollectiveType.SEND_RECV):
            return [types[0].with_device(r) for r in out_ranks]
        if kind in (CollectiveType.ALL_GATHER, CollectiveType.GATHER):
            dim = _check_dim(types[0], attrs["dim"], "dim")
            first = types[0]
            for t in types[1:]:
                if (t.rank != first.rank or t.dtype != first.dtype or
                        any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                            if i != dim)):
                    raise ShapeError(f"team inputs differ outside dim {dim}: {first.shape} vs "
                                     f"{t.shape}")
            shape = list(first.shape)
            if attrs.get("present") is not None:  # absent members hold equal pieces
                shape[dim] = first.shape[dim] * n
            else:
                shape[dim] = sum(t.shape[dim] for t in types)
            return [TensorType(tuple(shape), first.dtype, r) for r in out_ranks]
        if kind in (CollectiveType.REDUCE_SCATTER, CollectiveType.SCATTER):
            t = _all_same(types)
            dim = _check_dim(t, attrs["dim"], "dim")
            if t.shape[dim] < n:
                raise ShapeError(f"dim {dim} of size {t.shape[dim]} cannot be split over {n} ranks")
            sizes = dict(zip(ranks, split_sizes(t.shape[dim], n)))
            out = []
            for r in out_ranks:
                size = sizes[r]
                shape = list(t.shape)
                shape[dim] = size
                out.append(TensorType(tuple(shape), t.dtype, r))
            return out
        if kind is CollectiveType.ALL_TO_ALL:
            t = _all_same(types)
            sdim = _check_dim(t, attrs["split_dim"], "split_dim")
            cdim = _check_dim(t, attrs["concat_dim"], "concat_dim")
            if t.shape[sdim] % n:
                raise ShapeError(f"split_dim {sdim} of size {t.shape[sdim]} is not divisible by "
                                 f"{n} ranks")
            shape = list(t.shape)
            shape[sdim] //= n
            shape[cdim] *= n
            return [TensorType(tuple(shape), t.dtype, r) for r in out_ranks]
        raise ShapeError(f"unknown collective {kind}")  # pragma: no cover
    return rule


_ATTRS = {
    CollectiveType.ALL_REDUCE: {"ranks": REQUIRED, "reduce_op": "sum"},
    CollectiveType.REDUCE: {"ranks": REQUIRED, "root": REQUIRED, "reduce_op": "sum"},
    CollectiveType.BROADCAST: {"ranks": REQUIRED, "root": REQUIRED},
    CollectiveType.SEND_RECV: {"ranks": REQUIRED},
    CollectiveType.ALL_GATHER: {"ranks": REQUIRED, "dim": 0},
    CollectiveType.GATHER: {"ranks": REQUIRED, "root": REQUIRED, "dim": 0},
    CollectiveType.REDUCE_SCATTER: {"ranks": REQUIRED, "dim": 0, "reduce_op": "sum"},
    CollectiveType.SCATTER: {"ranks": REQUIRED, "root": REQUIRED, "dim": 0},
    CollectiveType.ALL_TO_ALL: {"ranks": REQUIRED, "split_dim": 0, "concat_dim": 0},
}

for _kind, _attrs in _ATTRS.items():
    # Every collective may also carry its symbolic team (mesh name and axes),
    # a chosen algorithm, and in a reduced program the members present.
    register(OpSpec(_kind.op_type, None, _make(_kind),
                    dict(_attrs, mesh=None, axes=None, algorithm=None, present=None),
                    is_communication=True))
