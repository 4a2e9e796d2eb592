"""Per-layer profiles for the estimator (:mod:`.point`), from a template.

A GPT training step is the same transformer layer over and over. Instead of
building the whole program, :func:`layer_profile` builds the step of a
**two-layer** copy of the model for one tensor-parallel group (``dp = pp =
1``, three micro-batches), lowers it with the real
:class:`~distsim.transforms.spmd.LowerSPMD` (``representatives``: the ops of
tensor-parallel rank 0 only, whose peers run the same ops at the same
times; rank 0's timeline is the same as in the full program, at a 1/tp of
the cost) and simulates it with the real simulator in the analytical
network mode (so compute times come from the
:class:`~distsim.cost.model.CostModel` and tensor-parallel collectives from
the alpha-beta model of the topology). From rank 0's timeline it reads,
per *block* (the embedding, one transformer layer, the head with the loss):

* forward and backward times, as the compute stream sees them (op times plus
  waits on tensor-parallel collectives), their busy part, and their FLOPs;
* the backward of the first micro-batch (no accumulation), of a middle one
  (gradients added to the buffer) and of the last (added and averaged);
* the last backward op by op, compressed into compute segments and
  tensor-parallel collectives with their dependencies, and where each
  parameter's gradient becomes final (where data-parallel sync starts);
* the parameters of each block, the values that cross a pipeline stage
  boundary, and the activation bytes saved per micro-batch
  (:func:`~distsim.transforms.memory_model.saved_activation_bytes`).

A mixture-of-experts model whose layers are all MoE is one template like a
dense one (the routing balance and capacity factor set the experts' slots,
so they are part of the model shape); one that mixes dense and MoE layers
gets a template per kind, merged (:mod:`.layer_kinds`).

Under expert parallelism the MoE template is one expert-parallel group
(dp = ep; with cp, lcm(ep, cp) ranks: :func:`.experts.template_dp`): its
all-to-alls among each MoE block's own collectives
(:func:`~.profile_memory.block_collective`), its experts' weights at their
1/ep shape, its sync after the backward (:mod:`.experts`).

Profiles are cached per (model shape, tp, sp, recompute, ZeRO kind,
micro-batch, untied head, topology, collective algorithm, the tensor-parallel
group's devices, ep, the backward's tensor-parallel order: ``tp_overlap``,
whether the gradient buffers are fp32: ``fp32_grads``).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

from ..cost.flops import op_flops
from ..cost.model import CostModel
from ..ir.comm import is_communication, members
from ..ir.core import Function, Op
from ..ir.occupancy import held_bytes
from ..models.gpt import GPTConfig
from ..models.moe import loads_tuple
from ..models.gpt_family import build_gpt_backward, build_gpt_step, hyper_of, rank_forward
from ..sim.launch_queue import DEFAULT_COMM_ORDER
from ..sim.simulator import SimulationOptions, simulate_function
from ..topology import load_topology
from ..transforms.memory_model import saved_activation_bytes
from ..transforms.pipeline import SPLIT_BACKWARD
from ..transforms.spmd import PARTITION_DEVICE, LowerSPMD
from ..transforms.strategy import Strategy, writes_megatron_loss
from ..transforms.zero3 import used_param_name
from .blocks import EMB, HEAD, LAST_MB, LAYER, Block, LayerProfile, Param
from .experts import template_dp, with_expert_parallel
from .layer_kinds import dense_variant, layer_blocks, merge_kinds, moe_variant, probe_layers
from .block_edges import comm_tail, first_wait, issued_after, out_tail
from .profile_memory import block_collective, fill_optimizer_ops, memory_excess
from .crossing import stage_crossing
from .segments import (cast_into_buffers, compress_segments, edges, fill_lead, gathered_uses,
                       read_gates)

#: The template's layer whose numbers stand for every layer.
_TEMPLATE_LAYERS = 2
_REPRESENTATIVE_LAYER = 1
#: The template's micro-batches: the first, a middle one and the last. A
#: middle one's backward is measured, not taken as the last's less its
#: averaging ops: with NCCL's collective latencies those partly run while
#: the compute stream waits on a collective anyway.
_TEMPLATE_MICROBATCHES = LAST_MB + 1
#: The schedule a split profile's template is lowered with (one stage:
#: each micro-batch's forward, input-gradient and weight-gradient tasks).
SPLIT_SCHEDULE = "zb-h1"
assert SPLIT_SCHEDULE in SPLIT_BACKWARD


def _block_of(layer: Any, layers: int) -> Optional[str]:
    if not isinstance(layer, int):
        return None
    if layer < 0:
        return EMB
    if layer >= layers:
        return HEAD
    return LAYER if layer == _REPRESENTATIVE_LAYER else f"{LAYER}{layer}"


def _template(config: GPTConfig, tp: int, sp: bool, recompute: str, zero: int,
              micro_batch: int, untie: bool, optimizer: str, representatives: bool = True,
              fusion: str = "megatron", split: bool = False, ep: int = 1, cp: int = 1,
              cp_comm: str = "allgather", tp_overlap: bool = False, fp32_grads: bool = False
              ) -> Tuple[Function, Function, LowerSPMD]:
    c = _template_config(config, micro_batch)
    step = _template_step(c, tp, sp, recompute, micro_batch, untie, fusion, ep, cp, cp_comm,
                          tp_overlap)
    # ZeRO-3 without prefetch: each block's memory holds its own gathered
    # parameters only; the estimate adds those of the blocks a real
    # ``prefetch`` gathers ahead of it (estimate.prefetched_bytes), which
    # depend on the chunk's blocks, not the template's
    # expert parallelism: one expert-parallel group (dp = ep), its
    # all-to-alls in the program; the data-parallel sync after the backward
    # (``bucket_mb`` 0), behind every block the profile measures. Context
    # parallelism: the template runs on a tp x cp group (its ring steps or
    # all-to-alls simulated with the attention they overlap), one
    # data-parallel replica's: its gradients stay local
    # (``local_gradients``), the estimate synchronises them over the dp x
    # cp ranks as the lowering does. Under ZeRO 3 an expert-parallel
    # template keeps its gradients local too: its gathers over no team (each
    # rank's parameters whole), the estimate gathering each over its own
    # team (dp, or dp / ep for an expert's weights)
    lower = LowerSPMD(Strategy(dp=template_dp(ep, cp), tp=tp, pp=1, sp=sp,
                               recompute=recompute, zero=zero, prefetch=0,
                               microbatches=_TEMPLATE_MICROBATCHES, optimizer=optimizer,
                               fusion=fusion, ep=ep,
                               bucket_mb=0 if ep > 1 else None,
                               schedule=SPLIT_SCHEDULE if split else "1f1b",
                               cp=cp, cp_comm=cp_comm, fp32_grads=fp32_grads),
                      _TEMPLATE_MICROBATCHES,
                      hyper_of(c, optimizer), c.master_dtype, representatives=representatives,
                      local_gradients=cp > 1 or (ep > 1 and zero == 3))
    return step, lower(step), lower


def _template_config(config: GPTConfig, micro_batch: int) -> GPTConfig:
    """The template's model: two layers, three micro-batches."""
    return replace(config, layers=_TEMPLATE_LAYERS, micro_batch=micro_batch,
                   global_batch=_TEMPLATE_MICROBATCHES * micro_batch)


