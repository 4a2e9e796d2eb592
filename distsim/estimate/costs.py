"""What the estimator's timeline (:mod:`.timeline`) charges for
the work it adds around the per-layer profile: collectives, timed by the
simulator's own analytical network (:class:`Collectives`), and the small
ops LowerSPMD adds (reshape, slice, concat, split, the optimizer's), by the
cost model (:class:`OpCosts`). Both are kept per process and topology
(:func:`collectives`, :func:`op_costs`), so the points of a sweep share
them; and what the step charges each parameter (:class:`ParamCost`).
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
from ..transforms.sync_policy import update_plan


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


def shard_size(n: int, parts: int) -> int:
    """Rank 0's ZeRO shard of ``n`` elements over ``parts`` ranks: the first
    (largest) of :func:`distsim.ir.ops_comm.split_sizes`."""
    return -(-n // parts)


class ParamCost:
    """What the step charges one parameter ``p`` of a block (its
    :class:`~.blocks.Param`; per rank, under data-parallel degree ``dp`` (the
    ranks its gradient is synchronised over) and
    ZeRO stage ``zero``; ``grad_dtype``: its gradient buffer's,
    :func:`~distsim.transforms.sync_policy.grad_buffer_dtype`): its size,
    its gradient buffer's (``gbytes``), the ZeRO shard, flattening its gradient
    (``flat``: time, FLOPs), the update ops on the shard (``update``),
    slicing the shard out of the gradient (``slice``, ZeRO 1), its
    data-parallel sync time and its optimizer's items
    (:meth:`.sync.StepSync.update_plan`), both filled when first needed: a
    collective not needed is not timed."""

    __slots__ = ("numel", "dtype", "nbytes", "gdtype", "gbytes", "shard", "flat", "update",
                 "slice", "sync", "plan", "expert")

    def __init__(self, p: Any, dp: int, zero: int, costs: "OpCosts", launch: float,
                 grad_dtype: Optional[DType] = None) -> None:
        n, d = p.numel, p.dtype
        self.numel, self.dtype = n, d
        #: an expert's weights: ``dp`` is their expert-data-parallel team's
        self.expert = p.expert
        self.nbytes = n * d.itemsize
        #: the gradient buffer (fp32 under ``fp32_grads``): what its sync moves
        self.gdtype = d if grad_dtype is None else grad_dtype
        self.gbytes = n * self.gdtype.itemsize
        plan = update_plan(zero, dp)
        self.shard = shard_size(n, dp) if plan.on_shard else n
        self.flat = costs.cost("reshape", [(n, d)], [(n, d)])
        # the update ops shrink to the shard (``launch``: the device's launch
        # overhead): their time beyond it scales with the elements
        ratio = self.shard / n if n else 1.0
        t = fl = 0.0
        for time_s, flops in p.opt_update:
            t += launch + max(0.0, time_s - launch) * ratio if time_s > 0 else 0.0
            fl += flops * ratio
        self.update = (t, fl)
        g = self.gdtype         # ZeRO 1 slices the shard out of the gradient buffer
        self.slice = costs.cost("slice", [(n, g)], [(self.shard, g)]) \
            if plan.slice else (0.0, 0.0)
        self.sync: Optional[float] = None
        self.plan: Optional[tuple] = None
