"""Static memory accounting of a training step, read off the program.

- :func:`saved_activation_bytes`: per transformer layer, the bytes of the
  forward values that the backward pass (or recomputation) reads, i.e.
  what stays alive between a micro-batch's forward and its backward;
- :func:`korthikanti_activation_bytes`: the published per-layer formula
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", table 2) for comparison;
- :func:`model_state_bytes`: weights, gradients and optimizer state per
  device under mixed-precision Adam (2 + 2 + 12 bytes per parameter) or
  SGD (2 + 2 + 4 for the fp32 master weights, + 4 with momentum) and the
  ZeRO stage's division over the data-parallel ranks.

The simulated peak follows the same accounting: the gradient buffers are
resident for the whole step (:mod:`.zero`), so a device's gradient bytes
are 2 per parameter (2/dp from ZeRO 2 on) at every moment, plus the fresh
gradient of a parameter on its way into the buffer. With ZeRO 2 the fresh
gradients wait for their reduce-scatters, so where the network is slower
than the backward they add up to at most one micro-batch's full gradient
(2 per parameter) at the peak, which can then lie above ZeRO 1's.
"""
from __future__ import annotations

from typing import Dict

from ..ir.core import Function
from ..ir.occupancy import held_bytes
from .recompute import is_forward


def saved_activation_bytes(step: Function) -> Dict[int, int]:
    """Bytes per layer of forward values read by non-forward ops."""
    read_later = set()
    for op in step.ops:
        if not is_forward(op):
            read_later.update(op.inputs)
    out: Dict[int, int] = {}
    for op in step.ops:
        layer = op.meta.get("layer")
        if not is_forward(op) or not isinstance(layer, int):
            continue
        for k, v in enumerate(op.outputs):
            if v in read_later:
                out[layer] = out.get(layer, 0) + held_bytes(op, k)
    return out


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                                 recompute: str = "none") -> float:
    """Activation bytes per layer of a GPT layer with 16-bit activations
    and 1-byte dropout masks."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    attn_scores = 5.0 * a * s / (h * t) if recompute != "selective" else 0.0
    if sp:
        return s * b * h * (34.0 / t + attn_scores)
    return s * b * h * (10.0 + 24.0 / t + attn_scores)


def optimizer_bytes_per_param(optimizer: str = "adamw", momentum: bool = False) -> float:
    """fp32 optimizer state per parameter: master + m + v for AdamW (12);
    master (4), + momentum (4), for SGD."""
    if optimizer == "sgd":
        return 8.0 if momentum else 4.0
    return 12.0


def model_state_bytes(params: int, zero: int = 0, dp: int = 1, optimizer: str = "adamw",
                      momentum: bool = False) -> Dict[str, float]:
    """Bytes per device of ``params`` parameters (already divided by TP and
    PP): bf16 weights (2), bf16 gradients (2), fp32 optimizer state (12 for
    AdamW, see :func:`optimizer_bytes_per_param`)."""
    return {"weights": 2.0 * params / (dp if zero >= 3 else 1),
            "gradients": 2.0 * params / (dp if zero >= 2 else 1),
            "optimizer": optimizer_bytes_per_param(optimizer, momentum) * params
            / (dp if zero >= 1 else 1)}