@lru_cache(maxsize=8)
def _step_facts(c: GPTConfig, tp: int, sp: bool, recompute: str, micro_batch: int,
                untie: bool, fusion: str = "megatron", ep: int = 1, cp: int = 1,
                cp_comm: str = "allgather", tp_overlap: bool = False
                ) -> Tuple[Dict[str, Tuple[float, float]], Dict[str, int],
                           tuple, Dict[str, float]]:
    """What a profile reads from the template's one-device step alone (the
    same for its ZeRO kinds, built one after another: worked out once):
    per block its forward and backward FLOPs as LowerSPMD's task ordering
    counts them, its saved activation bytes, and its cost as the balanced
    partition estimates it (each summed in op order); the values crossing
    a stage boundary (:func:`.crossing.stage_crossing`). Kept: do not modify."""
    step = _template_step(c, tp, sp, recompute, micro_batch, untie, fusion, ep, cp, cp_comm,
                          tp_overlap)
    names = (EMB, LAYER, HEAD)
    flops: Dict[str, List[float]] = {}
    partition: Dict[str, float] = {}
    model = CostModel(PARTITION_DEVICE)
    for op in step.ops:
        blk = _block_of(op.meta.get("layer"), _TEMPLATE_LAYERS)
        if blk in names:
            f = flops.setdefault(blk, [0.0, 0.0])
            f[1 if "phase" in op.meta else 0] += op_flops(op)
            partition[blk] = partition.get(blk, 0.0) + model.op_cost(op).time_s
    saved: Dict[str, int] = {}
    for layer, nbytes in saved_activation_bytes(step).items():
        blk = _block_of(layer, _TEMPLATE_LAYERS)
        if blk in names:
            saved[blk] = saved.get(blk, 0) + nbytes
    return ({k: (f, b) for k, (f, b) in flops.items()}, saved,
            stage_crossing(step, tp, sp, recompute, cp, cp_comm), partition)


