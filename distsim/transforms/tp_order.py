"""Where the backward's tensor-parallel collective is issued: before or
after the layer's weight-gradient GEMM (``Strategy.tp_overlap``).

A column-parallel linear layer's input gradient is a partial sum over the
tensor-parallel ranks: its backward all-reduces it (the gradient of
``spmd.copy``; a reduce-scatter, the gradient of ``spmd.allgather``, under
sequence parallelism). Autodiff emits it after the layer's whole matmul
gradient, input gradient (dX) then weight gradient (dW), as
:func:`~.grad_rules._matmul` orders them. Where it sits in program order
matters because a collective starts only after the compute issued before
it on its device (``comm_order: stream``, :mod:`distsim.sim.launch_queue`):

* ``tp_overlap=False`` (the default): as autodiff emits it, after the dW
  GEMM. This is
  Megatron-LM v2 (Narayanan et al. 2021, ``mpu/layers.py``
  ``ColumnParallelLinear`` behind ``copy_to_tensor_model_parallel_region``):
  the all-reduce is the copy region's backward, which autograd runs once
  the linear's backward (both GEMMs) has been issued, so it does not
  overlap the weight-gradient GEMM.
* ``tp_overlap=True``: right after the op that makes its input, before
  the dW GEMM. This is Megatron-LM's
  ``LinearWithGradAccumulationAndAsyncAllreduce`` (late 2021 on, the code
  of Korthikanti et al. 2022, with ``CUDA_DEVICE_MAX_CONNECTIONS=1``): it
  issues the input gradient's all-reduce (or reduce-scatter) asynchronously
  before computing the weight gradient, so the two overlap.

The reordering is the only difference: the same ops, the same numbers.
Without stream order it still decides which collective queues first on a
shared communication stream (``comm_streams: shared``): the async order
puts the all-reduce ahead of ZeRO-3 gathers issued during the dW GEMM.
The default is the 2021 order, autodiff's. The fast estimator lowers
its per-layer template in the order the option says
(:mod:`distsim.estimate.profile`).
"""
from __future__ import annotations

from typing import Dict, List

from ..ir.builder import clone_function
from ..ir.core import Function, Op

#: the collectives the backward of a column-parallel layer's input makes
_INPUT_GRADIENT_COLLECTIVES = ("spmd.allreduce", "spmd.reducescatter")


def is_input_gradient_collective(op: Op) -> bool:
    """A tensor-parallel collective of the backward pass (not of a
    recomputed forward)."""
    return (op.op_type in _INPUT_GRADIENT_COLLECTIVES and op.attrs.get("group") == "tp"
            and op.meta.get("phase") == "backward")


def order_tp_backward(step: Function, overlap: bool) -> Function:
    """``step`` with each backward tensor-parallel collective issued right
    after the producer of its input when ``overlap`` (see the module
    docstring), in a new function; ``step`` itself when nothing moves."""
    if not overlap:
        return step
    moves = _moves(step.ops)
    if not moves:
        return step
    new, _ = clone_function(step)
    after: Dict[int, List[Op]] = {}
    moved = set()
    for op_index, producer_index in moves:
        after.setdefault(producer_index, []).append(new.ops[op_index])
        moved.add(op_index)
    ops: List[Op] = []
    for i, op in enumerate(new.ops):
        if i not in moved:
            ops.append(op)
        ops.extend(after.get(i, ()))
    new.ops = ops
    return new


def _moves(ops: List[Op]) -> List[tuple]:
    """(index of a collective, index of its input's producer) for each
    backward tensor-parallel collective that compute ops separate from its
    producer."""
    made_by = {id(v): i for i, op in enumerate(ops) for v in op.outputs}
    moves = []
    for i, op in enumerate(ops):
        if not is_input_gradient_collective(op):
            continue
        producer = made_by.get(id(op.inputs[0]))
        if producer is not None and producer < i - 1:
            moves.append((i, producer))
    return moves
