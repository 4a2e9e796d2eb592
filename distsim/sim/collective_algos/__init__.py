"""Collective algorithms, each a function
``(team, nbytes, root, network) -> Schedule`` registered per collective
kind under a name (``ring``, ``tree``, ``hierarchical``, ``direct``, ...)."""
from __future__ import annotations

from typing import Callable, Dict, Tuple

from ...ir.comm import CollectiveType as C
from . import ring
from .schedule import Phase, Schedule, compress, parallel, sequential

Algorithm = Callable[..., Schedule]

ALGORITHMS: Dict[C, Dict[str, Algorithm]] = {
    C.ALL_REDUCE: {"ring": ring.ring_allreduce},
    C.ALL_GATHER: {"ring": ring.ring_allgather},
    C.REDUCE_SCATTER: {"ring": ring.ring_reducescatter},
    C.ALL_TO_ALL: {"direct": ring.direct_alltoall},
    C.BROADCAST: {"ring": ring.chain_broadcast},
    C.REDUCE: {"ring": ring.chain_reduce},
    C.GATHER: {"direct": ring.direct_gather},
    C.SCATTER: {"direct": ring.direct_scatter},
    C.SEND_RECV: {"direct": ring.sendrecv},
}

__all__ = ["ALGORITHMS", "Algorithm", "Phase", "Schedule", "compress", "parallel", "sequential"]