@lru_cache(maxsize=8)
def _template_step(c: GPTConfig, tp: int, sp: bool, recompute: str, micro_batch: int,
                   untie: bool, fusion: str = "megatron", ep: int = 1, cp: int = 1,
                   cp_comm: str = "allgather", tp_overlap: bool = False) -> Function:
    """The template's one-device step (forward, backward, no optimizer),
    the same for every ZeRO stage: the profiles of one layout and its ZeRO
    kinds, built one after another in a sweep, lower the same step (kept:
    lowering reads it, nothing changes it). Finished from the layout's
    :func:`_template_backward`, its backward's tensor-parallel collectives
    in the order ``tp_overlap`` says (:mod:`distsim.transforms.tp_order`),
    as the step's."""
    return build_gpt_step(c, Strategy(dp=template_dp(ep, cp), tp=tp, pp=2 if untie else 1,
                                      sp=sp, ep=ep, recompute=recompute, fusion=fusion, cp=cp,
                                      cp_comm=cp_comm, tp_overlap=tp_overlap), micro_batch,
                          _template_backward(c, tp, sp, micro_batch, untie, ep, cp, cp_comm,
                                             writes_megatron_loss(fusion)))


@lru_cache(maxsize=4)
def _template_backward(c: GPTConfig, tp: int, sp: bool, micro_batch: int, untie: bool,
                       ep: int = 1, cp: int = 1, cp_comm: str = "allgather",
                       megatron: bool = False) -> Function:
    """The template's step before recomputation and fusion
    (:func:`~distsim.models.gpt_family.build_gpt_backward`), the same for
    the three recomputation settings a sweep's layout takes one after
    another: placed and differentiated once for them (kept: finishing it
    makes new functions, nothing changes it). ``megatron``: the loss as
    Megatron-LM writes it (:func:`~distsim.transforms.strategy.writes_megatron_loss`),
    the one setting of the fusion that the differentiated step depends on."""
    return build_gpt_backward(c, Strategy(dp=template_dp(ep, cp), tp=tp,
                                          pp=2 if untie else 1, sp=sp, ep=ep, cp=cp,
                                          cp_comm=cp_comm,
                                          fusion="megatron" if megatron else "none"),
                              micro_batch)


def model_key(c: GPTConfig) -> Tuple[Tuple[str, Any], ...]:
    """A GPTConfig's fields as sorted pairs, hashable (``expert_loads`` a
    tuple): the model part of a profile's key."""
    fields = c.to_dict()
    fields["expert_loads"] = loads_tuple(fields["expert_loads"])
    return tuple(sorted(fields.items()))


@lru_cache(maxsize=256)
def param_sizes(config_items: Tuple[Tuple[str, Any], ...], tp: int, sp: bool, untie: bool
                ) -> Tuple[Tuple[str, int], ...]:
    """``(name, elements)`` of the parameters a tensor-parallel rank holds,
    in the step's order, as :func:`~distsim.transforms.zero.check_shardable`
    reads them: those of the embedding, the first layer of each kind
    (dense, mixture of experts: layers of a kind have the same sizes, so
    the first one refused is always among them) and the head. From a
    forward pass of those first layers on one rank: nothing
    differentiated, lowered or simulated."""
    config = GPTConfig(**dict(config_items))
    config = replace(config, layers=probe_layers(config))
    fwd = rank_forward(config, tp, sp, micro_batch=1, untie=untie)
    by_name = {v.name: v for v in fwd.inputs}
    return tuple((name, by_name[name].type.numel) for name in fwd.meta["params"])


