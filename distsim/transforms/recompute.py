"""Activation recomputation (checkpointing) of a training step.

``Recompute(mode)(step)`` takes a step after autodiff whose ops carry
``meta["layer"]`` and rewrites it so that each layer's backward reads
recomputed copies of some forward values instead of values kept alive
since the forward pass:

- ``none``: nothing is recomputed;
- ``selective``: the attention core (ops with ``meta["attn_core"]``:
  scores, mask, softmax, dropout), as in Korthikanti et al.;
- ``full``: every op of each transformer layer (only the layer's input is
  kept);

and, whatever the mode, with ``regather=True`` the sequence-parallel
all-gathers (``spmd.allgather``) are redone in the backward pass instead of
keeping their full-sequence outputs (as Megatron-LM does), but for the
gathers of a MoE layer's expert slots (from a dispatch or its all-to-all):
the experts' GEMMs keep their gathered input, as Megatron-LM's token
dispatcher gathers them outside its linear layers. Context
parallelism's all-gathers of keys and values (``group: cp``) are always
redone so: its attention keeps only the rank's own keys and values and
gathers them again in the backward (TransformerEngine's all-gather
context parallelism); so are a ring attention's passes of key/value
blocks (``spmd.shift{group: cp}``): the backward sends the blocks around
the ring again (:mod:`.ring_backward`).

The copies are placed right before the first backward op of their layer,
named ``<value>_rc``, with ``meta["phase"] = "recompute"``,
``meta["recompute"] = True`` and ``meta["detail"] = "recompute"`` (shown in
the trace). Only copies the backward actually reads (transitively) are
emitted.
"""
from __future__ import annotations

from typing import Dict, List, Set

from ..errors import PassPreconditionError
from ..ir.builder import NameScope
from ..ir.core import Function, Op, Value

MODES = ("none", "selective", "full")


def is_forward(op: Op) -> bool:
    return "phase" not in op.meta


def _context_gather(op: Op) -> bool:
    """A context-parallel gather of keys and values, or a ring's pass of a
    key/value block: always redone in the backward."""
    return op.op_type in ("spmd.allgather", "spmd.shift") and op.attrs.get("group") == "cp"


def _slots_gather(op: Op, producer: Dict[Value, Op]) -> bool:
    """A tensor-parallel all-gather of a MoE layer's expert slots (of a
    ``moe_dispatch``'s result or of its all-to-all over the ep group)."""
    p = producer.get(op.inputs[0])
    return p is not None and (p.op_type == "moe_dispatch" or
                              (p.op_type == "spmd.alltoall" and p.attrs.get("group") == "ep"))


class Recompute:
    def __init__(self, mode: str = "none", regather: bool = False) -> None:
        if mode not in MODES:
            raise PassPreconditionError(f"recompute: mode must be one of {', '.join(MODES)}, "
                                        f"got {mode!r}")
        self.mode = mode
        self.regather = regather

    def _selected(self, op: Op, layers: int, producer: Dict[Value, Op]) -> bool:
        if not is_forward(op):
            return False
        layer = op.meta.get("layer")
        if not isinstance(layer, int) or not 0 <= layer < layers:
            return False
        if _context_gather(op) or (self.regather and op.op_type == "spmd.allgather"
                                   and not _slots_gather(op, producer)):
            return True
        if self.mode == "full":
            return True
        return self.mode == "selective" and bool(op.meta.get("attn_core"))

    def __call__(self, step: Function) -> Function:
        if self.mode == "none" and not self.regather \
                and not any(_context_gather(op) for op in step.ops):
            return step
        layers = int(step.meta.get("model", {}).get("layers", 0))
        producer: Dict[Value, Op] = step.producers()
        selected: Set[int] = {id(op) for op in step.ops
                             if self._selected(op, layers, producer)}
        if not selected:
            return step
        names = NameScope(v.name for v in step.values())
        first_backward: Dict[int, int] = {}
        for i, op in enumerate(step.ops):
            layer = op.meta.get("layer")
            if not is_forward(op) and isinstance(layer, int) and layer not in first_backward:
                first_backward[layer] = i
        inserts: Dict[int, List[Op]] = {}
        replace: Dict[int, Dict[Value, Value]] = {}
        for layer, at in first_backward.items():
            # Forward values of this layer that its backward reads.
            wanted: Set[Value] = set()
            for op in step.ops[at:]:
                if op.meta.get("layer") != layer or is_forward(op):
                    continue
                for v in op.inputs:
                    p = producer.get(v)
                    if p is not None and id(p) in selected and p.meta.get("layer") == layer:
                        wanted.add(v)
            if not wanted:
                continue
            # Close over the selected producers these values need.
            needed_ops: Set[int] = set()
            stack = [producer[v] for v in wanted]
            while stack:
                p = stack.pop()
                if id(p) in needed_ops:
                    continue
                needed_ops.add(id(p))
                for v in p.inputs:
                    q = producer.get(v)
                    if q is not None and id(q) in selected and q.meta.get("layer") == layer:
                        stack.append(q)
            mapping: Dict[Value, Value] = {}
            clones: List[Op] = []
            for op in step.ops[:at]:
                if id(op) not in needed_ops:
                    continue
                outs = [Value(names.fresh(f"{v.name}_rc"), v.type) for v in op.outputs]
                mapping.update(zip(op.outputs, outs))
                meta = dict(op.meta, phase="recompute", recompute=True, detail="recompute")
                clones.append(Op(op.op_type, [mapping.get(v, v) for v in op.inputs], outs,
                                 op.attrs, op.subfunctions, meta))
            inserts[at] = clones
            replace[layer] = mapping
        ops: List[Op] = []
        for i, op in enumerate(step.ops):
            ops.extend(inserts.get(i, ()))
            layer = op.meta.get("layer")
            if not is_forward(op) and layer in replace:
                mapping = replace[layer]
                if any(v in mapping for v in op.inputs):
                    op = Op(op.op_type, [mapping.get(v, v) for v in op.inputs], op.outputs,
                            op.attrs, op.subfunctions, op.meta)
            ops.append(op)
        out = Function(step.name, list(step.inputs), ops, list(step.outputs))
        out.meta = dict(step.meta, recompute=self.mode)
        return out
