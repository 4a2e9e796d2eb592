"""The backward of a step split into its input-gradient part (``B``) and its
weight-gradient part (``W``), for the zero-bubble pipeline schedules
(:data:`~distsim.transforms.pipeline.SPLIT_BACKWARD`).

The split is read off the program's data flow, not per model: a backward
(or recomputation) op belongs to ``W`` when everything it makes only feeds
parameter gradients of its own layer, that is when each of its results is

- read by nothing but ``W`` ops of the same chunk and layer
  (``meta["layer"]``), and
- neither read by another chunk nor a step output other than a gradient.

Deciding the ops in reverse program order sees every reader before its
producer, so ``dW = X^T dY`` of a linear layer and a norm's weight and
bias gradients are ``W``; the ops on the path of the activation gradient
(``dX = dY W^T``, which the layer below reads: the previous stage's
backward waits for it) stay in ``B``, in the first stage too, where only
the embedding's gradient reads the last of them (its own layer, ``W``).
An op with a result nothing reads and that is not a gradient stays in
``B`` (it changes no gradient), and so does one op that makes both an
input gradient and weight gradients (a norm's ``layernorm_grad``: its
weight and bias gradients come with its input gradient, in ``B``).
"""
from __future__ import annotations

from typing import Container, Dict, List, Mapping, Sequence, Set, Tuple

from ..ir.core import Op, Value

#: The phases of ops a backward task holds (everything else is forward).
BACKWARD_PHASES = ("backward", "recompute")
#: The ``detail`` of a W task's ops (those without a detail of their own):
#: what the trace shows of them.
WEIGHT_DETAIL = "weight gradient"


def weight_gradient_ops(ops: Sequence[Op], chunk_of_op: Mapping[int, int],
                        consumers: Mapping[Value, List[Op]], grads: Container[Value],
                        step_outputs: Container[Value], crossing: Container[Value]) -> Set[int]:
    """The ids of the ops of ``ops`` (a step, in program order) that make
    only weight gradients (see the module docstring)."""
    weight: Set[int] = set()
    for op in reversed(ops):
        if op.meta.get("phase") not in BACKWARD_PHASES or not op.outputs:
            continue
        chunk, layer = chunk_of_op[id(op)], op.meta.get("layer")
        only_grads = True
        for v in op.outputs:
            readers = consumers.get(v, ())
            if v in crossing or (v in step_outputs and v not in grads) \
                    or (not readers and v not in grads) \
                    or any(id(r) not in weight or chunk_of_op[id(r)] != chunk
                           or r.meta.get("layer") != layer for r in readers):
                only_grads = False
                break
        if only_grads:
            weight.add(id(op))
    return weight


def split_tasks(task_ops: Dict[Tuple[str, int], List[Op]], task_of_op: Dict[int, Tuple[str, int]],
                weight: Set[int]) -> None:
    """Move the ops of ``weight`` from their ``B`` task to the ``W`` task of
    the same chunk (in place, program order kept)."""
    for key in [k for k in task_ops if k[0] == "B"]:
        ops = task_ops[key]
        moved = [op for op in ops if id(op) in weight]
        if not moved:
            continue
        task_ops[key] = [op for op in ops if id(op) not in weight]
        if not task_ops[key]:
            del task_ops[key]
        task_ops[("W", key[1])] = moved
        for op in moved:
            task_of_op[id(op)] = ("W", key[1])