@lru_cache(maxsize=256)
def layer_profile(config_items: Tuple[Tuple[str, Any], ...], tp: int, sp: bool, recompute: str,
                  zero: int, micro_batch: int, untie: bool, topology: str,
                  collective_algo: str = "auto", optimizer: str = "adamw",
                  tp_ranks: Optional[Tuple[int, ...]] = None,
                  fusion: str = "megatron", split: bool = False, ep: int = 1,
                  comm_order: str = DEFAULT_COMM_ORDER, cp: int = 1,
                  cp_comm: str = "allgather", tp_overlap: bool = False,
                  fp32_grads: bool = False) -> LayerProfile:
    """The profile of a model (``config_items``: a GPTConfig's fields as
    sorted pairs) under a tensor-parallel layout (see the module docstring),
    cached per process. ``tp_ranks``: the devices the template's ranks run
    on (None: ranks ``0..tp x ep - 1``; :func:`build_profile`). ZeRO 0's is ZeRO
    1's less its optimizer's ZeRO-1 parts (:func:`without_zero`): one
    template lowered and simulated for both. ``fusion``: the kernels the
    template's lowering fuses (:mod:`distsim.transforms.fusion`). ``split``:
    the backward split into input- and weight-gradient parts (ZB-H1:
    :attr:`~.blocks.LayerProfile.weight`). ``ep``: the expert-parallel
    degree (:func:`with_expert_parallel`). ``comm_order``: the simulator's
    (:mod:`distsim.sim.launch_queue`), so the template's tensor-parallel
    collectives wait as the step's do. ``cp``, ``cp_comm``: context
    parallelism, the template on a tp x cp group (``tp_ranks`` then its
    devices, cp-major). ``tp_overlap``: the backward's tensor-parallel
    collectives issued before the weight-gradient GEMMs
    (:mod:`distsim.transforms.tp_order`), simulated in that order.
    ``fp32_grads``: the gradient buffers in fp32 (each gradient cast and
    added, the optimizer reading them: the template's accumulation and
    update ops, and its memory, are theirs). A model that mixes dense and
    MoE layers: the profiles of its two kinds merged (:mod:`.layer_kinds`)."""
    config = GPTConfig(**dict(config_items))
    blocks = layer_blocks(config)
    if blocks is not None:
        args = (tp, sp, recompute, zero, micro_batch, untie, topology, collective_algo,
                optimizer)
        # the dense layers' template has no experts: one tp x cp group (the
        # first of the MoE template's ranks); both kinds under the step's
        # context parallelism
        group = tp * cp
        dense_ranks = None if tp_ranks is None or tp_ranks[:group] == tuple(range(group)) \
            else tp_ranks[:group]
        return merge_kinds(layer_profile(model_key(dense_variant(config)), *args, dense_ranks,
                                         fusion, split, 1, comm_order, cp, cp_comm,
                                         tp_overlap, fp32_grads),
                           layer_profile(model_key(moe_variant(config)), *args, tp_ranks,
                                         fusion, split, ep, comm_order, cp, cp_comm,
                                         tp_overlap, fp32_grads),
                           blocks)
    if zero == 0:
        return without_zero(layer_profile(config_items, tp, sp, recompute, 1, micro_batch, untie,
                                          topology, collective_algo, optimizer, tp_ranks,
                                          fusion, split, ep, comm_order, cp, cp_comm,
                                          tp_overlap, fp32_grads))
    profile = build_profile(config_items, tp, sp, recompute, zero, micro_batch, untie, topology,
                            collective_algo, optimizer, tp_ranks=tp_ranks, fusion=fusion,
                            split=split, ep=ep, comm_order=comm_order, cp=cp,
                            cp_comm=cp_comm, tp_overlap=tp_overlap, fp32_grads=fp32_grads)
    if ep > 1 and zero != 3:
        plain = layer_profile(config_items, tp, sp, recompute, zero, micro_batch, untie,
                              topology, collective_algo, optimizer,
                              None if tp_ranks is None else tp_ranks[:tp], fusion, split, 1,
                              comm_order, tp_overlap=tp_overlap, fp32_grads=fp32_grads)
        profile = with_expert_parallel(profile, plain)
    return profile


