"""A fast estimate of a GPT training step: tens of milliseconds instead of a build
and a simulation (about 30 ms for a GPT-3 175B point on 1024 GPUs once its
layer profile is built).

    from distsim.estimate import estimate
    row = estimate({"model": "gpt3-175b", "topology": "dgx-a100-x128",
                    "tp": 8, "pp": 16, "micro_batch": 1})
    row["step_time_s"], row["max_peak_memory_bytes"], row["oom"]

:func:`estimate` takes the options of ``distsim simulate`` and returns the
columns of a sweep row (:data:`distsim.sweep.point.METRICS` and the
resolved batch sizes). It never builds the whole program:

1. **Per-layer times** (:mod:`.profile`): a two-layer copy of the
   model on one tensor-parallel group (under expert parallelism, one
   expert-parallel group of them: dp = ep, each MoE block's all-to-alls in
   it; with context parallelism too, lcm(ep, cp) ranks of the dp x cp
   axis: :func:`.experts.template_dp`), lowered and simulated for real
   (cost model, tensor-parallel collectives on the topology, analytical
   network), cached per model shape / tp / sp / recompute / micro-batch / ep
   / the backward's tensor-parallel order (``tp_overlap``).
   With context parallelism (``cp`` > 1) the group is tp x cp: the
   attention's all-gathers, ring steps (send/receives on their pairs'
   queues) or all-to-alls and their overlap with attention are the real
   program's; its gradients stay local (``LowerSPMD(local_gradients=
   True)``), and the estimate takes the lowering's flat view of the mesh
   (:meth:`~distsim.transforms.strategy.Strategy.flat_cp`): the cp ranks
   join the data-parallel gradient sync and ZeRO shards, dp x cp of them,
   as Megatron-LM reduces over them.
2. **The pipeline** (:mod:`.timeline` on :mod:`.engine`): one rank per stage,
   its compute and communication streams, and the items :class:`LowerSPMD`
   would emit, in the same program order of tasks and sends (the same
   :func:`~distsim.transforms.pipeline.program_order`): each forward / backward
   task as one item (holding the communication stream when it has
   tensor-parallel collectives; under ``zb-h1`` each backward as its B and
   W tasks, from the template's own split:
   :attr:`.blocks.LayerProfile.weight`), the last backward of each chunk op by
   op (ZB-H1: its B and its W; ZeRO 2/3 reduce-scattering each micro-batch:
   every backward, B and W each) with the data-parallel gradient sync emitted
   where LowerSPMD emits it (per gradient, in buckets, or after the backward;
   all-reduce or ZeRO reduce-scatter), the tied-embedding all-reduce, the
   optimizer per parameter (ZeRO shards, the all-gather after the update),
   ZeRO-3 parameter gathers per layer and task (by parameter, or with
   ``zero3_unit: layer`` a layer's as one, its gradients reduce-scattered as
   one: :mod:`.units`), and pipeline send/receives. Collective times are the
   simulator's analytical ones on the real teams (:func:`run_collective` on an
   analytical :class:`~distsim.sim.network.Network`).
3. **Memory** (:func:`estimate_memory`): weights, gradients and optimizer
   state per rank from the parameter shapes and the ZeRO stage, plus the
   saved activations of the micro-batches in flight on each stage
   (:func:`~distsim.transforms.memory_model.saved_activation_bytes` of the
   template; under ZB-H1 what a W reads lives until that W) and the
   template's transient peak.

How close it comes to the full simulation is measured by
``tests/estimate/test_agreement_corpus.py`` at :data:`AGREEMENT_TOLERANCE`
on random configurations, and by the random sample of
``reports/estimator/`` (251 small GPT / Llama points: step time within
0.84 %, memory past 1 % on 4, up to 1.8 %: ZeRO 3 cases listed in its
README; ZeRO 3 by layer's memory keeps the whole-from-the-start bound of
:func:`.profile_memory.prefetched_bytes`). Collectives are the
analytical network's, one team alone, but for the pipeline transfers
under ``network_mode: flow`` (the simulation's default): those that share
links at once are timed together, as the flow network runs them
(:mod:`.shared_links`). Other teams that share links at once (a PCIe
workstation's dp x tp) run slower in the flow simulation.
Blocking launches (``launch: blocking``, :mod:`distsim.sim.launch_queue`)
are refused with a NotModelledError: the timeline overlaps a device's
compute and communication streams, which blocking launches serialise.
Stream order (``comm_order: stream``) is modelled: the template is
simulated under it (its tensor-parallel collectives), and every
communication item of the timeline (pipeline transfers, gradient syncs,
ZeRO's gathers and reduce-scatters, the optimizer's all-gathers) starts
no earlier than the end of the compute its stages issued before it
(:meth:`.engine.Timeline.issued`). The backward's tensor-parallel
collectives issued before the weight-gradient GEMMs (``tp_overlap``,
:mod:`distsim.transforms.tp_order`) are modelled by lowering the template
in that order: the block times, the last backward op by op and the
transient memory are read from it, and nothing outside a block depends on
where its collectives sit (measured by the corpus's tp_overlap draws).
Gradient buffers in fp32 (``fp32_grads``,
:func:`~distsim.transforms.sync_policy.grad_buffer_dtype`) are modelled
likewise: the template is lowered with them (each gradient's cast and
fp32 add, the update reading fp32 gradients, their memory), the timeline
moves them at their width (all-reduces, buckets, the tied-embedding sum,
ZeRO 1's slice; with one micro-batch a gradient's sync starts after its
cast) and the memory walk counts them so. Refused with ZeRO 2/3 over dp >
1 (there each micro-batch's gradient is reduce-scattered in its own dtype
and cast on the shard, which the walk does not separate). Measured by the
corpus's fp32_grads draws. A gradient bucket flushed inside a block (fp32
buckets fill sooner) is held through the rest of the block: on top of the
block's excess after the gradient whose sync flushed it
(:attr:`.blocks.Block.b_after`).
Under ``comm_streams: per-group`` (a communication stream per process
group, :mod:`distsim.sim.comm_queues`) the timeline gives each stage a
data-parallel stream beside the tensor-parallel one (:mod:`.engine`);
ZeRO-3's parameter gathers run on the data-parallel stream, so a block's
task with tensor-parallel collectives is emitted entry by entry
(:func:`.gates.emit_entries`: its compute waits for each gather where it
reads the parameter, its collectives only for their inputs).
Only the ``gpt`` family is supported (other models are a ConfigError),
mixtures of experts included: each layer is timed and counted by the block
of its kind (:mod:`.layer_kinds`). Under expert parallelism (``ep`` > 1)
each parameter is synchronised, ZeRO-sharded and updated over its team
(dp, or dp / ep for an expert's weights:
:func:`~distsim.transforms.sync_policy.sync_team`), by a sync policy per
team as the lowering's (:mod:`.experts`). Under ZeRO 3 (by parameter) the
template keeps its gradients local and gathers over no team, and the walk
gathers each parameter over its own team, in the lowering's order
(the others' first, then the experts':
:func:`~distsim.transforms.sync_policy.layer_gathers`); a MoE block is
emitted entry by entry
(:func:`.gates.entrywise`: the experts' reshapes run while the dispatch's
all-to-all waits behind their gathers). ZeRO 2 or 3 with ``ep`` = dp (the
experts' gradients whole beside the others reduce-scattered) and ZeRO 3
by layer with ``ep`` > 1 (two units per MoE block) are refused with a
NotModelledError.
Under context parallelism with ZeRO 3 the template gathers over no team
(its gradients local: each rank holds its parameters whole, as at dp 1)
and the walk gathers and reduce-scatters each parameter over its dp x cp
team, the same for every ``cp_comm``. Context parallelism is measured
by the corpus's cp draws (cp 2 and 4, every ``cp_comm``) and a random
sample of 127 such points drawn as they are, gradient buckets included
(step time within 0.49 %, mean 0.03 %; memory within 0.49 %, mean
0.02 %).
"""
from __future__ import annotations

