"""SGD: append the weight update to a function whose ``meta["grads"]``
maps parameters to gradients.

``SGD(lr)(f)`` adds ``w_new = sgd(w, g)`` for every parameter and returns
the function with outputs ``[loss..., w_new...]`` (the non-gradient outputs
of ``f`` first). ``meta["updates"]`` maps each parameter to its new value.

With ``master_dtype`` (mixed precision, as the GPT path trains) every
parameter ``p`` gets an input ``p.master`` (role ``master``) in that dtype
and, with ``momentum > 0``, a momentum buffer ``p.mom`` (role
``optimizer``); the update runs on the master weights and the new
parameter is the master cast back to ``p``'s dtype (:func:`sgd_update`,
PyTorch's ``torch.optim.SGD``: ``g += weight_decay * w``, ``buf = momentum
* buf + g``, ``w -= lr * buf``). Outputs: the non-gradient outputs, the
new parameters, then the new master weights and momentum buffers. Model
state per parameter with bf16 compute: 2 (weights) + 2 (gradients) + 4
(master) + 4 (momentum, when there is one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

from ..errors import PassPreconditionError
from ..ir.builder import FunctionBuilder, builder_from
from ..ir.core import Function, Value
from ..ir.types import DType


@dataclass(frozen=True)
class SGDHyper:
    """Hyper-parameters of SGD with mixed precision (see the module docstring)."""

    name: ClassVar[str] = "sgd"
    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0

    @property
    def states(self) -> Tuple[str, ...]:
        """Optimizer state per parameter besides the master weights."""
        return ("mom",) if self.momentum > 0 else ()


def start_update(pass_name: str, function: Function
                 ) -> Tuple[FunctionBuilder, Dict[str, str], Dict[str, Value], List[Value]]:
    """What every optimizer pass starts from: a builder over a copy of
    ``function``, its ``meta["grads"]`` (parameter -> gradient name), its
    values by name, and the outputs it keeps (all but the gradients, which
    the update consumes). Refuses a function without gradients."""
    grads = function.meta.get("grads")
    if not grads:
        raise PassPreconditionError(f"{pass_name}: function '{function.name}' has no gradients "
                                    "(run Autodiff first)")
    b, _ = builder_from(function)
    by_name = {v.name: v for v in b.function.values()}
    grad_values = {by_name[g] for g in grads.values()}
    kept = [v for v in b.function.outputs if v not in grad_values]
    return b, grads, by_name, kept


def sgd_update(b: FunctionBuilder, name: str, master: Value, grad: Value, mom: Optional[Value],
               hyper: SGDHyper, compute_dtype: DType, meta: Optional[dict] = None
               ) -> Tuple[Value, ...]:
    """Emit the SGD update of one parameter (or shard) on its master
    weights; returns ``(param_new, master_new[, mom_new])``."""
    base = dict(meta or {}, phase="optimizer")
    opt = dict(base, category="optimizer")
    g = grad
    if g.type.dtype != master.type.dtype:
        g = b.op("cast", [g], {"dtype": master.type.dtype.value}, name=f"{name}.g32", meta=opt)
    if hyper.weight_decay:
        decay = b.op("scale", [master], {"factor": hyper.weight_decay}, name=f"{name}.decay",
                     meta=opt)
        g = b.op("add", [g, decay], name=f"{name}.g_decayed", meta=opt)
    outs: List[Value] = []
    if mom is not None:
        kept = b.op("scale", [mom], {"factor": hyper.momentum}, name=f"{name}.mom_kept", meta=opt)
        g = b.op("add", [kept, g], name=f"{name}.mom_new", meta=opt)
        outs.append(g)
    master_new = b.op("sgd", [master, g], {"lr": hyper.lr}, name=f"{name}.master_new", meta=opt)
    param_new = b.op("cast", [master_new], {"dtype": compute_dtype.value}, name=f"{name}_new",
                     meta=base)
    return (param_new, master_new, *outs)


class SGD:
    """The pass (single device); see the module docstring."""

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
                 master_dtype: Optional[str] = None) -> None:
        if not lr > 0:
            raise PassPreconditionError(f"SGD: learning rate must be positive, got {lr}")
        if not 0 <= momentum < 1:
            raise PassPreconditionError(f"SGD: momentum must be in [0, 1), got {momentum}")
        if (momentum or weight_decay) and master_dtype is None:
            raise PassPreconditionError("SGD: momentum and weight decay need master weights "
                                        "(master_dtype)")
        self.lr = float(lr)
        self.hyper = SGDHyper(float(lr), float(momentum), float(weight_decay))
        self.master_dtype = DType.parse(master_dtype) if master_dtype is not None else None

    def __call__(self, function: Function) -> Function:
        b, grads, by_name, kept = start_update("SGD", function)
        f = b.function
        n_before = len(f.ops)
        updates: Dict[str, str] = {}
        if self.master_dtype is None:
            for param, grad in grads.items():
                new = b.op("sgd", [by_name[param], by_name[grad]], {"lr": self.lr},
                           name=f"{param}_new")
                updates[param] = new.name
                kept.append(new)
        else:
            roles = dict(f.meta.get("roles", {}))
            new_params, states = [], []
            for param, grad in grads.items():
                p = by_name[param]
                t = p.type.with_dtype(self.master_dtype)
                master = b.input(param + ".master", t)
                roles[master.name] = "master"
                mom = None
                if self.hyper.momentum > 0:
                    mom = b.input(param + ".mom", t)
                    roles[mom.name] = "optimizer"
                outs = sgd_update(b, param, master, by_name[grad], mom, self.hyper, p.type.dtype)
                new_params.append(outs[0])
                states.extend(outs[1:])
                for old, new in zip([p, master] + ([mom] if mom is not None else []), outs):
                    updates[old.name] = new.name
            kept += new_params + states
            f.meta["roles"] = roles
        for op in f.ops[n_before:]:
            op.meta.setdefault("phase", "optimizer")
        f.outputs = kept
        f.meta["updates"] = updates
        f.meta["optimizer"] = "sgd"
        return f
