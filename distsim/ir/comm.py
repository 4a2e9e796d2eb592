"""Communication: the collective kinds and the attributes of a
``comm.<kind>`` op.

A communication op in the local view takes one input per participating rank
that contributes data and yields one output per rank that receives data (see
:func:`io_ranks`). Its team is the tuple ``ranks``; ``root`` names a rank of
the team for rooted collectives; ``reduce_op`` the reduction; ``dim`` the
tensor dimension gathered or scattered (``split_dim``/``concat_dim`` for
all-to-all).
"""
from __future__ import annotations

import enum
from typing import Tuple

from .core import Op


class CollectiveType(enum.Enum):
    ALL_GATHER = "allgather"
    ALL_REDUCE = "allreduce"
    REDUCE_SCATTER = "reducescatter"
    ALL_TO_ALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    SEND_RECV = "sendrecv"

    # Members are singletons compared by identity: hash them by identity in
    # C (Enum's own __hash__ is a Python call, paid on every lookup of a
    # plan keyed by its kind: hundreds of thousands a large simulation).
    __hash__ = object.__hash__

    @property
    def op_type(self) -> str:
        return COMM_PREFIX + self.value

    @classmethod
    def from_op_type(cls, op_type: str) -> "CollectiveType":
        return cls(op_type[len(COMM_PREFIX):])


COMM_PREFIX = "comm."
#: the op type of a send/recv (its ops, and the simulator's records of them)
SEND_RECV_OP = CollectiveType.SEND_RECV.op_type
REDUCE_OPS = ("sum", "avg", "max", "min", "prod")


def is_communication(op: Op) -> bool:
    return op.op_type.startswith(COMM_PREFIX)


def is_point_to_point(op: Op) -> bool:
    """Whether ``op`` is a SendRecv (the simulator runs it on a queue per
    pair of ranks, not on the collectives' stream)."""
    return op.op_type == SEND_RECV_OP


def collective_of(op: Op) -> CollectiveType:
    return CollectiveType.from_op_type(op.op_type)


def team(op: Op) -> Tuple[int, ...]:
    """The ranks taking part, in team order."""
    return tuple(op.attrs["ranks"])


def members(op: Op) -> Tuple[int, ...]:
    """The ranks whose streams take part in the op: the team, or in a reduced
    program only the members present (the others mirror them)."""
    present = op.attrs.get("present")
    return tuple(present) if present is not None else tuple(op.attrs["ranks"])


def io_ranks(kind: CollectiveType, ranks: Tuple[int, ...], root: int | None
             ) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(ranks that provide an input, ranks that receive an output), in order."""
    if kind in (CollectiveType.BROADCAST, CollectiveType.SCATTER):
        return (root,), ranks
    if kind in (CollectiveType.REDUCE, CollectiveType.GATHER):
        return ranks, (root,)
    if kind is CollectiveType.SEND_RECV:
        return (ranks[0],), (ranks[1],)
    return ranks, ranks
