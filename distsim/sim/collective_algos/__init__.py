"""Collective algorithms, each a function
``(team, nbytes, root, network) -> Schedule | None`` registered per
collective kind under a name (``ring``, ``tree``, ``hierarchical``,
``nvls``, ``direct``); None means "does not apply to this team" (a
hierarchical algorithm inside one server, NVLS across servers). The first
entry of each kind is the fallback."""
from __future__ import annotations

from typing import Callable, Dict

from ...ir.comm import CollectiveType as C
from . import hierarchical, nvls, ring, tree
from .schedule import Phase, Schedule, compress, parallel, sequential

Algorithm = Callable[..., Schedule]

ALGORITHMS: Dict[C, Dict[str, Algorithm]] = {
    C.ALL_REDUCE: {"ring": ring.ring_allreduce, "tree": tree.double_tree_allreduce,
                   "hierarchical": hierarchical.hierarchical_allreduce,
                   "nvls": nvls.nvls_allreduce},
    C.ALL_GATHER: {"ring": ring.ring_allgather,
                   "hierarchical": hierarchical.hierarchical_allgather},
    C.REDUCE_SCATTER: {"ring": ring.ring_reducescatter,
                       "hierarchical": hierarchical.hierarchical_reducescatter},
    C.ALL_TO_ALL: {"direct": ring.direct_alltoall},
    C.BROADCAST: {"ring": ring.chain_broadcast, "tree": tree.tree_broadcast},
    C.REDUCE: {"ring": ring.chain_reduce, "tree": tree.tree_reduce},
    C.GATHER: {"direct": ring.direct_gather},
    C.SCATTER: {"direct": ring.direct_scatter},
    C.SEND_RECV: {"direct": ring.sendrecv},
}

__all__ = ["ALGORITHMS", "Algorithm", "Phase", "Schedule", "compress", "parallel", "sequential"]
