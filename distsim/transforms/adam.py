"""AdamW with mixed precision: fp32 master weights and moments, compute in
the parameters' dtype (bf16 / fp16).

``AdamW(lr, ...)(f)`` takes a function whose ``meta["grads"]`` maps
parameters to gradients (run :class:`~distsim.transforms.autodiff.Autodiff`
first) and, for every parameter ``p``, adds three inputs ``p.master``
(role ``master``), ``p.m`` and ``p.v`` (role ``optimizer``) in
``master_dtype``, one ``adamw`` op (memory category ``optimizer``) and a
cast of the new master weights back to ``p``'s dtype. With bf16 compute
this is the usual accounting of 16 bytes per parameter: 2 (weights) + 2
(gradients) + 4 + 4 + 4 (master, m, v).

Outputs: the function's non-gradient outputs, then the new parameters,
then the new master weights, m and v. ``meta["updates"]`` maps each
updated input (``p``, ``p.master``, ``p.m``, ``p.v``) to its new value (the
simulator counts those updates as in place).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from ..errors import PassPreconditionError
from ..ir.builder import FunctionBuilder
from ..ir.core import Function, Value
from ..ir.types import DType
from .optimizer import start_update

STATE_SUFFIXES = (".master", ".m", ".v")


@dataclass(frozen=True)
class AdamHyper:
    name: ClassVar[str] = "adamw"
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    step: int = 1

    @property
    def states(self) -> Tuple[str, ...]:
        """Optimizer state per parameter besides the master weights."""
        return ("m", "v")

    def attrs(self) -> Dict[str, object]:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "weight_decay": self.weight_decay, "step": self.step}


def adamw_update(b: FunctionBuilder, name: str, master: Value, grad: Value, m: Value, v: Value,
                 hyper: AdamHyper, compute_dtype: DType, meta: Optional[dict] = None
                 ) -> Tuple[Value, Value, Value, Value]:
    """Emit the update of one parameter (or shard); returns
    ``(param_new, master_new, m_new, v_new)``."""
    base = dict(meta or {}, phase="optimizer")
    master_new, m_new, v_new = b.op("adamw", [master, grad, m, v], hyper.attrs(),
                                    name=[f"{name}.master_new", f"{name}.m_new",
                                          f"{name}.v_new"],
                                    meta=dict(base, category="optimizer"))
    param_new = b.op("cast", [master_new], {"dtype": compute_dtype.value}, name=f"{name}_new",
                     meta=base)
    return param_new, master_new, m_new, v_new


class AdamW:
    """The pass (single device); see the module docstring."""

    def __init__(self, lr: float = 1e-4, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.0, master_dtype: str = "f32",
                 step: int = 1) -> None:
        if not lr > 0:
            raise PassPreconditionError(f"AdamW: learning rate must be positive, got {lr}")
        self.hyper = AdamHyper(float(lr), float(beta1), float(beta2), float(eps),
                               float(weight_decay), int(step))
        self.master_dtype = DType.parse(master_dtype)

    def __call__(self, function: Function) -> Function:
        b, grads, by_name, kept = start_update("AdamW", function)
        f = b.function
        roles = dict(f.meta.get("roles", {}))
        n_before = len(f.ops)
        updates: Dict[str, str] = {}
        new_params, states = [], []
        for param, grad in grads.items():
            p = by_name[param]
            t = p.type.with_dtype(self.master_dtype)
            master, m, v = (b.input(param + s, t) for s in STATE_SUFFIXES)
            roles[master.name] = "master"
            roles[m.name] = roles[v.name] = "optimizer"
            outs = adamw_update(b, param, master, by_name[grad], m, v, self.hyper, p.type.dtype)
            new_params.append(outs[0])
            states.extend(outs[1:])
            for old, new in zip((p, master, m, v), outs):
                updates[old.name] = new.name
        for op in f.ops[n_before:]:
            op.meta.setdefault("phase", "optimizer")
        f.outputs = kept + new_params + states
        f.meta["roles"] = roles
        f.meta["updates"] = updates
        f.meta["optimizer"] = "adamw"
        return f
