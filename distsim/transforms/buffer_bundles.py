"""Gradient buffers carried between fused segments as one bundle.

A coarsened backward task (:mod:`distsim.transforms.coarsen`) of the
micro-batches between the first and the last adds each gradient it makes
into its parameter's buffer inside the fused segment. Passed one by one,
every buffer would be one value per parameter, micro-batch and rank: a
third of a large program's values. Instead the buffers of one segment's
parameters travel as one bundle:

- before the first accumulating micro-batch, a ``pack`` of the buffers
  (as micro-batch 0 left them) makes the bundle;
- each micro-batch's segment takes the bundle and gives a new one
  (``acc_in`` -> ``acc_out``);
- when the last micro-batch needs a buffer (its gradients stay unfused,
  to feed the data-parallel sync when they would), one ``unpack`` gives
  every buffer of the bundle back.

Every step of that chain is an in-place update (``meta["updates"]``): the
bundle is the buffers themselves, not a copy, so it takes no bytes and
the memory curve is the one of per-parameter buffers. Each old value is
updated once: the pack updates the first buffer, each segment's bundle
the one before it, and the unpack's first result the last bundle, its
other results the other buffers.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..ir.core import Value
from ..ir.ops_bundle import PACK, UNPACK, unpack_attrs
from .backward_split import WEIGHT_DETAIL
from .coarsen import Segment
from .lowering_context import LoweringContext


class _Chain:
    """One segment's buffers on one rank: the current bundle and the
    buffers it was packed from."""

    __slots__ = ("bundle", "params", "packed")

    def __init__(self, bundle: Value, params: List[Value], packed: List[Value]) -> None:
        self.bundle = bundle
        self.params = params
        self.packed = packed


class BufferBundles:
    """The bundled gradient buffers of a lowered step: which (parameter,
    rank) buffers are inside a bundle, and the bundles. ``acc``: each
    buffer's current value per (parameter, rank), as
    :class:`~distsim.transforms.zero.GradientSync` keeps them (a buffer
    inside a bundle is out of it meanwhile)."""

    def __init__(self, ctx: LoweringContext, acc: Dict[Tuple[Value, int], Value]) -> None:
        self.ctx = ctx
        self.acc = acc
        self._chains: Dict[Tuple[int, int], _Chain] = {}     # (id(segment), rank)
        self._inside: Dict[Tuple[Value, int], _Chain] = {}   # (parameter, rank)

    def current(self, seg: Segment, rank: int, stage: int, mb: int) -> Value:
        """The bundle that ``seg`` on ``rank`` takes as its ``acc_in``:
        the one its previous micro-batch made, or on the first accumulating
        micro-batch a ``pack`` of the buffers as they are now."""
        chain = self._chains.get((id(seg), rank))
        if chain is not None:
            return chain.bundle
        params = seg.acc_params
        packed = [self.acc[(p, rank)] for p in params]
        bundle = self.ctx.emitter.one(PACK, packed, None, f"{seg.function.name}.acc_m{mb}_r{rank}",
                                      accumulation_meta(stage, mb, self.ctx.kind))
        self.ctx.note_update(packed[0], bundle)
        chain = self._chains[(id(seg), rank)] = _Chain(bundle, params, packed)
        for p in params:
            del self.acc[(p, rank)]
            self._inside[(p, rank)] = chain
        return bundle

    def advanced(self, seg: Segment, rank: int, bundle: Value) -> None:
        """``seg`` on ``rank`` has made ``bundle``, its buffers' new value."""
        chain = self._chains[(id(seg), rank)]
        self.ctx.note_update(chain.bundle, bundle)
        chain.bundle = bundle

    def release(self, p: Value, rank: int, stage: int, mb: int) -> None:
        """If the buffer of ``p`` on ``rank`` is inside a bundle, ``unpack``
        that bundle: each of its buffers is a value of its own again (in
        ``acc``)."""
        chain = self._inside.get((p, rank))
        if chain is None:
            return
        types = [v.type for v in chain.packed]
        outs = self.ctx.emitter.op(UNPACK, [chain.bundle], unpack_attrs(types),
                                   [f"{q.name}_gbuf_m{mb}_r{rank}" for q in chain.params],
                                   accumulation_meta(stage, mb, self.ctx.kind))
        for i, (q, packed, out) in enumerate(zip(chain.params, chain.packed, outs)):
            self.ctx.note_update(chain.bundle if i == 0 else packed, out)
            self.acc[(q, rank)] = out
            del self._inside[(q, rank)]


def accumulation_meta(stage: int, mb: int, task: str = "B") -> Dict[str, object]:
    """The meta of a gradient-accumulation op outside the fused segments
    (GradientSync's adds and scales, the buffers' pack and unpack), made
    while the task of kind ``task`` is emitted: in a split backward's
    weight-gradient task (``W``) it is marked as that task's, as the ops it
    accumulates are, so that the charts draw the task as one block."""
    meta: Dict[str, object] = {"stage": stage, "microbatch": mb, "phase": "backward",
                               "category": "gradients", "layer": None}
    if task == "W":
        meta.update(task="W", detail=WEIGHT_DETAIL)
    return meta