def without_zero(profile: LayerProfile) -> LayerProfile:
    """The profile of ZeRO 0 from ZeRO 1's (``profile``, kept unchanged).
    The template runs at ``dp = 1``, where the two differ only in the
    optimizer: ZeRO 1 flattens each gradient before its update and
    reshapes the new parameter after it (``opt_pre``, ``opt_post``), and
    the flat copy is live while the update ops run (``opt_flat``); the
    update ops themselves are the same ops on as many elements. So ZeRO 0
    has no flat copy nor the two reshapes, and its update's transient is
    ZeRO 1's with the flat copy taken off (``opt_with``), all of it counted
    as after the copy (``opt_after``, as :func:`~.profile_memory.
    _optimizer_memory` counts a parameter without one). Every block's
    figures are the forward and backward's, shared. Checked against a
    ZeRO-0 template lowered and simulated on its own
    (tests/estimate/test_estimate_profile_kinds.py): the same but for the
    update ops' times, measured there at other absolute times (the last
    bit of a difference of two clock readings)."""
    params = {blk: [replace(p, opt_pre=0.0, opt_post=0.0, opt_with=0.0, opt_flat=0,
                            opt_after=p.opt_with, opt_update=list(p.opt_update))
                    for p in ps]
              for blk, ps in profile.params.items()}
    return replace(profile, params=params, wall_s=0.0)


