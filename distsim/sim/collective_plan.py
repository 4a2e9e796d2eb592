"""A collective's algorithm names and team checks, and its schedule under a
named algorithm.

The layer under every way of timing a collective: :mod:`.solo_time` (a
collective run alone, and ``auto``'s choice by that time) and
:mod:`.collectives` (a collective run on a shared network) both plan
through it. ``auto`` is not resolved here: its choice needs the times.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..errors import ConfigError, TopologyError
from ..ir.comm import CollectiveType
from .collective_algos import ALGORITHMS, Schedule
from .network import Network
from .protocols import choose_protocol
from .route_table import route_table

ROOTED = (CollectiveType.BROADCAST, CollectiveType.REDUCE, CollectiveType.GATHER,
          CollectiveType.SCATTER)


def algorithms_for(kind: CollectiveType) -> Tuple[str, ...]:
    """The algorithm names ``kind`` accepts (besides ``auto``)."""
    return tuple(ALGORITHMS[kind])


#: Every algorithm name some collective kind knows, and ``auto``.
KNOWN_ALGORITHMS: Tuple[str, ...] = tuple(sorted(
    {"auto"} | {name for table in ALGORITHMS.values() for name in table}))


def check_algorithm_name(name: object, where: str = "--collective-algo") -> str:
    """``name`` when it is ``auto`` or an algorithm of at least one kind;
    else a ConfigError naming ``where`` (checked once, before a run)."""
    if not isinstance(name, str) or name not in KNOWN_ALGORITHMS:
        raise ConfigError(f"{where}: unknown algorithm {name!r} "
                          f"(known: {', '.join(KNOWN_ALGORITHMS)})")
    return name


def resolve_algorithm(kind: CollectiveType, requested: str, per_run: bool = False) -> str:
    """The algorithm a ``kind`` collective runs when ``requested`` is asked.

    An op's own algorithm (``per_run=False``) is strict: a name ``kind``
    lacks is a ConfigError. The run's default (``--collective-algo``,
    ``per_run=True``) applies to every collective of a program, so a name
    valid for some kind but not this one (``ring`` for a send/recv, ``tree``
    for an all-gather) means ``auto`` here; the trace records the algorithm
    actually used. A name no kind knows is an error either way."""
    table = ALGORITHMS[kind]
    if requested == "auto" or requested in table:
        return requested
    if per_run and requested in KNOWN_ALGORITHMS:
        return "auto"
    raise ConfigError(f"{kind.value}: unknown algorithm {requested!r} "
                      f"(known: auto, {', '.join(table)})")


def check_team(network: Network, kind: CollectiveType, ranks: Sequence[int],
               root: Optional[int]) -> None:
    """One-line errors for a team the topology cannot run; a team found
    good is remembered per topology (:attr:`Network.team_plans`), only with
    plain int ranks (a bool rank equals and hashes as an int, and an
    unhashable one is for the check to name)."""
    plain = all(type(r) is int for r in ranks) and (root is None or type(root) is int)
    key = ("checked", kind, tuple(ranks), root)
    if plain and key in network.team_plans:
        return
    _check_team(network.topology, kind, ranks, root)
    if plain:
        network.team_plans[key] = True


def _check_team(topo, kind: CollectiveType, ranks: Sequence[int], root: Optional[int]) -> None:
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < topo.num_devices:
            raise TopologyError(f"{kind.value}: team rank {r!r} is not a device of topology "
                                f"'{topo.name}' (ranks 0..{topo.num_devices - 1})")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{kind.value}: team {tuple(ranks)} names a rank twice")
    if kind in ROOTED and root not in ranks:
        raise ConfigError(f"{kind.value}: root {root!r} is not in the team {tuple(ranks)}")
    if kind is CollectiveType.SEND_RECV and len(ranks) != 2:
        raise ConfigError(f"sendrecv: the team must be (sender, receiver), got {tuple(ranks)}")


def moves_data(network: Network, kind: CollectiveType, ranks: Tuple[int, ...], nbytes: float,
               root: Optional[int], algorithm: str) -> bool:
    """Check a collective (its team, bytes and algorithm name; errors are
    one line) and say whether it puts anything on the network: one rank
    or zero bytes take no time, whatever the algorithm."""
    check_team(network, kind, ranks, root)
    if nbytes < 0:
        raise ConfigError(f"{kind.value}: bytes must be >= 0, got {nbytes!r}")
    resolve_algorithm(kind, algorithm)      # a bad name is an error even for no data
    return len(ranks) >= 2 and nbytes != 0


def named_schedule(network: Network, kind: CollectiveType, ranks: Tuple[int, ...],
                   nbytes: float, root: Optional[int], algorithm: str
                   ) -> Tuple[str, Schedule]:
    """(algorithm name used, schedule) of a checked collective under the
    named ``algorithm`` (not ``auto``). An algorithm that does not apply
    to the team falls back to the kind's first one."""
    schedule = algorithm_schedule(network, kind, algorithm, ranks, nbytes, root)
    if schedule is None:
        algorithm = next(iter(ALGORITHMS[kind]))
        schedule = algorithm_schedule(network, kind, algorithm, ranks, nbytes, root)
    return algorithm, schedule


def algorithm_schedule(network: Network, kind: CollectiveType, algorithm: str,
                       ranks: Tuple[int, ...], nbytes: float, root: Optional[int]
                       ) -> Optional[Schedule]:
    """The schedule of ``algorithm`` for a checked collective under the
    protocol NCCL's tuner would pick (:func:`.protocols.choose_protocol`,
    kept in :attr:`RouteTable.protocol_choices`), or None where the
    algorithm does not apply to the team."""
    schedule = ALGORITHMS[kind][algorithm](ranks, nbytes, root, network)
    if schedule is None:
        return None
    known = route_table(network.topology).protocol_choices
    key = (kind, tuple(ranks), float(nbytes), root, algorithm)
    protocol, schedule = choose_protocol(network, kind, algorithm, schedule, known.get(key))
    if protocol is not None:
        known[key] = protocol
    return schedule


def protocol_used(topology, kind: CollectiveType, ranks: Sequence[int], nbytes: float,
                  root: Optional[int], algorithm: str) -> Optional[str]:
    """The protocol a collective planned on ``topology`` ran with under
    ``algorithm`` (None: planned without protocols, or not yet planned)."""
    key = (kind, tuple(ranks), float(nbytes), root, algorithm)
    return route_table(topology).protocol_choices.get(key)
