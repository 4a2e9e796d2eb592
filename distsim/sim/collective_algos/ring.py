"""Ring, direct and chain algorithms: the bandwidth-optimal baselines.

Team order is ring order. ``nbytes`` follows
:func:`distsim.sim.collectives.run_collective`: the tensor size for
all-reduce, broadcast, reduce and send/recv, the full (gathered) size for
all-gather, reduce-scatter, gather and scatter, each rank's input for
all-to-all.
"""
from __future__ import annotations

from typing import Sequence

from .schedule import Phase, Schedule, compress, pipeline_chunks, pipelined


def ring_step(team: Sequence[int], chunk: float):
    """Every rank sends ``chunk`` bytes to its ring successor."""
    p = len(team)
    return tuple((team[i], team[(i + 1) % p], chunk) for i in range(p))


def ring_allreduce(team, nbytes, root, network) -> Schedule:
    """Reduce-scatter then all-gather around the ring: 2(p-1) steps of S/p."""
    p = len(team)
    return [Phase(ring_step(team, nbytes / p), 2 * (p - 1))]


def ring_allgather(team, nbytes, root, network) -> Schedule:
    """p-1 steps, each rank forwards one S/p block to its successor."""
    p = len(team)
    return [Phase(ring_step(team, nbytes / p), p - 1)]


ring_reducescatter = ring_allgather


def direct_alltoall(team, nbytes, root, network) -> Schedule:
    """Pairwise exchange: in step k (1..p-1) rank i sends its S/p block
    for rank i+k."""
    p = len(team)
    return compress(tuple((team[i], team[(i + k) % p], nbytes / p) for i in range(p))
                    for k in range(1, p))


def direct_gather(team, nbytes, root, network) -> Schedule:
    """Every rank sends its S/p block to the root at once."""
    p = len(team)
    return compress([tuple((r, root, nbytes / p) for r in team if r != root)])


def direct_scatter(team, nbytes, root, network) -> Schedule:
    """The root sends each rank its S/p block at once."""
    p = len(team)
    return compress([tuple((root, r, nbytes / p) for r in team if r != root)])


def sendrecv(team, nbytes, root, network) -> Schedule:
    """One flow from the first team member to the second."""
    return compress([((team[0], team[1], nbytes),)])


def chain_order(team: Sequence[int], root: int) -> list:
    """The team as a chain starting at ``root`` (ring order otherwise)."""
    i = list(team).index(root)
    return list(team[i:]) + list(team[:i])


def _pipelined_chain(chain: Sequence[int], nbytes: float, network) -> Schedule:
    """``c`` chunks flow down the chain; in step j hop i carries chunk j-i.
    Uncontended it takes ``(c + p - 2) * (alpha + S / (c B))``."""
    p = len(chain)
    hops = [(chain[i], chain[i + 1]) for i in range(p - 1)]
    alpha = max(network.route_info(a, b)[1] for a, b in hops)
    bw = min(min(network.route_info(a, b)[2] or (float("inf"),)) for a, b in hops)
    c = pipeline_chunks(p, nbytes, alpha, bw)
    return pipelined([(i, ((a, b, nbytes / c),)) for i, (a, b) in enumerate(hops)], c)


def chain_broadcast(team, nbytes, root, network) -> Schedule:
    return _pipelined_chain(chain_order(team, root), nbytes, network)


def chain_reduce(team, nbytes, root, network) -> Schedule:
    """The chain reversed: partial sums flow towards the root."""
    return _pipelined_chain(chain_order(team, root)[::-1], nbytes, network)
