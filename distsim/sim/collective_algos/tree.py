"""Tree algorithms: fewer latency steps than a ring, for small messages.

Trees are heap-shaped binary trees over team positions (position i has
children 2i+1 and 2i+2; depth ``H = floor(log2 p)``). Data moves in
``c`` pipelined chunks, one hop per step; a step ends when its slowest
flow is delivered. Times below are on an uncontended switch (per-step
latency alpha, link bandwidth B), where a step in which some rank sends or
receives k equal flows takes ``alpha + k * chunk / B``:

- broadcast: a node at depth d forwards chunk k to its children in step
  k + d (``c + H - 1`` steps). A parent feeds both children at once, so a
  step takes ``alpha + 2S/(cB)``, except where every active parent has one
  child: when p is a power of two the deepest level is one rank and the
  last step takes ``alpha + S/(cB)`` (for p = 2, every step does). So
  ``(c + H - 1)(alpha + 2S/(cB))``, less ``S/(cB)`` per single step;
- reduce: a node at depth d sends its partial sum of chunk k to its parent
  in step k + H - d, after all its children did: the mirror image (the
  first step is the single one);
- all-reduce (double binary tree, as NCCL): two trees each carry half the
  data, the second over the team reversed so that the inner nodes of one
  are leaves of the other; each reduces to its root and broadcasts back,
  pipelined (``c + 2H - 1`` steps, about ``2 H alpha`` for small messages).
  A step takes ``alpha + L S/(2cB)`` with L the most flows one rank sends or
  receives in it over both trees: up to 4 mid-pipeline (an inner rank of
  one tree, a leaf of the other), fewer while the pipeline fills and drains.

``c`` comes from :func:`.schedule.pipeline_chunks` for the busiest step
(2 flows a rank for broadcast and reduce, 4 for all-reduce).
tests/sim/test_collectives_validation.py checks these times to 1%.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import List, Sequence, Tuple

from .ring import chain_order
from .schedule import FlowSpec, Schedule, parallel, pipeline_chunks, pipelined


def depth(i: int) -> int:
    return int(math.log2(i + 1))


def tree_edges(order: Sequence[int]) -> Tuple[Tuple[int, int, int], ...]:
    """(parent rank, child rank, child depth) of the heap tree over ``order``."""
    return _tree_edges(tuple(order))


@lru_cache(maxsize=512)
def _tree_edges(order: Tuple[int, ...]) -> Tuple[Tuple[int, int, int], ...]:
    # a team's trees are built again for every size it is timed at (a
    # sweep times each team at dozens of sizes)
    return tuple((order[(i - 1) // 2], order[i], depth(i)) for i in range(1, len(order)))


def _chunks(order: Sequence[int], nbytes: float, hops: int, network, share: int) -> int:
    """Pipeline chunks for ``hops`` steps of depth where ``share`` flows
    cross the busiest link of a step. The tree's longest path latency and
    narrowest link, which every size needs, are kept per topology and tree
    (:attr:`~distsim.sim.network.Network.team_plans`)."""
    order = tuple(order)
    key = ("tree bounds", order)
    hit = network.team_plans.get(key)
    if hit is None:
        pairs = [(a, b) for a, b, _ in tree_edges(order)]
        alpha = max(network.route_info(a, b)[1] for a, b in pairs)
        bw = min(min(network.route_info(a, b)[2] or (math.inf,)) for a, b in pairs)
        hit = network.team_plans[key] = (alpha, bw)
    alpha, bw = hit
    return pipeline_chunks(hops + 1, nbytes, alpha, bw / share)


def _down(order, nbytes, c, start) -> List[Tuple[int, Sequence[FlowSpec]]]:
    return [(start + d - 1, ((parent, child, nbytes / c),))
            for parent, child, d in tree_edges(order)]


def _up(order, nbytes, c, start) -> List[Tuple[int, Sequence[FlowSpec]]]:
    height = depth(len(order) - 1)
    return [(start + height - d, ((child, parent, nbytes / c),))
            for parent, child, d in tree_edges(order)]


def tree_broadcast(team, nbytes, root, network) -> Schedule:
    order = chain_order(team, root)
    c = _chunks(order, nbytes, depth(len(order) - 1), network, 2)
    return pipelined(_down(order, nbytes, c, 0), c)


def tree_reduce(team, nbytes, root, network) -> Schedule:
    order = chain_order(team, root)
    c = _chunks(order, nbytes, depth(len(order) - 1), network, 2)
    return pipelined(_up(order, nbytes, c, 0), c)


def double_tree_allreduce(team, nbytes, root, network) -> Schedule:
    orders = (list(team), list(reversed(team)))
    height = depth(len(team) - 1)
    c = _chunks(orders[0], nbytes / 2, 2 * height, network, 4)
    return parallel([pipelined(_up(o, nbytes / 2, c, 0) + _down(o, nbytes / 2, c, height), c)
                     for o in orders])
