"""Kernel classes: the op types whose kernels move memory the same way,
and so reach the same fraction of the device's bandwidth.

- ``copy``: data movement, no arithmetic (copies, transposes, concatenation,
  slicing, casts);
- ``elementwise``: one pass over the elements, reading each input once
  (add, scale, GELU, dropout, the optimizer's update);
- ``norm``: a reduction along each row and a second pass to normalise it
  (LayerNorm, RMSNorm and their backward kernels);
- ``softmax``: a row maximum, a row sum and a normalising pass (softmax,
  log-softmax, cross-entropy and their backward kernels);
- ``reduction``: sums and maxima over axes.

A device's ``memory_efficiency_by_class`` gives a class its figure;
``memory_efficiency_by_op`` still overrides one op type. The backward
kernels share their forward's class: their access pattern (row
reductions) is what sets the rate.
"""
from __future__ import annotations

from typing import Dict, Optional

from ..ir.registry import is_registered, lookup

KERNEL_CLASSES = ("copy", "elementwise", "norm", "softmax", "reduction")

_BY_OP: Dict[str, str] = {}
for _cls, _ops in {
    "copy": ("identity", "cast", "transpose", "reshape", "broadcast_to", "concat", "split",
             "slice", "pad", "chunk_cat", "chunk_split", "embedding", "spmd.copy"),
    "elementwise": ("dropout", "dropout_grad", "causal_mask", "adamw", "sgd", "gelu_grad",
                    "silu_grad", "relu_grad", "select_label", "select_label_grad",
                    "embedding_grad", "mse_loss", "mse_loss_grad"),
    "norm": ("layernorm", "layernorm_grad", "rmsnorm", "rmsnorm_grad"),
    "softmax": ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad", "cross_entropy",
                "cross_entropy_grad"),
    "reduction": ("reduce_sum", "reduce_mean", "reduce_max"),
}.items():
    for _op in _ops:
        _BY_OP[_op] = _cls


def kernel_class(op_type: str) -> Optional[str]:
    """The class of ``op_type``'s kernel, or None (matrix products, fused
    attention, communication, an op type the table does not place)."""
    cls = _BY_OP.get(op_type)
    if cls is None and is_registered(op_type) and lookup(op_type).elementwise:
        cls = "elementwise"
    return cls
