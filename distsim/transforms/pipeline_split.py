"""Pipeline transfers scattered over the tensor-parallel ranks and gathered
on arrival (``p2p_scatter``).

Without sequence parallelism every tensor-parallel rank of a stage holds
the whole value a stage boundary carries (the residual stream, its
gradient), so each of the ``tp`` ranks would send the same bytes to its
peer of the next stage, ``tp`` times the bytes through the servers' NICs.
Megatron-LM (``--scatter-gather-tensors-in-pipeline``, on by default;
Narayanan et al. 2021, section 4.1, *scatter/gather communication
optimization*) has each rank send ``1/tp`` of it and the receiving stage
all-gather the pieces over its tensor-parallel group (NVLink);
DeepSpeed's pipeline engine partitions its activations over the model-
parallel group the same way. Megatron-core's pipeline code does not.

:func:`splits` says which of a step's values may travel so: those equal on
every tensor-parallel rank (:func:`tp_uniform`) with an axis ``tp``
divides (:func:`split_axis`). A value that is a shard already (sequence
parallelism's residual stream) is sent as it is. The lowering
(:class:`~distsim.transforms.spmd.LowerSPMD`) slices each rank's piece
where the schedule places the send, sends it, and all-gathers the pieces
as the receiving task starts (Megatron-LM gathers right after its
``batch_isend_irecv``); the fast estimator times the same three steps
from the same answer (:mod:`distsim.estimate.crossing`).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Set

from ..ir.core import Function, Op, Value

#: tensor-parallel collectives whose result every rank of the group holds whole
_WHOLE = ("spmd.allreduce", "spmd.allgather")
#: a collective over another group (context or expert parallelism) keeps
#: what its input was on the tensor-parallel ranks
_OTHER_GROUPS = ("cp", "ep")


def _differs(op: Op) -> bool:
    """Whether ``op`` computes something different on each tensor-parallel
    rank from the same inputs (attributes per rank), itself or inside a
    fused segment."""
    if op.meta.get("rank_attrs"):
        return True
    return any(_differs(inner) for f in op.subfunctions for inner in f.ops)


def tp_uniform(step: Function) -> Set[Value]:
    """The values of the SPMD template ``step`` (one tensor-parallel rank's
    program, :mod:`.spmd_template`) equal on every tensor-parallel rank:
    the inputs but the parameters the ranks hold shards of
    (``meta["param_shards"]``), the results of the group's all-reduces
    and all-gathers, and what ops with no per-rank attributes compute
    from such values alone."""
    shards = set(step.meta.get("param_shards", {}))
    uniform = {v for v in step.inputs if v.name not in shards}
    for op in step.ops:
        if op.op_type in _WHOLE and op.attrs.get("group") not in _OTHER_GROUPS:
            uniform.update(op.outputs)
        elif op.op_type.startswith("spmd.") and op.op_type != "spmd.copy" \
                and op.attrs.get("group") not in _OTHER_GROUPS:
            continue        # a reduce-scatter: each rank's own part
        elif not _differs(op) and all(v in uniform for v in op.inputs):
            uniform.update(op.outputs)
    return uniform


def split_axis(v: Value, tp: int) -> Optional[int]:
    """The first axis of ``v`` that ``tp`` divides, or None. Megatron-LM
    splits the flattened tensor into ``tp`` equal pieces; one axis's
    pieces move the same bytes and are gathered along it."""
    for axis, n in enumerate(v.type.shape):
        if n % tp == 0:
            return axis
    return None


def splits(step: Function, values: Iterable[Value], tp: int) -> Dict[Value, int]:
    """Of ``values`` (those crossing a stage boundary), the ones sent
    ``1/tp`` per rank, each with the axis it is split along."""
    if tp <= 1:
        return {}
    uniform = tp_uniform(step)
    out = {}
    for v in values:
        if v in uniform:
            axis = split_axis(v, tp)
            if axis is not None:
                out[v] = axis
    return out
