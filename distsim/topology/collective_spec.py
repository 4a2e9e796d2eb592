"""The ``collectives:`` block of a topology file: what NCCL's kernels reach
on its links, per protocol.

A collective's steps move bytes over links; NCCL moves them with one of
three protocols, each a trade of latency for bandwidth:

- ``simple``: plain copies in large chunks, a flag per chunk: the full
  bandwidth, the largest per-step latency;
- ``ll128``: 128-byte lines, 8 bytes of each a flag (120/128 of the wire);
- ``ll`` (low latency): 8-byte lines of 4 data and 4 flag bytes (1/2 of
  the wire), the smallest latency.

Each protocol has a wire ``efficiency`` (payload over bytes sent), a
``base_latency_us`` paid once per collective, a ``hop_latency_us`` per
step by the kind of link the step crosses (``nvlink``, ``pcie``,
``network``), an optional ``pipeline_us`` (NCCL's pipeline fills before
data streams at full rate: a collective waits, once, the time a GPU takes
to send its bytes, up to that long) and an optional
``max_busbw_GBps`` (the most a GPU's kernels move with it, whatever the
links). ``link_efficiency`` is the
fraction of each kind of link's bandwidth NCCL's copies reach;
``reduce_busbw_GBps`` caps collectives that add what they receive
(all-reduce, reduce-scatter, reduce); ``nvls`` describes NVLink SHARP
(the NVSwitch reduces and multicasts), an all-reduce of its own.

:mod:`distsim.sim.protocols` turns these figures into the cost of a
schedule; this module only reads and checks them (one line per error,
naming the field).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ..errors import ConfigError

#: The kinds of link a collective's step can cross (a link's ``transport``).
TRANSPORTS = ("nvlink", "pcie", "network")
#: Protocol names in the file, and as NCCL writes them.
PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_PROTOCOL_KEYS = {"efficiency", "base_latency_us", "hop_latency_us", "pipeline_us",
                  "max_busbw_GBps"}
_TOP_KEYS = {"link_efficiency", "reduce_busbw_GBps", "protocols", "nvls"}


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol's figures (seconds, bytes, bytes/s)."""

    name: str
    efficiency: float = 1.0
    base_latency_s: float = 0.0
    hop_latency_s: Mapping[str, float] = field(default_factory=dict)
    pipeline_s: float = 0.0
    max_busbw_Bps: float = math.inf

    def hop_latency(self, transport: str) -> float:
        return self.hop_latency_s.get(transport, 0.0)


@dataclass(frozen=True)
class CollectiveSpec:
    """A topology's ``collectives:`` block (see the module docstring)."""

    protocols: Tuple[ProtocolSpec, ...]
    link_efficiency: Mapping[str, float] = field(default_factory=dict)
    reduce_busbw_Bps: float = math.inf
    nvls: Optional[ProtocolSpec] = None

    def efficiency(self, transport: str) -> float:
        return self.link_efficiency.get(transport, 1.0)


def _number(value: Any, where: str, low: float = 0.0, high: float = math.inf,
            open_low: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and \
        math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if not ok:
        bounds = (f"in ({low:g}, {high:g}]" if high < math.inf else f"> {low:g}") if open_low \
            else f">= {low:g}"
        raise ConfigError(f"{where}: must be a finite number {bounds}, got {value!r}")
    return float(value)


def _mapping(value: Any, where: str, allowed) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {value!r}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field (allowed: "
                          f"{', '.join(sorted(allowed))})")
    return value


def _per_transport(value: Any, where: str, scale: float, efficiency: bool) -> Dict[str, float]:
    data = _mapping(value, where, TRANSPORTS)
    if efficiency:
        return {k: _number(v, f"{where}.{k}", 0.0, 1.0, open_low=True) for k, v in data.items()}
    return {k: _number(v, f"{where}.{k}") * scale for k, v in data.items()}


def _protocol(name: str, value: Any, where: str) -> ProtocolSpec:
    data = _mapping(value, where, _PROTOCOL_KEYS)
    eff = _number(data.get("efficiency", 1.0), f"{where}.efficiency", 0.0, 1.0, open_low=True)
    cap = data.get("max_busbw_GBps")
    return ProtocolSpec(
        name=name, efficiency=eff,
        base_latency_s=_number(data.get("base_latency_us", 0.0), f"{where}.base_latency_us") * 1e-6,
        hop_latency_s=_per_transport(data.get("hop_latency_us", {}), f"{where}.hop_latency_us",
                                     1e-6, efficiency=False),
        pipeline_s=_number(data.get("pipeline_us", 0.0), f"{where}.pipeline_us") * 1e-6,
        max_busbw_Bps=math.inf if cap is None else
        _number(cap, f"{where}.max_busbw_GBps", open_low=True) * 1e9)


def collective_spec_from_dict(value: Any, where: str) -> CollectiveSpec:
    """Read a ``collectives:`` block; ``where`` names it in errors
    (``topologies/x.yaml: collectives``)."""
    data = _mapping(value, where, _TOP_KEYS)
    protocols = _mapping(data.get("protocols"), f"{where}.protocols", PROTOCOLS) \
        if "protocols" in data else None
    if not protocols:
        raise ConfigError(f"{where}.protocols: give at least one of "
                          f"{', '.join(PROTOCOLS)}")
    specs = tuple(_protocol(PROTOCOLS[k], v, f"{where}.protocols.{k}")
                  for k, v in protocols.items())
    cap = data.get("reduce_busbw_GBps")
    nvls = data.get("nvls")
    return CollectiveSpec(
        protocols=specs,
        link_efficiency=_per_transport(data.get("link_efficiency", {}),
                                       f"{where}.link_efficiency", 1.0, efficiency=True),
        reduce_busbw_Bps=math.inf if cap is None else
        _number(cap, f"{where}.reduce_busbw_GBps", open_low=True) * 1e9,
        nvls=None if nvls is None else _protocol("NVLS", nvls, f"{where}.nvls"))