def build_profile(config_items: Tuple[Tuple[str, Any], ...], tp: int, sp: bool, recompute: str,
                  zero: int, micro_batch: int, untie: bool, topology: str,
                  collective_algo: str = "auto", optimizer: str = "adamw",
                  representatives: bool = True, tp_ranks: Optional[Tuple[int, ...]] = None,
                  fusion: str = "megatron", split: bool = False, ep: int = 1,
                  comm_order: str = DEFAULT_COMM_ORDER, cp: int = 1,
                  cp_comm: str = "allgather", tp_overlap: bool = False,
                  fp32_grads: bool = False) -> LayerProfile:
    """:func:`layer_profile`, uncached; ``representatives=False`` lowers
    every tensor-parallel rank of the template (the same profile, slower:
    a test checks they agree). ``tp_ranks``: the template's ranks
    ``0..tp x ep - 1`` run on these devices (a mesh order that spreads the
    tensor-parallel group, e.g. ``dp-tp-pp``, or the expert-parallel
    group: their collectives cross the links they really cross). ``ep``:
    the template is one expert-parallel group of ``ep`` data-parallel
    ranks (dp = ep), the all-to-alls of its MoE layers timed among the
    block's own collectives, its experts' weights at their 1/ep shape."""
    import time
    started = time.perf_counter()
    config = GPTConfig(**dict(config_items))
    template_zero = 3 if zero == 3 else (1 if zero else 0)
    step, program, lower = _template(config, tp, sp, recompute, template_zero, micro_batch,
                                     untie, optimizer, representatives, fusion, split, ep,
                                     cp, cp_comm, tp_overlap, fp32_grads)
    topo = load_topology(topology)
    if tp_ranks is not None:
        topo = topo.with_ranks_first(tp_ranks)
    trace = simulate_function(program, topo, CostModel(topo.device_spec),
                              SimulationOptions(network_mode="analytical",
                                                collective_algorithm=collective_algo,
                                                comm_order=comm_order))
    layers = _TEMPLATE_LAYERS
    times = {}
    for rec in trace.ops:
        if rec.rank == 0:
            times[rec.name] = (rec.start_s, rec.end_s, rec.flops)
    rank0 = [op for op in program.ops
             if (0 in members(op) if is_communication(op) else
                 (op.outputs[0].type.device if op.outputs else op.inputs[0].type.device) == 0)]

    # -- parameters and where their gradients become final ----------------------
    by_name = {v.name: v for v in step.values()}
    param_block: Dict[str, str] = {}
    for op in step.ops:
        blk = _block_of(op.meta.get("layer"), layers)
        for v in op.inputs:
            if v.name in step.meta["params"] and v.name not in param_block and blk:
                param_block[v.name] = blk
    params: Dict[str, List[Param]] = {EMB: [], LAYER: [], HEAD: []}
    experts = set(step.meta.get("expert_params", ()))
    order: List[Tuple[str, int]] = []
    for name in step.meta["params"]:
        blk = param_block[name]
        if blk not in params:          # the other template layer: same as LAYER
            continue
        p = by_name[name]
        params[blk].append(Param(name, blk, p.type.numel, tuple(p.type.shape), p.type.dtype,
                                 expert=name in experts))
        order.append((blk, len(params[blk]) - 1))
    fill_optimizer_ops(params, rank0, times)
    index = {p.name: (blk, i) for blk, ps in params.items() for i, p in enumerate(ps)}
    gathered: set = set()
    first_reader: Dict[str, List[Tuple[str, int]]] = {}
    for op in step.ops:
        blk = _block_of(op.meta.get("layer"), layers)
        kind = "B" if "phase" in op.meta else "F"
        for v in op.inputs:
            if v.name in index and blk in params and (kind, v.name) not in gathered:
                gathered.add((kind, v.name))
                first_reader.setdefault(f"{kind}{blk}", []).append(index[v.name])
    final_last = {id(lower.sync.acc[(p, 0)]): p.name for p in lower.params}
    final_only = {id(lower.menv[(0, 0)][g]): p.name for g, p in lower.grad_of.items()}
    # where one micro-batch's sync starts: its gradient, or its fp32 buffer
    synced_only = cast_into_buffers(rank0, final_only)

    # -- blocks from rank 0's program order and timeline ------------------------
    blocks = {name: Block() for name in (EMB, LAYER, HEAD)}
    current: Optional[Tuple[str, int, str]] = None
    groups: Dict[Tuple[str, int, str], List[Op]] = {}
    #: ops of no block before any block (ZeRO-3's reshape of the first
    #: gathered parameter, the embedding's table): the block after them
    orphans: List[Op] = []
    for op in rank0:
        meta = op.meta
        mb = meta.get("microbatch")
        blk = _block_of(meta.get("layer"), layers)
        if meta.get("phase") == "optimizer" or mb is None:
            current = None
            orphans = []
            continue
        # a split backward's weight-gradient ops: the lowering's W task
        kind = "W" if meta.get("task") == "W" else "B" if "phase" in meta else "F"
        if op.op_type == "depend" or meta.get("role") == "zero_gather":
            blk = None             # ZeRO-3 gathers name the layer they prefetch for
        if blk is None and (op.op_type == "depend" or used_param_name(op) is not None):
            # ZeRO-3 (the template has no prefetch): a block's gates and the
            # reshapes of its gathered parameters come before or inside it,
            # never after: the block after them (a task's first gathers are
            # not the task before's)
            if not is_communication(op):
                orphans.append(op)
            continue
        if blk is None:            # accumulation: the block before
            if current is None:
                if not is_communication(op):
                    orphans.append(op)
                continue
            key = current
        else:
            key = (kind, mb, blk)
        group = groups.setdefault(key, [])
        if orphans:
            group.extend(orphans)
            orphans = []
        group.append(op)
        current = key
    compute_end: Dict[Tuple[str, int, str], float] = {}
    ordered = sorted(groups, key=lambda k: max(times[o.name][1] for o in groups[k]
                                               if not is_communication(o)))
    group_start: Dict[Tuple[str, int, str], float] = {}
    prev_end = 0.0
    for key in ordered:
        ops = [o for o in groups[key] if not is_communication(o)]
        end = max(times[o.name][1] for o in ops)
        compute_end[key] = end - prev_end
        group_start[key] = prev_end
        prev_end = end

    def stats(key):
        ops = groups.get(key, [])
        comp = [o for o in ops if not is_communication(o)]
        comm = [o for o in ops if is_communication(o)]
        busy = sum(times[o.name][1] - times[o.name][0] for o in comp)
        flops = sum(times[o.name][2] for o in comp)
        # the tensor-parallel collectives (no role: not ZeRO-3's gathers,
        # the data-parallel sync or a pipeline transfer)
        tcomm = sum(times[o.name][1] - times[o.name][0] for o in comm if block_collective(o))
        return compute_end.get(key, 0.0), busy, flops, tcomm

    def tp_spans(key):
        # the tensor-parallel collectives (as ``stats`` counts them), from
        # the block's start (the compute before it ends)
        at = group_start.get(key, 0.0)
        return tuple(sorted((times[o.name][0] - at, times[o.name][1] - at)
                            for o in groups.get(key, [])
                            if block_collective(o)))

    step_flops, saved, (fwd, bwd, kept, sent_back, fwd_split, bwd_split), partition = _step_facts(
        _template_config(config, micro_batch), tp, sp, recompute, micro_batch, untie, fusion, ep,
        cp, cp_comm, tp_overlap)
    # the values a layer's backward sends to the stage before (its input
    # gradient), per micro-batch of the template: where each is made
    sent = {mb: {f"{n}_m{mb}_r0" for n in sent_back} for mb in (0, 1, LAST_MB)}
    outs = {mb: {id(v) for op in groups.get(("B", mb, LAYER), []) for v in op.outputs
                 if v.name in sent[mb]} for mb in (0, 1, LAST_MB)}
    # what the forward made (and the program's inputs): a backward's
    # collective reading only those waits for none of the backward's compute
    forward_made = {id(v) for v in program.inputs}
    forward_made.update(id(v) for op in program.ops if "phase" not in op.meta
                        for v in op.outputs)
    for name, blk in blocks.items():
        blk.f, blk.f_busy, blk.f_flops, blk.tp_comm_f = stats(("F", 0, name))
        blk.b_first, blk.b_first_busy, blk.b_flops, blk.tp_comm_b = stats(("B", 0, name))
        blk.f_tp_spans = tp_spans(("F", 0, name))
        blk.b_tp_spans = (tp_spans(("B", 0, name)), tp_spans(("B", 1, name)),
                          tp_spans(("B", LAST_MB, name)))
        blk.b_last, blk.b_last_busy, _, _ = stats(("B", LAST_MB, name))
        blk.b_mid, blk.b_mid_busy, _, _ = stats(("B", 1, name))
        gates = gathered_uses(rank0, params, first_reader.get(f"B{name}", []), template_zero)
        blk.last = compress_segments(groups.get(("B", LAST_MB, name), []), times, final_last,
                                     gates, outs[LAST_MB], forward_made)
        blk.only = compress_segments(groups.get(("B", 0, name), []), times, synced_only, gates,
                                     outs[0], forward_made)
        blk.mid = compress_segments(groups.get(("B", 1, name), []), times, {}, gates, outs[1],
                                    forward_made)
        if ("B", 0, name) in groups:
            fill_lead(blk, groups[("B", 0, name)], times, group_start[("B", 0, name)])
        blk.f_pre, blk.f_post = edges(compress_segments(groups.get(("F", 0, name), []), times, {}))
        if template_zero == 3:
            blk.f_segs = compress_segments(
                groups.get(("F", 0, name), []), times, {},
                gathered_uses(rank0, params, first_reader.get(f"F{name}", []), template_zero))
        blk.b_pre, blk.b_post = edges(blk.only)
    # The embedding's tensor-parallel collective (its all-reduce, or reduce-
    # scatter with sp) ends its forward, and the first layer's compute waits
    # for it: the template's first layer carries that wait, the
    # representative layer every layer is timed by does not. It belongs to
    # the embedding's forward.
    first = ("F", 0, f"{LAYER}0")
    if first in compute_end and ("F", 0, EMB) in groups:
        blocks[EMB].f += max(0.0, compute_end[first] - blocks[LAYER].f)
    for name, blk in blocks.items():
        blk.f_gather = list(dict.fromkeys(first_reader.get(f"F{name}", [])))
        blk.b_gather = list(dict.fromkeys(first_reader.get(f"B{name}", [])))
        if template_zero == 3:
            blk.f_gates = read_gates(groups.get(("F", 0, name), []), times, params, blk.f_gather)
            blk.b_gates = read_gates(groups.get(("B", 0, name), []), times, params, blk.b_gather)
    layer = blocks[LAYER]
    made_by = {id(v): op.name for op in rank0 for v in op.outputs}
    issued = issued_after(rank0, times) if comm_order == "stream" else {}
    layer.out_tail_first = out_tail(groups.get(("B", 0, LAYER), []), times, outs[0])
    layer.out_tail_mid = out_tail(groups.get(("B", 1, LAYER), []), times, outs[1])
    for name, blk in blocks.items():
        blk.comm_tail_first = comm_tail(groups.get(("B", 0, name), []), times)
        blk.comm_tail_mid = comm_tail(groups.get(("B", 1, name), []), times)
        blk.b_wait_first = first_wait(groups.get(("B", 0, name), []), times, made_by,
                                       forward_made, issued)
        blk.b_wait_mid = first_wait(groups.get(("B", 1, name), []), times, made_by,
                                     forward_made, issued)
    for blk, (f, b) in step_flops.items():
        blocks[blk].step_f_flops, blocks[blk].step_b_flops = f, b
    weight = _weight_blocks(blocks, groups, times, stats, tp_spans, final_last, synced_only,
                            forward_made, lower, program, index) if split else {}
    for blk, nbytes in saved.items():
        blocks[blk].saved_bytes = nbytes
    data_emb, data_head = memory_excess(blocks, groups, times, trace, program, params, rank0,
                                        final_only, weight, (final_last, synced_only))
    return LayerProfile(blocks, params, order, list(fwd), list(bwd), bool(step.meta.get("tied")),
                        lower.master_dtype, dict(partition), time.perf_counter() - started, kept,
                        data_emb, data_head, weight, forward_split=fwd_split,
                        backward_split=bwd_split)