import math
from dataclasses import replace

from functools import lru_cache
from typing import Any, Dict, Mapping, Optional, Tuple


from ..cost.device import check_compute_dtype
from ..errors import ConfigError, DistsimError, NotModelledError, PassPreconditionError
from ..ir.core import gc_paused
from ..ir.types import DType
from ..keywords import plain, unknown_name
from ..models import check_batch_options, load_model_config
from ..models.gpt_family import gpt_config, model_flops_per_step, resolve_batch, validate
from ..sim.comm_queues import DEFAULT_COMM_STREAMS, check_comm_streams
from ..sim.launch_queue import (DEFAULT_COMM_ORDER, DEFAULT_LAUNCH, DEFAULT_P2P, check_comm_order,
                                check_launch, check_p2p)
from ..run_options import (DEFAULT_NETWORK_MODE, check_max_ops, check_max_trace_records,
                           check_network_mode)
from ..topology import load_topology
from ..transforms.pipeline import SPLIT_BACKWARD
from ..transforms.strategy import Strategy, check_field, fusion_for
from ..transforms.sync_policy import grad_buffer_dtype, sync_team
from ..transforms.zero import check_shardable
from .blocks import LayerProfile
from .experts import template_dp
from .profile import layer_profile, model_key, param_sizes
from .memory import estimate_memory
from .context import Case, StepContext
from .time_split import PARTS, figures
from .timeline import Builder, Memo, shared_prefix

