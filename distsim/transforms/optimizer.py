"""Optimizer passes: append the weight update to a function whose
``meta["grads"]`` maps parameters to gradients.

``SGD(lr)(f)`` adds ``w_new = sgd(w, g)`` for every parameter and returns
the function with outputs ``[loss..., w_new...]`` (the non-gradient outputs
of ``f`` first). ``meta["updates"]`` maps each parameter to its new value.
"""
from __future__ import annotations

from ..errors import PassPreconditionError
from ..ir.builder import builder_from
from ..ir.core import Function


class SGD:
    def __init__(self, lr: float = 0.01) -> None:
        if not lr > 0:
            raise PassPreconditionError(f"SGD: learning rate must be positive, got {lr}")
        self.lr = float(lr)

    def __call__(self, function: Function) -> Function:
        grads = function.meta.get("grads")
        if not grads:
            raise PassPreconditionError(f"SGD: function '{function.name}' has no gradients "
                                        "(run Autodiff first)")
        b, _ = builder_from(function)
        f = b.function
        by_name = {v.name: v for v in f.values()}
        grad_values = {by_name[g] for g in grads.values()}
        kept = [v for v in f.outputs if v not in grad_values]
        updates = {}
        for param, grad in grads.items():
            new = b.op("sgd", [by_name[param], by_name[grad]], {"lr": self.lr},
                       name=f"{param}_new")
            updates[param] = new.name
            kept.append(new)
        for op in f.ops[len(function.ops):]:
            op.meta.setdefault("phase", "optimizer")
        f.outputs = kept
        f.meta["updates"] = updates
        return f
