"""The cost model: how long one compute op takes on one device.

    time = launch_overhead + max(compute time,
                                 bytes / (memory_bandwidth * memory_efficiency))

The compute time of a matrix product is the device's GEMM model
(:mod:`~distsim.cost.gemm`: tiles in waves over the SMs) where the device
file gives one (``gemm``), else ``flops / (peak(dtype) * matmul_efficiency)``;
of the fused attention kernels, FlashAttention's measured figures
(:mod:`~distsim.cost.attention_time`, ``attention``), else a share of
``matmul_efficiency`` (:data:`~distsim.cost.device.ATTENTION_VS_MATMUL`);
of everything else ``flops / (peak(dtype) * vector_efficiency)``. Memory
traffic runs at the op type's own figure (``memory_efficiency_by_op``), its
kernel class's (``memory_efficiency_by_class``), or ``memory_efficiency``.
A measured profile (op type -> seconds, or a callable) overrides the
formula for the ops it lists. An op holding a function (a fused segment, a
call) costs the sum of that function's ops; one marked as a fused kernel
(``kernel``) costs one launch and one memory pass (:meth:`CostModel.kernel_cost`).

An op marked with ``meta["occupancy"]`` f (a dropless mixture-of-experts
dispatch's padded slots, :mod:`distsim.models.moe`) holds real rows in
only that share of its shapes: its FLOPs, bytes and time past the launch
are f of the padded op's (a grouped GEMM over the real rows at the
batched GEMM's efficiency); the routing ops count their routed tokens'
FLOPs already and move f of their slots (:func:`~.flops_moe.routing_bytes`).

With a host launch time (``host_launch_s``), :meth:`CostModel.host_lead`
says how many kernels an op launches and how far its last kernel can be
held back by the host's launch queue (the simulator's
:mod:`~distsim.sim.launch_queue`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, NamedTuple, Tuple, Union

from ..ir.comm import is_communication
from ..ir.core import Op
from ..ir.ops_bundle import BOOKKEEPING_OPS
from .device import DeviceSpec
from .attention_time import kernel_figures
from .flops import op_flops, op_memory_bytes
from .flops_moe import ROUTING_OPS, routing_bytes
from .gemm import gemm_shape

MATMUL_OPS = frozenset({"matmul", "batch_matmul", "conv", "conv_grad_input", "conv_grad_weight",
                        "linear"})

ProfileEntry = Union[float, Callable[[Op], float]]


class OpCost(NamedTuple):
    time_s: float
    flops: float
    bytes: float


@dataclass
class CostModel:
    """Op costs on ``device`` (module docstring); ``profile`` overrides by op type."""

    device: DeviceSpec
    profile: Mapping[str, ProfileEntry] = field(default_factory=dict)
    _function_costs: Dict[int, tuple] = field(default_factory=dict, init=False, repr=False)
    _function_leads: Dict[int, tuple] = field(default_factory=dict, init=False, repr=False)
    _kernel_costs: Dict[int, tuple] = field(default_factory=dict, init=False, repr=False)

    def op_cost(self, op: Op) -> OpCost:
        if op.op_type == "depend" or op.op_type in BOOKKEEPING_OPS:
            # an ordering edge (an event wait) or a regrouping of values
            # (pack, unpack): not kernels
            return OpCost(0.0, 0.0, 0.0)
        occupancy = op.meta.get("occupancy", 1.0)
        if op.subfunctions and not is_communication(op):
            if op.attrs.get("kernel"):     # a fused kernel: its last part's share
                return self._occupied(self.kernel_cost(op.subfunctions[0]), occupancy)
            return self.function_cost(op.subfunctions[0])
        flops = op_flops(op)
        nbytes = op_memory_bytes(op)
        if is_communication(op):
            return OpCost(0.0, 0.0, nbytes)
        if occupancy != 1.0 and op.op_type in ROUTING_OPS:
            nbytes, occupancy = routing_bytes(op, occupancy), 1.0
        entry = self.profile.get(op.op_type)
        if entry is not None:
            t = entry(op) if callable(entry) else float(entry)
            return OpCost(t * occupancy, flops * occupancy, nbytes * occupancy)
        return self._occupied(OpCost(self.roofline_time(op, flops, nbytes), flops, nbytes),
                              occupancy)

    def _occupied(self, c: OpCost, occupancy: float) -> OpCost:
        """``c`` of an op whose rows hold data in only ``occupancy`` of its
        shapes (module docstring): the launch whole, the rest that share."""
        if occupancy == 1.0:
            return c
        launch = self.device.launch_overhead_s
        return OpCost(launch + (c.time_s - launch) * occupancy, c.flops * occupancy,
                      c.bytes * occupancy)

    def function_cost(self, function) -> OpCost:
        """The summed cost of every op of ``function`` (a fused segment or a
        callee), computed once per function object."""
        return self._function_entry(function)[1]

    def function_op_times(self, function) -> Tuple[float, ...]:
        """The time of each op of ``function``, in order: what
        :meth:`function_cost` sums (the simulator places a fused segment's
        memory events by them)."""
        return self._function_entry(function)[2]

    def _function_entry(self, function) -> tuple:
        key = id(function)
        hit = self._function_costs.get(key)
        if hit is None or hit[0] is not function:
            time_s = flops = nbytes = 0.0
            times = []
            for op in function.ops:
                c = self.op_cost(op)
                times.append(c.time_s)
                time_s += c.time_s
                flops += c.flops
                nbytes += c.bytes
            hit = self._function_costs[key] = (function, OpCost(time_s, flops, nbytes),
                                               tuple(times))
        return hit

    def kernel_cost(self, function) -> OpCost:
        """The cost of ``function`` run as one fused kernel (a ``fused`` op
        with ``kernel``, :mod:`distsim.transforms.fusion`): one launch, and
        the longer of its parts' arithmetic (summed) and one memory pass,
        its inputs read once and its outputs written once, at the lowest
        memory efficiency of its parts (the kernel moves at its slowest
        part's access pattern); intermediates never touch memory. A
        profile's entries for its parts do not apply to it."""
        key = id(function)
        hit = self._kernel_costs.get(key)
        if hit is None or hit[0] is not function:
            d = self.device
            compute_s = flops = 0.0
            effs = []
            for op in function.ops:
                if op.op_type == "depend" or op.op_type in BOOKKEEPING_OPS:
                    continue
                f = op_flops(op)
                flops += f
                dtype = op.outputs[0].type.dtype if op.outputs else None
                if f > 0 and dtype is not None:
                    compute_s += self.compute_time(op, f, dtype)
                effs.append(d.memory_efficiency_of(op.op_type))
            eff = min(effs) if effs else d.memory_efficiency
            nbytes = float(sum(v.type.size_bytes for v in function.inputs) +
                           sum(v.type.size_bytes for v in function.outputs))
            time_s = d.launch_overhead_s + max(compute_s,
                                               nbytes / (d.memory_bandwidth_Bps * eff))
            hit = self._kernel_costs[key] = (function, OpCost(time_s, flops, nbytes))
        return hit[1]

    def host_lead(self, op: Op) -> Tuple[int, float]:
        """(kernels, lead) of a compute op under the host's launch queue,
        ``H = host_launch_s``: the kernels it launches and ``lead``, the
        largest ``j H - P(j)`` over its kernels j = 1..k, P(j) the summed
        time of its kernels before the j-th. If the host issued the op's
        first kernel at ``h + H`` and the next ones every H after, the op
        ends at ``max(start + time, h + lead + time)``: an op of one kernel
        has lead H, a fused segment adds the host's lag over its own
        kernels. An op that launches nothing (an event wait, a regrouping
        of values) has no kernels and lead ``-inf``."""
        if op.op_type == "depend" or op.op_type in BOOKKEEPING_OPS:
            return 0, -math.inf
        if op.subfunctions and not is_communication(op):
            if op.attrs.get("kernel"):
                return 1, self.device.host_launch_s
            return self.function_lead(op.subfunctions[0])
        return 1, self.device.host_launch_s

    def function_lead(self, function) -> Tuple[int, float]:
        """:meth:`host_lead` of the ops of ``function`` run back to back,
        computed once per function object."""
        key = id(function)
        hit = self._function_leads.get(key)
        if hit is None or hit[0] is not function:
            h = self.device.host_launch_s
            kernels, lead, before = 0, -math.inf, 0.0
            for op in function.ops:
                k, a = self.host_lead(op)
                if k:
                    lead = max(lead, kernels * h + a - before)
                    kernels += k
                before += self.op_cost(op).time_s
            hit = self._function_leads[key] = (function, (kernels, lead))
        return hit[1]

    def roofline_time(self, op: Op, flops: float, nbytes: float) -> float:
        d = self.device
        dtype = op.outputs[0].type.dtype if op.outputs else None
        compute_s = 0.0
        if flops > 0 and dtype is not None:
            compute_s = self.compute_time(op, flops, dtype)
        memory_s = nbytes / (d.memory_bandwidth_Bps * d.memory_efficiency_of(op.op_type))
        return d.launch_overhead_s + max(compute_s, memory_s)

    def compute_time(self, op: Op, flops: float, dtype) -> float:
        """Seconds of arithmetic of ``op`` (``flops`` of it, in ``dtype``)."""
        d = self.device
        peak = d.peak_flops_for(dtype)
        if op.op_type == "matmul" and d.gemm is not None \
                and d.gemm.efficiency_for(dtype) is not None:
            return d.gemm.time(gemm_shape(op), dtype, peak,
                              d.memory_bandwidth_Bps * d.memory_efficiency)
        attention = kernel_figures(d.attention, op, d.name) \
            if op.op_type in ("fused_attention", "fused_attention_grad") else None
        if attention is not None:
            gemm = d.gemm
            return attention.time(op, flops, peak, gemm.sms if gemm else None,
                                  gemm.wave_quantization if gemm else 1.0)
        eff = d.compute_efficiency_of(op.op_type, op.op_type in MATMUL_OPS)
        return flops / (peak * eff)