__all__ = ["AGREEMENT_TOLERANCE", "Case", "cache_key", "check_zero_shards", "estimate",
           "estimate_memory", "extrapolation_lengths", "profile_key", "resolve",
           "symmetry_applies", "timeline_figures"]

#: The estimate's error bound against :func:`distsim.simulate` (analytical
#: network), relative, on step time and on peak memory: what every test
#: that compares the two asserts (the agreement corpus among them).
AGREEMENT_TOLERANCE = 0.01

#: Options the estimate ignores (they change how a simulation is run, not
#: what it computes), but ``network_mode``, which :func:`resolve` reads
#: apart (:attr:`.context.Case.network_mode`).
#: ``symmetry`` is not among them: it changes which ZeRO points the
#: simulator accepts (:func:`check_zero_shards`).
IGNORED = ("network_mode", "max_trace_records", "max_ops", "coarsen", "fidelity")
_MODEL_FIELDS = ("layers", "hidden", "batch", "dtype", "seq", "heads", "kv_heads", "ffn", "vocab",
                 "attention", "attention_kernel", "routing_skew", "capacity_factor",
                 "dispatch")
#: Every option an estimate takes (the names an unknown one is compared with).
_KNOWN = (*IGNORED, *_MODEL_FIELDS, *Strategy.__dataclass_fields__, "model", "topology",
          "collective_algo", "comm_streams", "launch", "comm_order", "p2p", "train",
          "input_shapes")




# -- resolving the options ---------------------------------------------------------
@lru_cache(maxsize=64)
def _model_config_once(model: str) -> Dict[str, Any]:
    return load_model_config(model)


def _model_config(model: str) -> Dict[str, Any]:
    """:func:`load_model_config` of a model name or file, read once per
    process (a sweep resolves the same model for every point); a copy."""
    return dict(_model_config_once(model))


def check_ignored(options: Mapping[str, Any]) -> None:
    """The options the estimator does not use (:data:`IGNORED`) checked as
    :func:`distsim.simulate` checks them: a value simulate refuses is not
    silently estimated."""
    if "network_mode" in options:
        check_network_mode(options["network_mode"])
    if options.get("max_ops") is not None:
        check_max_ops(options["max_ops"])
    if options.get("max_trace_records") is not None:
        check_max_trace_records(options["max_trace_records"])
    if options.get("coarsen") is not None:
        check_field("coarsen", options["coarsen"])


