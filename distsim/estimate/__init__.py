"""The fast tier: a training step's time and memory in milliseconds,
without building or simulating the whole program. A peer of
:mod:`distsim.sim` that sweeps and search use (``fidelity: estimate``).

    from distsim.estimate import estimate
    row = estimate({"model": "gpt3-175b", "topology": "dgx-a100-x128",
                    "tp": 8, "pp": 16, "micro_batch": 1})
    row["step_time_s"], row["max_peak_memory_bytes"], row["oom"]

**Contract.**

- *Covers*: the ``gpt`` family (GPT / Llama shapes, fused attention;
  mixtures of experts, every layer MoE or dense and MoE layers mixed,
  with any routing balance and capacity factor: :mod:`.layer_kinds`)
  under every strategy :class:`~distsim.transforms.strategy.Strategy`
  describes: dp x tp x pp in any mesh order,
  expert parallelism (``ep``: the all-to-alls in each MoE block's
  template, the experts' weights synchronised and sharded over dp / ep;
  under ZeRO 2/3 with ``ep`` = dp their gradients, on a team of one rank,
  kept whole and accumulated in place beside the others reduce-scattered,
  :meth:`.context.StepContext.scatters`, and under ZeRO 3 by parameter
  their weights not gathered (no collective over a team of one: no item
  of :func:`.gates.gather_plan`, their reads waiting for none) and whole
  from their gates; under ZeRO 3 with ``ep`` < dp each parameter
  gathered over its own team,
  :func:`~distsim.transforms.sync_policy.layer_gathers`, by layer a MoE
  block's two units, the others' over dp and the experts' over dp / ep,
  each with its copy-in, split and gradients' reduce-scatter:
  :attr:`.gates.GatherPlan.units`, :meth:`.context.StepContext.grad_units`;
  with ``ep`` = dp by layer the others' unit the block's one),
  sequence parallelism, context parallelism (``cp``, every ``cp_comm``:
  all-gathered keys and values, ring attention, all-to-alls; with ZeRO 3
  its parameters sharded and gathered over dp x cp; with ``ep``, the
  expert-parallel groups ``ep`` consecutive ranks of the dp x cp axis,
  within one replica's cp ranks or across replicas, the experts'
  gradients synchronised and ZeRO-sharded over dp x cp / ep ranks, a
  team of one at ep = dp x cp, the only team under ZeRO 3), the GPipe /
  1F1B / interleaved / zero-bubble ``zb-h1`` schedules (ZB-H1's backward
  split into B and W as the lowering splits it; under ZeRO 3 its
  parameters gathered in the forward and B tasks, where the lowering
  gathers them), even or balanced
  partitions,
  micro-batches, ZeRO 0-3 (prefetch, by parameter or by layer),
  gradient buckets, recomputation, AdamW / SGD; on any topology;
  collectives ordered by their inputs or behind the compute issued
  before them (``comm_order: inputs`` / ``stream``); the backward's
  tensor-parallel collectives in autodiff's order or issued before the
  weight-gradient GEMMs (``tp_overlap``, the template lowered so);
  gradient buffers in the parameters' dtype or in fp32 (``fp32_grads``);
  every way of issuing the pipeline's transfers (``p2p``: grouped and
  not waited for, or waited for by what follows a group, :mod:`.p2p_groups`,
  or each its own group; the last two under stream order only); values
  every tensor-parallel rank holds whole sent as 1/tp per rank and
  gathered as the reading task starts (``p2p_scatter``: the split values
  :func:`~distsim.transforms.pipeline_split.splits` names, as the
  lowering's).
- *Refuses*, with the :class:`~distsim.errors.ConfigError` (or
  :class:`~distsim.errors.PassPreconditionError`) that
  :func:`distsim.simulate` raises for the same options: invalid options,
  and models of other families (MLP, ONNX imports) with a ConfigError
  naming the family; valid options it does not model
  (``launch: blocking``, ``p2p: synchronous`` or ``separate`` with
  ``comm_order: inputs``, ``fp32_grads``
  with ZeRO 2/3 over dp > 1, ``ep`` with ``cp`` under ZeRO 3 by layer,
  with ep < dp x cp or ring attention, or under ZeRO 2 with the ZB-H1
  schedule, each measured past the bound or not measured) with
  a :class:`~distsim.errors.NotModelledError`, which a
  sweep records as a skipped point. It never falls back to a simulation
  by itself.
- *Models*: what the lowering decides, from the same decision
  functions (:mod:`distsim.transforms.sync_policy`, the pipeline
  schedules and task order), timed by the cost model and the
  simulator's analytical network (each collective alone, as
  ``network_mode: analytical``), but under ``network_mode: flow`` (the
  simulation's default) the pipeline transfers that share links at once
  (a stage's rank sending to both neighbours, or receiving from both,
  through its one NIC) are timed together as the flow network runs them
  (:mod:`.shared_links`); other teams that share links at once run slower
  in the flow simulation than here.
- *Error bound*: against :func:`distsim.simulate` with the analytical
  network, step time and peak memory agree within the tolerance that
  ``tests/estimate/test_agreement_corpus.py`` asserts on random
  configurations (:data:`AGREEMENT_TOLERANCE`); ``reports/estimator/README.md``
  lists the points a random sample still finds past it (ZeRO 3 with
  ``prefetch: 2`` above all: under the default ``comm_streams: shared``
  up to 2.4 % on step time and 4.1 % on memory; per group up to 5.6 % on
  memory). Mixtures of experts have their own draws there (with expert
parallelism too); their known
  gaps are on memory: ZeRO 3 prefetching the experts' weights (up to
  3.3 %; under expert parallelism up to 7.4 %), ``routing_skew`` 1 with
  tp and two micro-batches (1.5 %), ZeRO 3 under expert parallelism
  on a model as small as ``tiny-moe`` (about 2 KiB over, up to 2.2 %),
  ZeRO 3 by layer on tiny-moe and on DeepSeekMoE under sequence
  parallelism (without expert parallelism too: 3.2 % and 14.7 %),
  ZeRO 3 under expert parallelism with ``comm_streams: per-group``
  (the small test model, dp 8 ep 2 or 4: 1.8-3.1 % under by layer,
  +2.3 % by parameter, whose step time is 13.6 % over there), ZeRO 3
  by layer with ``ep`` < dp prefetching the experts' unit (Mixtral, up
  to 5.3 %),
  and ZeRO 2 with ``ep`` = dp where an expert's whole update is the
  stage's largest optimizer transient (Mixtral at ep 2 or 4, 1.2-3.7 %
  over).
  Context parallelism has its draws too, with mixtures of experts and
  expert parallelism among them. Under ``network_mode: flow``
  the corpus's seeds of long interleaved pipelines at tp 8 agree within
  it; its known gap there: a transfer's sharing is found when the
  transfer that shares with it is placed, in program order, and an
  arrival its receiving task has already read is not moved (the timeline
  settles each item once): where the shared transfers are large beside
  the compute (84 MB each beside one 530B layer per chunk) the delays
  that reach tasks already started carry on through the schedule in the
  simulation and the step comes out under the simulation's, more so the
  more micro-batches (GPT 530B, tp 8, pp 35, interleaved, with each
  task's sends at its end: 1.4-2.3 % under on the validation's six such
  rows; with the exchanges where Megatron-LM's interleaved schedule
  issues them, as now, those rows agree within 0.6 %). ZeRO 3 under ZB-H1
  and under context parallelism are drawn too; their known gaps are on
  memory (ZB-H1 without prefetch: the next task's gated shards beside a
  W task's last gradient, up to 6.3 % under).
- *Cache key*: :func:`cache_key` (options -> the key of the per-layer
  profile an estimate builds once per process and reuses): sweeps group
  the points that share one.

How it works: :mod:`.point` resolves the options and combines the parts;
:mod:`.profile` lowers and simulates a two-layer template once per model
shape and tensor-parallel layout (per-block times and memory; one per
layer kind where a model mixes dense and MoE layers; under expert
parallelism one expert-parallel group, :mod:`.experts`, under ZeRO 3 its
gradients kept local and its parameters gathered over no team; with context
parallelism a tp x cp group, the attention's gathers, ring steps or
all-to-alls simulated with it, its gradients kept local and, under ZeRO
3, its parameters gathered over no team; with ``ep`` too, lcm(ep, cp)
ranks of the dp x cp axis, a whole expert-parallel group and a whole cp
group: :func:`.experts.template_dp`);
:mod:`.timeline` walks the pipeline's program order on an
:class:`~.engine.Timeline` (one rank per stage, compute and communication
streams); :mod:`.memory` walks the same schedule for the peak bytes.
"""
from .point import (AGREEMENT_TOLERANCE, Case, cache_key, check_zero_shards, estimate,
                    profile_key, resolve, symmetry_applies)

__all__ = ["AGREEMENT_TOLERANCE", "Case", "cache_key", "check_zero_shards", "estimate",
           "profile_key", "resolve", "symmetry_applies"]
