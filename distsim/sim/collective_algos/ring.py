"""Ring, direct and chain algorithms: the bandwidth-optimal baselines.

Team order is ring order; a team over several servers runs one ring per
rank of a server (:func:`channel_step`), as NCCL spreads its channels
over the servers' NICs. ``nbytes`` follows
:func:`distsim.sim.collectives.run_collective`: the tensor size for
all-reduce, broadcast, reduce and send/recv, the full (gathered) size for
all-gather, reduce-scatter, gather and scatter, each rank's input for
all-to-all.
"""
from __future__ import annotations

from typing import Sequence

from .schedule import Phase, Schedule, compress, pipeline_chunks, pipelined
from .servers import server_groups


def ring_step(team: Sequence[int], chunk: float):
    """Every rank sends ``chunk`` bytes to its ring successor."""
    p = len(team)
    return tuple((team[i], team[(i + 1) % p], chunk) for i in range(p))


def channel_step(groups: Sequence[Sequence[int]], chunk: float):
    """One step of g rings (NCCL's channels) over n servers of g ranks,
    each ring carrying 1/g of the data, laid out so that every rank is the
    one that leaves its server in exactly one ring: server i is visited
    from its local rank ``c - i`` round to ``c - i - 1`` in ring c, which
    then crosses to the same local rank of server i + 1 (the same rail, its
    own NIC; from the last server back to the first only when g divides n).
    Merged per pair of ranks, local rank k of server i sends
    ``chunk (g-1)/g`` to local rank k+1 of its server and ``chunk / g`` to
    local rank k of the next server (local ``k + n`` of the first, from the
    last): the network carries ``chunk / g`` per rank and step."""
    n, g = len(groups), len(groups[0])
    inner, outer = chunk * (g - 1) / g, chunk / g
    flows = []
    for i, group in enumerate(groups):
        nxt = groups[(i + 1) % n]
        for k, rank in enumerate(group):
            flows.append((rank, group[(k + 1) % g], inner))
            flows.append((rank, nxt[(k + n) % g if i == n - 1 else k], outer))
    return tuple(flows)


def ring_steps(team: Sequence[int], chunk: float, network):
    """A ring step for ``team``: one ring per rank of a server
    (:func:`channel_step`) where the team spans several servers with
    several ranks each, else the team's own ring."""
    groups = server_groups(team, network)
    return ring_step(team, chunk) if groups is None else channel_step(groups, chunk)


def ring_allreduce(team, nbytes, root, network) -> Schedule:
    """Reduce-scatter then all-gather around the ring: 2(p-1) steps of S/p."""
    p = len(team)
    return [Phase(ring_steps(team, nbytes / p, network), 2 * (p - 1))]


def ring_allgather(team, nbytes, root, network) -> Schedule:
    """p-1 steps, each rank forwards one S/p block to its successor."""
    p = len(team)
    return [Phase(ring_steps(team, nbytes / p, network), p - 1)]


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