def _not_modelled(what: str) -> NotModelledError:
    """The one-line refusal of a valid option the estimator does not model
    (a sweep skips such a point with it; a search simulates it)."""
    return NotModelledError(f"estimate: {what} is not modelled by the estimator; use "
                            "fidelity: simulate")


def resolve(options: Mapping[str, Any]) -> Case:
    """Resolve ``distsim simulate`` options as :func:`distsim.api.build_program`
    does, and check them as the GPT family does (a ConfigError otherwise)."""
    options = plain(options)        # numpy numbers as Python's, as distsim.simulate takes them
    check_ignored(options)
    opts = {k: v for k, v in options.items() if k not in IGNORED}
    model = opts.pop("model", "gpt")
    topology = opts.pop("topology", "dgx-a100")
    algo = str(opts.pop("collective_algo", "auto") or "auto")
    comm_streams = check_comm_streams(opts.pop("comm_streams", DEFAULT_COMM_STREAMS))
    if check_launch(opts.pop("launch", DEFAULT_LAUNCH)) == "blocking":
        # its timeline overlaps each device's compute and communication
        raise _not_modelled("launch 'blocking' (every kernel launch waiting for its kernel, "
                            "no compute/communication overlap)")
    comm_order = check_comm_order(opts.pop("comm_order", DEFAULT_COMM_ORDER))
    p2p = check_p2p(opts.pop("p2p", DEFAULT_P2P))
    if p2p != DEFAULT_P2P and comm_order != "stream":
        # its timeline holds what comes after a group of transfers behind
        # the stage's compute (:mod:`.p2p_groups`), which only stream order reads
        raise _not_modelled(f"p2p '{p2p}' with comm_order '{comm_order}'")
    config = _model_config(model) if isinstance(model, str) else load_model_config(model)
    if config.get("family") != "gpt":
        raise ConfigError(f"estimate: model '{config.get('name')}' is of the "
                          f"'{config.get('family')}' family; the estimator covers GPT models "
                          "(use fidelity: simulate)")
    check_batch_options(opts.get("batch"), opts.get("global_batch"))
    for key in _MODEL_FIELDS:
        value = opts.pop(key, None)
        if value is not None:
            if key == "batch":
                key = "global_batch"
            elif key == "dtype":
                value = DType.parse(str(value)).value
            config[key] = value
    for key in ("train", "input_shapes"):
        opts.pop(key, None)
    unknown = sorted(set(opts) - set(Strategy.__dataclass_fields__))
    if unknown:
        raise unknown_name("estimate", unknown[0], _KNOWN, "option")
    if not isinstance(topology, str):
        raise ConfigError("estimate: topology must be a name or a .yaml path")
    topo = load_topology(topology)
    strategy = Strategy.from_mapping(opts).resolved(topo.num_devices)
    if strategy.num_devices != topo.num_devices:
        raise ConfigError(f"dp x tp x pp = {strategy.dp} x {strategy.tp} x {strategy.pp} = "
                          f"{strategy.num_devices} does not match the {topo.num_devices} devices "
                          f"of topology '{topo.name}'")
    c = gpt_config(config)
    check_compute_dtype(topo.device_spec, c.dtype, config.get("name"), topo.source)
    m = validate(c, strategy)
    check_expert_parallel(strategy)
    c, _ = resolve_batch(c, strategy)
    flat = strategy.flat_cp()
    if _widens_grads(strategy, c) and flat.zero >= 2 and flat.dp > 1:
        # its walk reduce-scatters each micro-batch's gradient in the buffer's dtype
        raise _not_modelled(f"fp32_grads with ZeRO {flat.zero} over dp {flat.dp}")
    # the lowering's view of context parallelism: its ranks are data-parallel
    # ranks for the weights (gradients synchronised, ZeRO-sharded over dp x
    # cp); the per-layer profile holds its attention collectives
    return Case(config, c, flat, m, topo, topology, algo, comm_streams,
                comm_order, strategy.cp, strategy.cp_comm,
                network_mode=options.get("network_mode") or DEFAULT_NETWORK_MODE, p2p=p2p)