def _weight_blocks(blocks: Dict[str, Block], groups, times, stats, tp_spans,
                   final_last: Dict[int, str], final_only: Dict[int, str], forward_made: set,
                   lower: LowerSPMD, program: Function,
                   index: Dict[str, Tuple[str, int]]) -> Dict[str, Block]:
    """A split backward's weight-gradient part of each block (the ops the
    template's lowering moved to its W tasks,
    :func:`~distsim.transforms.backward_split.weight_gradient_ops`), as a
    :class:`Block` whose backward fields are W's: its times per micro-batch
    class, op by op with the gradients it makes final, its tensor-parallel
    collectives. The B part stays in ``blocks`` (their backward fields
    measured on the B tasks); each part's FLOPs as LowerSPMD's task
    ordering counts them (its tasks' ops). A W part's ``saved_bytes``: what
    it reads that the forward or the B part made (a micro-batch's, rank
    0's), which lives from the B task until the W task instead of being
    freed by B; ``reads_data``: whether it reads a data input; ZeRO 3,
    ``b_gather``: the parameters its W task gathers (``index``: parameter
    name -> (block, position)), as the lowering decides
    (``task_layer_params``: none in a GPT, whose weight gradients read no
    weight)."""
    roles = program.meta.get("roles", {})
    data = {id(v) for v in program.inputs if roles.get(v.name) == "data"}
    made = {id(v): held_bytes(op, k) for op in program.ops if op.meta.get("task") != "W"
            for k, v in enumerate(op.outputs)}
    # what a W task reads that its B task (or the forward) made: a collective
    # reading only those waits for none of W's compute
    before = made.keys() | forward_made
    task_flops: Dict[Tuple[str, str], float] = {}
    for (kind, _), ops in lower.task_ops.items():
        for op in ops:
            blk = _block_of(op.meta.get("layer"), _TEMPLATE_LAYERS)
            if blk in blocks and kind != "F":
                task_flops[(kind, blk)] = task_flops.get((kind, blk), 0.0) + op_flops(op)
    weight: Dict[str, Block] = {}
    for name, part in blocks.items():
        part.step_b_flops = task_flops.get(("B", name), 0.0)
        w = weight[name] = Block(step_b_flops=task_flops.get(("W", name), 0.0))
        w.b_first, w.b_first_busy, w.b_flops, w.tp_comm_b = stats(("W", 0, name))
        w.b_mid, w.b_mid_busy, _, _ = stats(("W", 1, name))
        w.b_last, w.b_last_busy, _, _ = stats(("W", LAST_MB, name))
        w.b_tp_spans = tuple(tp_spans(("W", mb, name)) for mb in (0, 1, LAST_MB))
        w.last = compress_segments(groups.get(("W", LAST_MB, name), []), times, final_last,
                                   None, None, before)
        w.only = compress_segments(groups.get(("W", 0, name), []), times, final_only, None,
                                   None, before)
        w.mid = compress_segments(groups.get(("W", 1, name), []), times, {}, None, None, before)
        w.b_pre, w.b_post = edges(w.only)
        w.comm_tail_first = comm_tail(groups.get(("W", 0, name), []), times)
        w.comm_tail_mid = comm_tail(groups.get(("W", 1, name), []), times)
        ops = groups.get(("W", 0, name), [])
        read = {id(v) for op in ops for v in op.inputs if id(v) in made}
        w.saved_bytes = sum(made[i] for i in read)
        w.reads_data = any(id(v) in data for op in ops for v in op.inputs)
    for layer, used in lower.task_layer_params.get(("W", 0), []):
        name = _block_of(layer, _TEMPLATE_LAYERS)
        if name in weight:
            weight[name].b_gather.extend(index[p.name] for p in used if p.name in index)
    return weight


#: The optimizer ops of a parameter ``p`` on rank 0 of the template, by the
#: name that follows ``p``: ``_gflat_r0`` flattens the gradient, ``_new_r0``
#: reshapes the new parameter, ``_r0`` (the rest) update the master weights
#: and moments.
