"""What the estimator's timeline (:mod:`.timeline`) charges for
the work it adds around the per-layer profile: collectives, timed by the
simulator's own analytical network (:class:`Collectives`), and the small
ops LowerSPMD adds (reshape, slice, concat, split, the optimizer's), by the
cost model (:class:`OpCosts`). Both are kept per process and topology
(:func:`collectives`, :func:`op_costs`), so the points of a sweep share
them.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Optional, Sequence, Tuple

from ..cost.model import CostModel
from ..ir.comm import CollectiveType
from ..ir.core import Op, Value
from ..ir.types import DType, TensorType
from ..sim.solo_time import collective_time
from ..topology import Topology, load_topology


class Collectives:
    """Analytical collective times on one topology, the simulator's own:
    each collective's :func:`~distsim.sim.solo_time.collective_time` alone
    on an analytical network (no contention), from time 0, so that its time
    is the same whatever was timed before it."""

    def __init__(self, topology: Topology, algorithm: str) -> None:
        self.topology = topology
        self.algorithm = algorithm
        self.cache: Dict[tuple, float] = {}

    def time(self, kind: CollectiveType, ranks: Tuple[int, ...], nbytes: float) -> float:
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        key = (kind, ranks, float(nbytes))
        hit = self.cache.get(key)
        if hit is None:
            root = ranks[0] if kind is CollectiveType.SEND_RECV else None
            hit = self.cache[key] = collective_time(self.topology, "analytical", kind, ranks,
                                                    nbytes, root, self.algorithm)[0]
        return hit


@lru_cache(maxsize=32)
def collectives(topology: str, algorithm: str) -> Collectives:
    """The :class:`Collectives` of a topology (by name) and algorithm."""
    return Collectives(load_topology(topology), algorithm)


class OpCosts:
    """Costs of the small ops LowerSPMD adds around a step (reshape, slice,
    concat, split, AdamW, cast), from the cost model on stand-in ops of
    the same types and shapes."""

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self.cache: Dict[tuple, Tuple[float, float]] = {}

    def cost(self, op_type: str, ins: Sequence[Tuple[int, DType]],
             outs: Sequence[Tuple[int, DType]], attrs: Optional[Dict[str, Any]] = None
             ) -> Tuple[float, float]:
        """(time, FLOPs) of an ``op_type`` op reading flat tensors of
        ``ins`` and writing ``outs`` ((elements, dtype) each)."""
        key = (op_type, tuple(ins), tuple(outs))
        hit = self.cache.get(key)
        if hit is None:
            vin = [Value(f"i{i}", TensorType((max(n, 1),), d, 0)) for i, (n, d) in enumerate(ins)]
            vout = [Value(f"o{i}", TensorType((max(n, 1),), d, 0))
                    for i, (n, d) in enumerate(outs)]
            c = self.model.op_cost(Op(op_type, vin, vout, dict(attrs or {})))
            hit = self.cache[key] = (c.time_s, c.flops)
        return hit


@lru_cache(maxsize=32)
def op_costs(topology: str) -> OpCosts:
    """The :class:`OpCosts` of a topology's device (by topology name)."""
    return OpCosts(CostModel(load_topology(topology).device_spec))