def _widens_grads(S: Strategy, c: Any) -> bool:
    """Whether ``fp32_grads`` makes the gradient buffers of model ``c``
    wider than its parameters (never for an fp32 model:
    :func:`~distsim.transforms.sync_policy.grad_buffer_dtype`)."""
    dtype = DType.parse(str(c.dtype))
    return grad_buffer_dtype(S, dtype) != dtype


def check_expert_parallel(S: Strategy) -> None:
    """Refuse the expert-parallel points with context parallelism whose
    experts' gradient sync the estimator does not walk within its bound.
    Without context parallelism every expert-parallel point is modelled:
    ZeRO 2/3 with dp = ep (the experts' team one rank, their gradients
    kept whole and accumulated in place, :meth:`.context.StepContext.scatters`;
    under ZeRO 3 their weights not gathered, :func:`.gates.gather_plan`),
    ZeRO 3 by parameter with ep < dp (each parameter gathered over its own
    team, :func:`~distsim.transforms.sync_policy.layer_gathers`) and ZeRO 3
    by layer (a MoE block's two units, the others' over dp and the
    experts' over dp / ep, :attr:`.gates.GatherPlan.units`). With context
    parallelism the teams are cut from the dp x cp ranks (``S``
    unflattened; :meth:`~distsim.transforms.strategy.Strategy.flat_cp` is
    the walk's view), modelled alike but for the cases measured past the
    bound: under ZeRO 3 an experts' team of more than one rank (ep < dp x
    cp: peak memory 1.4 % over, DeepSeekMoE dp 4 cp 2 ep 2), ring
    attention (step time 1.5-1.7 % over, the MoE block's gathers beside the
    ring's steps; DeepSeekMoE and Mixtral, cp 4, ep 2 and 4) and ZeRO 3 by
    layer (not measured with cp); and ZB-H1's split backward under ZeRO 2
    (peak memory 1.1 % over at ep 2 of 4, 3.2-4.9 % at ep = dp x cp: the
    GShard-style mix, tp 2, pp 2, cp 4, ``bucket_mb`` 0; DeepSeekMoE pp 2,
    cp 2, ep 2, 4.3 %)."""
    if S.ep == 1 or S.cp == 1:
        return
    if S.zero == 3 and S.zero3_unit == "layer":
        raise _not_modelled(f"expert parallelism with context parallelism under ZeRO 3 by "
                            f"layer (ep {S.ep}, cp {S.cp}, zero3_unit 'layer')")
    team = sync_team(S.flat_cp(), True)
    if S.zero == 3 and team > 1:
        raise _not_modelled(f"expert parallelism with context parallelism under ZeRO 3 with "
                            f"ep < dp x cp (ep {S.ep}, cp {S.cp}: the experts' team of {team} "
                            "ranks)")
    if S.zero == 3 and S.cp_comm == "ring":
        raise _not_modelled(f"expert parallelism under ZeRO 3 with ring attention (ep {S.ep}, "
                            f"cp {S.cp}, cp_comm 'ring')")
    if S.zero == 2 and S.schedule in SPLIT_BACKWARD:
        raise _not_modelled(f"expert parallelism with context parallelism under ZeRO 2 and "
                            f"schedule '{S.schedule}' (ep {S.ep}, cp {S.cp})")


def check_weight_gathers(case: Case, profile: LayerProfile) -> None:
    """Refuse a split backward under ZeRO 3 whose weight-gradient (W)
    tasks gather parameters (:attr:`.blocks.Block.b_gather` of the
    profile's :attr:`~.blocks.LayerProfile.weight`): the walk gathers in
    the forward and B tasks only (:attr:`.context.StepContext.gathering`).
    A GPT's W tasks read no weight, so none is refused."""
    S = case.strategy
    if S.zero == 3 and S.dp > 1 and any(w.b_gather for w in profile.weight.values()):
        raise _not_modelled(f"schedule '{S.schedule}' with ZeRO 3 over dp {S.dp} gathering "
                            "parameters in its weight-gradient tasks")


