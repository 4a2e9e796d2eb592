"""Megatron's vocabulary-parallel cross entropy.

``cross_entropy`` runs only on whole rows of logits (its rule shards the
tokens), so logits split over the vocabulary would be gathered first: a
whole ``tokens x vocab`` tensor per device, its gradient reduce-scattered
back. Megatron computes the loss on the vocabulary shards instead, with
three all-reduces of one number per token: the row maximum, the sum of
exponentials and the label's logit. :func:`vocab_parallel_cross_entropy`
writes a ``cross_entropy`` as those steps, in Megatron's order::

    m      = stop_gradient(reduce_max(logits, -1, keepdims))  # all-reduced (max)
    s      = logits - m
    total  = reduce_sum(exp(s), -1)                           # all-reduced (sum)
    picked = select_label(s, labels)                          # all-reduced (sum)
    loss   = reduce_mean(log(total) - picked)

(the same loss: the maximum only keeps the exponentials in range). The
three reduced values are to be replicated: propagation then puts each
all-reduce right after its reduction; with vocabulary-sharded logits the
reductions and ``select_label`` (offset per device) run on the shards.
The gradient is the steps' own (autodiff of the lowered program): the
softmax of the shard minus the label's one-hot, no logits gathered.
:func:`vocab_sharded_losses` finds the losses whose logits are the
product of an output layer split over the vocabulary;
:func:`float32_losses` those that Megatron-LM computes with the same steps
on one rank (``vocab_parallel_cross_entropy(output.float(), labels)`` at
``--tensor-model-parallel-size 1``), written there without collectives.
"""
from __future__ import annotations

from typing import List, Mapping

from ...ir.core import Function, Op, Value
from ...ir.mesh import Placement, Shard
from ...ir.registry import is_registered, lookup
from ...ir.source import ORIGIN
from ...ir.types import DType, TensorType


def vocab_sharded_losses(f: Function, fixed: Mapping[Value, Placement]) -> List[Op]:
    """The ``cross_entropy`` ops of ``f`` whose logits are the product of a
    weight ``fixed`` splits along the product's features (an output layer
    split over the vocabulary; through element-wise ops such as a bias or
    a mask): their logits are vocabulary-sharded."""
    producer = f.producers()
    found: List[Op] = []
    for op in f.ops:
        if op.op_type != "cross_entropy":
            continue
        v = op.inputs[0]
        p = producer.get(v)
        while p is not None and p.op_type != "matmul" and is_registered(p.op_type) \
                and lookup(p.op_type).elementwise:
            same = [x for x in p.inputs if x.type.shape == v.type.shape]
            if len(same) != 1:
                break
            v = same[0]
            p = producer.get(v)
        if p is None or p.op_type != "matmul" or p.inputs[0] is p.inputs[1]:
            continue
        w = p.inputs[1]
        pl = fixed.get(w)
        features = 0 if p.attrs.get("trans_b") else w.type.rank - 1
        if isinstance(pl, Shard) and pl.dim == features:
            found.append(op)
    return found


def float32_losses(f: Function) -> List[Op]:
    """The ``cross_entropy`` ops of ``f`` on float32 logits: the loss
    computed in float32 (``loss_dtype: fp32``, or a model in f32), which
    Megatron runs as these steps however many ranks hold the vocabulary."""
    return [op for op in f.ops
            if op.op_type == "cross_entropy" and op.inputs[0].type.dtype == DType.F32]


def vocab_parallel_cross_entropy(f: Function, op: Op) -> List[Value]:
    """``op`` (a ``cross_entropy`` of ``f``) rewritten in place as the steps
    above; its result is the same value. Returns the three values to be
    replicated: the row maximum, the sum of exponentials, the label's
    logit."""
    logits, labels = op.inputs
    loss = op.outputs[0]
    names = {v.name for v in f.values()}
    rows = logits.type.shape[:-1]
    dtype = logits.type.dtype
    device = logits.type.device
    meta = {k: v for k, v in op.meta.items() if k != ORIGIN}
    made: List[Op] = []

    def step(op_type: str, inputs: List[Value], name: str, shape, attrs=None) -> Value:
        while name in names:
            name += "_"
        names.add(name)
        out = Value(name, TensorType(tuple(shape), dtype, device))
        made.append(Op(op_type, inputs, [out], attrs or {}, meta=dict(meta)))
        return out

    m = step("reduce_max", [logits], "logit_max", rows + (1,), {"axes": [-1], "keepdims": True})
    m_const = step("stop_gradient", [m], "logit_max_c", rows + (1,))
    shifted = step("sub", [logits, m_const], "shifted", logits.type.shape)
    e = step("exp", [shifted], "exp_logits", logits.type.shape)
    total = step("reduce_sum", [e], "sum_exp", rows, {"axes": [-1]})
    picked = step("select_label", [shifted, labels], "label_logit", rows)
    lse = step("log", [total], "lse", rows)
    nll = step("sub", [lse, picked], "nll", rows)
    made.append(Op("reduce_mean", [nll], [loss], {}, meta=dict(meta)))
    i = next(k for k, o in enumerate(f.ops) if o is op)
    f.ops[i:i + 1] = made
    return [m, total, picked]
