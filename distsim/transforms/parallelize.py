"""Any one-device forward step under a parallel strategy: the generic path.

``parallelize(forward, strategy, ...)`` takes the forward pass and loss of
one micro-batch on one device (ops tagged with ``meta["layer"]``, or a
plan's ``cuts``; ``meta`` with ``params``, ``roles``, ``loss``,
``model["layers"]``) and a plan (:mod:`.plans`), and returns the local-view
program of the whole ``dp x pp x tp`` mesh:

1. :func:`template_step`: tensor (and sequence) parallelism from the
   plan, the one-rank SPMD template
   (:class:`.tensor_parallel.TensorParallel`), the experts shared out
   over the expert-parallel group (:class:`.expert_parallel.ExpertParallel`);
   the backward pass by
   autodiff of the template (the SPMD collectives' gradient rules make its
   collectives), then recomputation, the strategy's kernel fusion and the
   order of the backward's tensor-parallel collectives (:mod:`.tp_order`) --
   the step of one micro-batch on one tensor-parallel rank, which the fast
   estimator profiles too;
2. :class:`~distsim.transforms.spmd.LowerSPMD`: pipeline stages from the
   layers, every schedule, micro-batches, gradient synchronisation and
   ZeRO, the optimizer.

:func:`resolve_plan` turns the ``plan`` option (``--plan``) into a plan of
the program.
"""
from __future__ import annotations

from typing import Optional, Union

from ..errors import ConfigError
from ..ir.core import Function
from .adam import AdamHyper
from .autodiff import Autodiff
from .expert_parallel import ExpertParallel
from .fusion import Fuse
from .megatron_plan import megatron_plan
from .optimizer import SGDHyper
from .pipeline import check_schedule
from .pipeline_layers import check_stages, layers_from_cuts
from .plans import BUILTIN, Plan, load_plan_file
from .recompute import Recompute
from .spmd import LowerSPMD
from .strategy import Strategy, fusion_for, writes_megatron_loss
from .tensor_parallel import TensorParallel
from .tp_order import order_tp_backward


def resolve_plan(value: Optional[str], forward: Function) -> Plan:
    """The plan ``value`` names for ``forward``: ``megatron`` (also the
    default, None) or a plan file's path."""
    if value is None or value in BUILTIN:
        return megatron_plan(forward)
    return load_plan_file(value)


def parallelize(forward: Function, strategy: Strategy, microbatches: int,
                hyper: Union[AdamHyper, SGDHyper], master_dtype: str = "f32",
                plan: Optional[Plan] = None, model: str = "the model") -> Function:
    """The lowered program (see the module docstring). ``forward`` is
    changed in place only by a plan's ``cuts`` (its ops' layers)."""
    plan = plan if plan is not None else megatron_plan(forward)
    layers = int(forward.meta.get("model", {}).get("layers", 1))
    if plan.cuts:
        layers = layers_from_cuts(forward, plan.cuts, plan.source)
        forward.meta["model"] = dict(forward.meta.get("model", {}), layers=layers)
    where = f"model '{model}'"
    check_stages(layers, strategy.pp, strategy.chunks, where)
    check_schedule(strategy.schedule, strategy.pp, microbatches, strategy.chunks)
    step = template_step(forward, strategy, plan, model)
    return LowerSPMD(strategy, microbatches, hyper, master_dtype,
                     representatives=strategy.symmetry, coarsen=strategy.coarsen)(step)


def template_step(forward: Function, strategy: Strategy, plan: Plan,
                  model: str = "the model") -> Function:
    """The step of one micro-batch on one tensor-parallel rank: ``plan``
    placed over ``strategy.tp`` ranks (``strategy.sp``), differentiated,
    recomputed and fused as ``strategy`` says (no optimizer, no pipeline:
    what :class:`~distsim.transforms.spmd.LowerSPMD` lowers):
    :func:`finish_step` of :func:`differentiated_template`."""
    return finish_step(differentiated_template(forward, strategy, plan, model), strategy)


def differentiated_template(forward: Function, strategy: Strategy, plan: Plan,
                            model: str = "the model") -> Function:
    """:func:`template_step` before recomputation and fusion: ``plan``
    placed over ``strategy.tp`` ranks (``strategy.sp``), the experts over
    ``strategy.ep``, and differentiated; at ``tp`` 1 under Megatron's
    fusion (:func:`writes_megatron_loss`: the framework simulated is
    Megatron-LM) a float32 loss written as Megatron's
    vocabulary-parallel steps on one rank, as it runs them
    (:class:`~.tensor_parallel.TensorParallel`'s ``megatron_loss``). It
    reads nothing else of ``strategy``, and :func:`finish_step` leaves it
    unchanged, so steps that differ only in recomputation (or in a fusion
    other than ``megatron``) can finish one (the estimator's templates
    do)."""
    if strategy.tp > 1 and not plan.entries:
        raise ConfigError(f"--tp {strategy.tp}: plan '{plan.name}' places no parameter of "
                          f"model '{model}' (it finds no pair of linear layers and no "
                          "embedding); give --plan FILE")
    template = TensorParallel(plan, strategy.tp, strategy.sp, model,
                              megatron_loss=writes_megatron_loss(fusion_for(strategy)))(forward)
    template = ExpertParallel(strategy.ep, model)(template)
    return Autodiff(template.meta["loss"], template.meta["params"])(template)


def finish_step(step: Function, strategy: Strategy) -> Function:
    """The rest of :func:`template_step`: ``step`` (a
    :func:`differentiated_template`) recomputed and fused as ``strategy``
    says, its tensor-parallel backward collectives ordered as
    ``strategy.tp_overlap`` says (:mod:`.tp_order`), in a new function
    where any of these changes it (``step`` itself is left as it is)."""
    step = Recompute(strategy.recompute, regather=strategy.sp)(step)
    return order_tp_backward(Fuse(fusion_for(strategy))(step), strategy.tp_overlap)