def check_zero_shards(case: Case, symmetric: Optional[bool] = None) -> None:
    """Refuse, as the simulator's lowering does (the same
    :func:`~distsim.transforms.zero.check_shardable`, a
    PassPreconditionError), a ZeRO point whose parameters do not shard
    over dp: ZeRO 2/3 with a parameter smaller than dp, or (``symmetric``,
    default the strategy's ``symmetry``) one that does not split evenly."""
    S, c = case.strategy, case.config
    if S.zero == 0 or S.dp == 1:
        return
    check_shardable(S.zero, S.dp, param_sizes(_one_microbatch(c), S.tp, S.sp, S.pp > 1),
                    S.symmetry if symmetric is None else symmetric)


def symmetry_applies(options: Mapping[str, Any]) -> bool:
    """Whether a full simulation of these (valid) GPT options may use
    ``symmetry``: False when its ZeRO shards would differ between ranks
    (the simulator refuses that program; simulate it without symmetry)."""
    try:
        check_zero_shards(resolve(options), symmetric=True)
    except PassPreconditionError:
        return False
    return True


# -- the public function ---------------------------------------------------------
def _one_microbatch(c: Any) -> Tuple[Tuple[str, Any], ...]:
    """The model config of one micro-batch as a hashable key of the
    cached per-layer work (:func:`layer_profile`, :func:`param_sizes`)."""
    return model_key(replace(c, global_batch=c.micro_batch))


def profile_key(case: Case) -> Tuple[Any, ...]:
    """The arguments of :func:`layer_profile` for ``case``: the key of the
    per-layer profile its estimate uses (model shape of one micro-batch,
    tp, sp, recomputation, ZeRO kind, micro-batch, whether a pipeline
    unties the head, topology, collective algorithm, optimizer, the
    first tensor-parallel group's devices where the mesh order spreads
    them, the kernel fusion, whether the backward is split, the
    expert-parallel degree, the collectives' ``comm_order``, context
    parallelism: ``cp`` and ``cp_comm``, and whether the backward's
    tensor-parallel collectives come before the weight-gradient GEMMs:
    ``tp_overlap`` with tp > 1, and whether ``fp32_grads`` widens the
    gradient buffers)."""
    c, S = case.config, case.strategy
    zero_kind = 3 if S.zero == 3 else (1 if S.zero else 0)
    # the first tensor-parallel group's devices (and those of the first
    # expert-parallel group's ranks, or of the first context-parallel
    # group's, the first ``cp`` of the flat data-parallel axis, in the
    # template's rank order): not 0..n - 1 under a mesh order that spreads
    # them (dp-tp-pp, ...), and their collectives cross what those devices'
    # links cross
    team = template_dp(S.ep, case.cp) * case.cp
    tp_ranks: Optional[Tuple[int, ...]] = tuple(S.rank(d, 0, t) for d in range(team)
                                                for t in range(S.tp))
    if tp_ranks == tuple(range(S.tp * team)):
        tp_ranks = None
    return (_one_microbatch(c), S.tp, S.sp, S.recompute, zero_kind, c.micro_batch, S.pp > 1,
            case.topology_name, case.collective_algo, S.optimizer, tp_ranks,
            fusion_for(S, "gpt"), S.schedule in SPLIT_BACKWARD, S.ep, case.comm_order, case.cp,
            case.cp_comm, S.tp_overlap and S.tp > 1, _widens_grads(S, c))


