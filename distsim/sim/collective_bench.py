"""The nccl-tests view: one collective alone on a topology, timed.

:func:`benchmark_collective` simulates a single collective on an idle
network and reports its time, algorithm bandwidth ``algbw = S / t`` and bus
bandwidth ``busbw = algbw * factor`` with the nccl-tests factors
(:data:`BUS_FACTORS`), so that numbers compare across team sizes and with
published nccl-tests results. :func:`sweep_collective` does it over sizes.
Sizes are in bytes; :func:`parse_bytes` reads ``4096``, ``1KB`` (1e3),
``1KiB`` (1024), ``1.5GB``, ``1e9``.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import simpy

from ..errors import ConfigError, quoted_short
from ..ir.comm import CollectiveType
from ..topology import Topology, load_topology
from ..topology.builders import MAX_DEVICES
from .collective_plan import protocol_used
from .collectives import ROOTED, check_team, run_collective
from .network import Network

BUS_FACTORS: Dict[CollectiveType, Callable[[int], float]] = {
    CollectiveType.ALL_REDUCE: lambda p: 2 * (p - 1) / p,
    CollectiveType.ALL_GATHER: lambda p: (p - 1) / p,
    CollectiveType.REDUCE_SCATTER: lambda p: (p - 1) / p,
    CollectiveType.ALL_TO_ALL: lambda p: (p - 1) / p,
    CollectiveType.GATHER: lambda p: (p - 1) / p,
    CollectiveType.SCATTER: lambda p: (p - 1) / p,
    CollectiveType.BROADCAST: lambda p: 1.0,
    CollectiveType.REDUCE: lambda p: 1.0,
    CollectiveType.SEND_RECV: lambda p: 1.0,
}

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


#: The most sizes a sweep (:func:`parse_sweep`) lists: each is a simulation,
#: and a factor just above 1 would otherwise ask for billions of them.
MAX_SWEEP_SIZES = 1000


def parse_bytes(text: Union[str, int, float]) -> int:
    """``"1GB"`` -> 10**9, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096; a
    fraction of a byte rounds to the nearest (``"1.5KB"`` is 1500), but a
    size between 0 and 1 byte is an error rather than a silent 0."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ConfigError(f"bad size {text!r} (expected e.g. 4096, 64KB, 1.5GB, 1GiB)")
        value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value):    # 1e400 reads as infinity
        raise ConfigError(f"bad size {text!r}: must be a finite number of bytes")
    if value < 0:
        raise ConfigError(f"bad size {text!r}: must be >= 0 bytes")
    if 0 < value < 1:    # would round to a 0-byte collective that takes no time
        raise ConfigError(f"bad size {text!r}: less than one byte (0 is allowed)")
    return int(round(value))


