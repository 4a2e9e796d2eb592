"""NVLink SHARP (NVLS) all-reduce: the NVSwitch adds and multicasts.

On NVSwitch systems that support it (H100 and later) NCCL's NVLS
all-reduce has each GPU read its 1/p shard of the sum from the switch,
which fetches and adds it from all p GPUs (``multimem.ld_reduce``), and
write the result back once for the switch to copy to every GPU
(``multimem.st``). Each GPU's link to the switch carries S + S/p each way,
against 2(p-1)/p S for a ring: the links carry the same bytes as one step
of ring-neighbour flows of S (1 + 1/p) on a switch, which is how it is
scheduled here. It applies to a team inside one server of a topology whose
``collectives:`` block describes ``nvls``; its cost figures are that
block's (:mod:`distsim.sim.protocols`).
"""
from __future__ import annotations

from .ring import ring_step
from .schedule import Phase, Schedule


def nvls_allreduce(team, nbytes, root, network) -> Schedule | None:
    spec = network.topology.collectives
    if spec is None or spec.nvls is None:
        return None
    topo = network.topology
    if len({topo.node_of(r) for r in team}) != 1:
        return None
    p = len(team)
    return [Phase(ring_step(team, nbytes * (p + 1) / p), 1)]