def cache_key(options: Mapping[str, Any]) -> Optional[Tuple[Any, ...]]:
    """The key of what :func:`estimate` of ``options`` builds once and
    keeps (the per-layer profile): estimates with equal keys share it, so
    a sweep hands them to one worker together. ZeRO 0 and ZeRO 1 / 2
    share one (ZeRO 0's profile is derived from ZeRO 1's template:
    :func:`.profile.without_zero`). None for options the estimator
    refuses (they build nothing)."""
    try:
        key = profile_key(resolve(options))
    except DistsimError:
        return None
    return key[:4] + (key[4] or 1,) + key[5:]


def _profile_for(case: Case) -> LayerProfile:
    return layer_profile(*profile_key(case))


def _run_timeline(case: Case, profile: LayerProfile, memo: Optional[Memo] = None
                  ) -> Dict[str, float]:
    """:func:`.time_split.figures` of the timeline of ``case`` (``memo``: shared with
    the other timelines of the configuration)."""
    builder = Builder(case, profile, memo)
    return figures(builder, builder.build())


def _with_microbatches(case: Case, m: int) -> Case:
    c = replace(case.config, global_batch=case.strategy.dp * m * case.config.micro_batch)
    return replace(case, config=c, microbatches=m,
                   strategy=replace(case.strategy, microbatches=m, global_batch=c.global_batch))


def extrapolation_lengths(strategy: Strategy) -> Tuple[int, int]:
    """The micro-batch counts of the two timelines :func:`timeline_figures`
    extrapolates from: ``pp + 1`` and ``pp + 2``, three rounds and four of
    ``pp`` when interleaved (from two rounds the time split is not yet
    periodic: the exposed communication once a pipeline exchange's two ways
    move at once, off by 1 % on a GPT-2 pp 2 case; with the loss in float32
    a pipeline transfer under a tensor-parallel collective first in the
    third round, a once-only 2e-3 of the communication time that two and
    three rounds count per micro-batch). Without a pipeline 2 and 3: one stage runs its
    tasks one after the other, so the first micro-batch and the last
    already frame the periodic part (checked on the GPT-3 space's 72
    points with pp 1, every figure as from 3 and 4 to 7e-13; with a
    pipeline, ``pp`` and ``pp + 1`` are not yet periodic: step times off by
    up to 2e-3). ZB-H1 under ZeRO 3 by layer over dp > 1, ``pp + 2`` and
    ``pp + 3``: a unit's gradients come from a B and a W task and are
    settled at the stage's next unit, which with full recomputation and no
    prefetch is periodic a micro-batch later (pp 2 and 4: step times off
    by 1.9 % and 1.0 % from ``pp + 1`` and ``pp + 2``)."""
    if strategy.schedule == "interleaved":
        return 3 * strategy.pp, 4 * strategy.pp
    m1 = strategy.pp + 1 if strategy.pp > 1 else 2
    if strategy.schedule in SPLIT_BACKWARD and strategy.zero == 3 and strategy.dp > 1 \
            and strategy.zero3_unit == "layer":
        m1 += 1
    return m1, m1 + 1