def parse_sweep(text: str) -> List[int]:
    """``"1KB:4GB"`` (doubling) or ``"1KB:4GB:4"`` (times 4) -> sizes, at
    most :data:`MAX_SWEEP_SIZES` of them; sizes that round to the same
    byte count are listed once."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"--sweep-bytes {text!r}: expected MIN:MAX or MIN:MAX:FACTOR")
    try:
        lo, hi = parse_bytes(parts[0]), parse_bytes(parts[1])
    except ConfigError as e:
        raise ConfigError(f"--sweep-bytes {text!r}: {e}") from None
    factor = 2.0
    if len(parts) == 3:
        factor = _number(parts[2])
        # NaN and infinity compare false / true where a bare `<= 1` would let them through
        if factor is None or not 1 < factor < math.inf:
            raise ConfigError(f"--sweep-bytes {text!r}: the factor must be a finite number > 1, "
                              f"got {parts[2]!r}")
    if lo < 1:
        raise ConfigError(f"--sweep-bytes {text!r}: MIN must be at least 1 byte")
    if hi < lo:
        raise ConfigError(f"--sweep-bytes {text!r}: MIN {lo} is larger than MAX {hi}")
    # how many steps of `factor` fit between lo and hi, counted before listing them
    steps = math.floor(math.log(hi * (1 + 1e-9) / lo) / math.log(factor))
    if steps + 1 > MAX_SWEEP_SIZES:
        raise ConfigError(f"--sweep-bytes {text!r}: {steps + 1:,} sizes, more than "
                          f"{MAX_SWEEP_SIZES:,}; use a larger factor or a narrower range")
    sizes: List[int] = []
    s = float(lo)
    while s <= hi * (1 + 1e-9):
        size = int(round(s))
        if not sizes or size != sizes[-1]:
            sizes.append(size)
        s *= factor
    return sizes


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def parse_ranks(text: str) -> Tuple[int, ...]:
    """``"0-7"``, ``"0,2,4"``, ``"0-3,8-11"`` -> ranks in that order.

    A rank past :data:`~distsim.topology.builders.MAX_DEVICES` - 1, or a
    list of more ranks than that, is an error before any list is built
    (``0-99999999999`` would otherwise fill the memory)."""
    out: List[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not m:
            raise ConfigError(f"bad device list {text!r} (expected e.g. 0-7 or 0,2,4)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ConfigError(f"bad device list {text!r}: range {part.strip()} is empty")
        if hi >= MAX_DEVICES or len(out) + hi - lo + 1 > MAX_DEVICES:
            raise ConfigError(f"bad device list {quoted_short(text, 60)}: more than the "
                              f"{MAX_DEVICES:,} devices distsim simulates "
                              f"(ranks 0..{MAX_DEVICES - 1})")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def parse_kind(kind: Union[str, CollectiveType]) -> CollectiveType:
    """``allreduce``, ``all-reduce``, ``all_reduce``, ``AllReduce`` ->
    :class:`CollectiveType`."""
    if isinstance(kind, CollectiveType):
        return kind
    key = re.sub(r"[-_ ]", "", str(kind)).lower()
    for k in CollectiveType:
        if k.value == key:
            return k
    raise ConfigError(f"unknown collective {kind!r} (known: "
                      f"{', '.join(k.value for k in CollectiveType)})")


_CLUSTER_SUFFIX = re.compile(r"-x[0-9]+$")


def topology_for_nodes(topology: Union[str, Topology], nodes: Optional[int] = None) -> Topology:
    """The topology a run over the first ``nodes`` servers uses: ``topology``
    itself where it has that many, else, for a one-server name such as
    ``dgx-a100``, its ``NAME-xN`` cluster (``dgx-a100-x2`` for ``nodes=2``);
    otherwise a ConfigError that says which topology to pass."""
    if isinstance(topology, Topology):
        topo, name = topology, None
    else:
        topo, name = load_topology(topology), str(topology)
    if nodes is None or isinstance(nodes, bool) or not isinstance(nodes, int) or \
            nodes <= topo.num_nodes:
        return topo                     # select_ranks checks the count itself
    if nodes >= 1 and name is not None and topo.num_nodes == 1 and \
            not _CLUSTER_SUFFIX.search(name) and not name.endswith((".yaml", ".yml")):
        try:
            return load_topology(f"{name}-x{nodes}")
        except ConfigError:
            pass                        # not built by the dgx builder: no -xN clusters
    base = _CLUSTER_SUFFIX.sub("", topo.name)
    hint = (f"; pass a cluster with enough servers, e.g. --topology {base}-x{nodes}"
            if base.startswith("dgx-") else "")
    raise ConfigError(f"--nodes {nodes}: topology '{topo.name}' has {topo.num_nodes} "
                      f"node(s){hint}")


def select_ranks(topology: Topology, ranks: Optional[Sequence[int]] = None,
                 nodes: Optional[int] = None) -> Tuple[int, ...]:
    """The team: ``ranks`` as given, or every rank of the first ``nodes``
    servers, or every rank."""
    if ranks is not None and nodes is not None:
        raise ConfigError("give the devices or the number of nodes, not both")
    if ranks is not None:
        return tuple(ranks)
    if nodes is not None:
        if nodes < 1 or nodes > topology.num_nodes:
            raise ConfigError(f"--nodes {nodes}: topology '{topology.name}' has "
                              f"{topology.num_nodes} node(s)")
        return tuple(r for r in topology.ranks if topology.node_of(r) < nodes)
    return tuple(topology.ranks)


def benchmark_collective(kind: Union[str, CollectiveType], nbytes: Union[int, str],
                         topology: Union[str, Topology], ranks: Optional[Sequence[int]] = None,
                         nodes: Optional[int] = None, algorithm: str = "auto",
                         mode: str = "flow", root: Optional[int] = None) -> Dict[str, Any]:
    """Simulate one collective alone on ``topology``; returns a dict with
    ``collective, algorithm, protocol, bytes, ranks, time_s, algbw_Bps,
    busbw_Bps, topology, mode`` (``protocol``: NCCL's protocol it ran with,
    None on a topology without a ``collectives:`` block). A send/recv team
    defaults to the first and last rank of ``nodes`` or of the topology
    (``ranks`` given must be the two);
    a rooted collective's root to the first; a root given to a kind
    without one is an error. ``nodes`` past a one-server topology's one
    uses its cluster (:func:`topology_for_nodes`)."""
    kind = parse_kind(kind)
    if root is not None and kind not in ROOTED:
        raise ConfigError(f"{kind.value}: --root applies only to "
                          f"{', '.join(k.value for k in ROOTED)}")
    topo = topology_for_nodes(topology, nodes)
    size = parse_bytes(nbytes)
    team = select_ranks(topo, ranks, nodes)
    if kind is CollectiveType.SEND_RECV and len(team) != 2 and ranks is None:
        team = (team[0], team[-1])
    if kind in ROOTED and root is None:
        root = team[0]
    env = simpy.Environment()
    network = Network(env, topo, mode=mode)
    check_team(network, kind, team, root)
    result: Dict[str, Any] = {}

    def one() -> Iterable:
        result["algorithm"] = yield env.process(
            run_collective(env, network, kind, team, size, root=root, algorithm=algorithm))

    env.process(one())
    env.run()
    t = float(env.now)
    p = len(team)
    algbw = size / t if t > 0 else 0.0
    protocol = protocol_used(topo, kind, team, size, root, result["algorithm"])
    return {
        "collective": kind.value, "algorithm": result["algorithm"], "protocol": protocol,
        "bytes": size,
        "ranks": p, "time_s": t, "algbw_Bps": algbw,
        "busbw_Bps": algbw * (BUS_FACTORS[kind](p) if p > 1 else 0.0),
        "topology": topo.name, "mode": mode,
    }


def sweep_collective(kind: Union[str, CollectiveType], sizes: Sequence[Union[int, str]],
                     topology: Union[str, Topology], **kwargs: Any) -> List[Dict[str, Any]]:
    """:func:`benchmark_collective` for every size (same team, algorithm)."""
    topo = topology_for_nodes(topology, kwargs.get("nodes"))
    return [benchmark_collective(kind, s, topo, **kwargs) for s in sizes]


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """An nccl-tests style table: size, time (us), algbw and busbw (GB/s)."""
    head = (f"{'size (B)':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"
            "  algorithm")
    lines = [head]
    for r in rows:
        algorithm = r["algorithm"] + (f"/{r['protocol']}" if r.get("protocol") else "")
        lines.append(f"{r['bytes']:>14d} {r['time_s'] * 1e6:>12.2f} {r['algbw_Bps'] / 1e9:>13.2f} "
                     f"{r['busbw_Bps'] / 1e9:>13.2f}  {algorithm}")
    return "\n".join(lines)