def timeline_figures(case: Case, profile: LayerProfile, memo: Optional[Memo] = None
                     ) -> Dict[str, float]:
    """:func:`_run_timeline`, for long schedules by extrapolation. Once the
    1F1B pipeline is full (past ``pp`` micro-batches; interleaved: past a
    round of ``pp``) it is periodic: every figure grows by the same amount
    per micro-batch, so ``M`` micro-batches cost two timelines of the
    :func:`extrapolation_lengths` instead of one of ``M``. Checked against
    the full timeline on the 744 valid points of the GPT-3 175B benchmark
    space: the same step time to 1e-9 but for three ZeRO-3 points with 32
    stages (7e-5), as with the longer timelines used before; tests check it
    on GPT-2 configurations. The two timelines emit the same items until
    the shorter one's pipeline drains (about three quarters of its tasks):
    that part is emitted once and the walk forked
    (:meth:`Builder.resume`), with the same figures as two walks. GPipe's
    all-forward then all-backward order is not periodic in that sense:
    always direct; nor is a pipeline whose engine waits for its transfers
    (``p2p`` not ``async``) from those lengths on (its waits reach the
    periodic regime later: ZB-H1 over two stages adds 3.62 ms from three
    micro-batches to four, 3.42 ms each after), so it is direct too.
    ``memo``: what the timelines share (:class:`.timeline.Memo`)."""
    S, m = case.strategy, case.microbatches
    if S.schedule == "gpipe" or case.p2p != DEFAULT_P2P:
        return _run_timeline(case, profile, memo)
    m1, m2 = extrapolation_lengths(S)
    if m <= 2 * m2 - m1:
        return _run_timeline(case, profile, memo)
    memo = Memo() if memo is None else memo
    memo.record_last_backwards = True       # the long timeline replays the short's
    short = Builder(_with_microbatches(case, m1), profile, memo)
    short.note_received = False
    long = Builder(_with_microbatches(case, m2), profile, memo)
    w1, w2 = short.walk(), long.walk()
    short.advance(w1, shared_prefix(w1, w2, m1 - 1))
    w2 = long.resume(short, w1, w2)
    a = figures(short, short.complete(w1))
    b = figures(long, long.complete(w2))
    return {k: a[k] + (m - m1) * (b[k] - a[k]) / (m2 - m1) for k in a}


def estimate(config: Mapping[str, Any]) -> Dict[str, Any]:
    """Estimate one configuration (``distsim simulate`` options, e.g.
    ``{"model": "gpt3-175b", "topology": "dgx-a100-x128", "tp": 8, "pp": 16}``).

    Returns the columns of a sweep row: ``step_time_s``, ``samples_per_s``,
    ``tokens_per_s``, ``mfu``, ``max_peak_memory_bytes``,
    ``memory_capacity_bytes``, ``oom``, ``bubble_fraction``, ``bubble_s``,
    ``compute_s``, ``communication_s``, ``exposed_communication_s``,
    ``idle_s``, ``num_devices``, ``total_flops``, and the resolved
    ``dp``, ``global_batch``, ``micro_batch``, ``microbatches``. Invalid
    options raise :class:`ConfigError`, as :func:`distsim.simulate` does."""
    # the cyclic collector's passes walk the profiles kept between points;
    # an estimate leaves no cycles (its parts share a context and none
    # refers back to another), so nothing waits for it
    with gc_paused():
        return _estimate(config)


def _estimate(config: Mapping[str, Any]) -> Dict[str, Any]:
    case = resolve(config)
    check_zero_shards(case)
    profile = _profile_for(case)
    check_weight_gathers(case, profile)
    memo = Memo()       # what the timelines and the memory walk share
    fig = timeline_figures(case, profile, memo)
    step = fig["step_time_s"]
    S = case.strategy
    memory = estimate_memory(StepContext(case, profile, memo))
    capacity = float(case.topology.device_spec.memory_bytes)
    peak = float(max(memory))
    n = S.num_devices
    gb, seq = case.config.global_batch, case.config.seq
    dtype = DType.parse(str(case.config.dtype))
    peak_flops = case.topology.device_spec.peak_flops_for(dtype)
    mflops = model_flops_per_step({**case.config.to_dict()})
    bubble = fig["idle_s"] / step if S.pp > 1 and step > 0 else 0.0
    return {
        "step_time_s": step,
        "samples_per_s": gb / step if step > 0 else math.nan,
        "tokens_per_s": gb * seq / step if step > 0 else math.nan,
        "mfu": mflops / (step * n * peak_flops) if mflops and step > 0 else math.nan,
        "max_peak_memory_bytes": peak,
        "memory_capacity_bytes": capacity,
        "oom": bool(peak > capacity),
        "bubble_fraction": bubble,
        "bubble_s": bubble * step,
        **{k: fig[k] for k in PARTS},
        "num_devices": float(n),
        "total_flops": fig["total_flops"],
        "dp": S.dp, "global_batch": gb, "micro_batch": case.config.micro_batch,
        "microbatches": case.microbatches,
    }
