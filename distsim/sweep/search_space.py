"""The points a ``distsim search`` tries, and the memory bound that prunes
them before anything is estimated.

Every ``dp x tp x pp x cp == gpus`` (``cp`` from ``--space cp=...`` or a
fixed ``cp``, else 1), crossed with the ``--space`` options; for GPT models
by default the micro-batch sizes that divide each data-parallel rank's
share of the global batch, and for a mixture of experts the expert-parallel
degrees valid at each point (``ep`` dividing both ``dp x cp`` -- the
experts see the cp ranks as data-parallel ones -- and the number of
experts). The strategy's own checks (cp and the sequence, the heads
and tp, ...) refuse what is left invalid, with their reason, as for any
other point.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..report.summary import GB

STRATEGY_AXES = ("dp", "tp", "pp")
#: Micro-batch sizes a search tries by default (those that divide the batch).
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
_DTYPE_BYTES = {"fp32": 4, "f32": 4, "float32": 4, "fp16": 2, "f16": 2, "bf16": 2,
                "float16": 2, "bfloat16": 2, "fp8": 1}
#: how a point pruned by the weights bound is explained (and recognised)
WEIGHTS_REASON = "weights alone need"
#: cp_comm at cp 1, where there is no context parallelism to communicate
_NO_CP_COMM = "allgather"


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def model_config(model: Any, overrides: Mapping[str, Any]) -> Dict[str, Any]:
    from ..models import load_model_config
    config = load_model_config(model)
    config.update({k: v for k, v in overrides.items() if k in config and v is not None})
    if overrides.get("batch") is not None and config.get("family") == "gpt":
        config["global_batch"] = overrides["batch"]
    return config


def _dtype_bytes(config: Mapping[str, Any]) -> Optional[int]:
    return _DTYPE_BYTES.get(str(config.get("dtype", "")).lower())


def weights_lower_bound(model: Any, overrides: Mapping[str, Any]) -> Optional[float]:
    """Bytes of the model's weights (parameters x dtype size), or None when
    the model family does not say its parameter count."""
    from ..models import family_of
    config = model_config(model, overrides)
    try:
        described = family_of(config).describe(config)
    except Exception:  # a family that cannot describe this config: no bound
        return None
    params = described.get("parameters") if isinstance(described, Mapping) else None
    size = _dtype_bytes(config)
    if not isinstance(params, (int, float)) or not size:
        return None
    return float(params) * size


def expert_weights(config: Mapping[str, Any]) -> float:
    """Bytes of a GPT model's routed experts (0 without experts): the part
    of the weights expert parallelism shares out over ``ep`` ranks."""
    if config.get("family") != "gpt" or not config.get("experts"):
        return 0.0
    from ..models.gpt_family import gpt_config
    from ..models.moe import moe_layers, moe_mlp_params
    c = gpt_config(config)
    routed = moe_mlp_params(c, c.experts) - moe_mlp_params(c, 0)
    return float(moe_layers(c) * routed * (_dtype_bytes(config) or 0))


def weights_per_gpu(weights: float, experts: float, point: Mapping[str, Any],
                    base: Mapping[str, Any]) -> float:
    """A lower bound on the weight bytes a GPU of ``point`` holds: at least
    1/(tp x pp) of the weights, the routed experts' (``experts`` bytes of
    ``weights``) also divided by ``ep``, or all of them 1/(tp x pp x dp x
    cp) under ZeRO 3, which shards them over the data-parallel (and
    context-parallel) ranks too (a bound over tp x pp alone pruned ZeRO-3
    points that fit). Each division only lowers the bound."""
    def option(name: str) -> Any:
        return point.get(name, base.get(name))
    split = point["tp"] * point["pp"]
    if option("zero") == 3:
        split *= point["dp"] * (option("cp") or 1)
    return (weights - experts + experts / (option("ep") or 1)) / split


def weights_exceed(weights: Optional[float], experts: float, capacity: Optional[float],
                   point: Mapping[str, Any], base: Mapping[str, Any]) -> Optional[str]:
    """Why ``point`` cannot fit, from its weights alone
    (:func:`weights_per_gpu`), or None when it may: a lower bound, so it
    never prunes a point that fits."""
    if weights is None or not capacity:
        return None
    need = weights_per_gpu(weights, experts, point, base)
    if need <= capacity:
        return None
    return f"{WEIGHTS_REASON} {need / GB:.1f} GB per GPU > {capacity / GB:.1f} GB"


def check_space(space: Mapping[str, Sequence[Any]], base: Mapping[str, Any],
                config: Mapping[str, Any], gpus: int) -> None:
    """Refuse, in one line, a ``--space`` (or fixed) cp or ep that no point
    can take: cp or ep on a model that cannot use it, a degree that does
    not divide the GPUs, an ep that does not divide the experts."""
    name = config.get("name") or "the model"
    experts = (config.get("experts") or 0) if config.get("family") == "gpt" else 0
    for key in ("cp", "ep"):
        where = f"--space {key}" if key in space else f"--set {key}"
        values = space.get(key, [base[key]] if base.get(key) is not None else [])
        for v in values:
            if v == 1:
                continue
            if key == "cp" and config.get("family") != "gpt":
                raise ConfigError(f"{where} {v}: context parallelism is modelled for GPT "
                                  f"models only ('{name}' is of the '{config.get('family')}' "
                                  "family)")
            if key == "ep" and not experts:
                raise ConfigError(f"{where} {v}: model '{name}' has no experts (a dense model)")
            if key == "ep" and experts % v:
                raise ConfigError(f"{where} {v}: does not divide the model's {experts} experts")
            if gpus % v:
                raise ConfigError(f"{where} {v}: does not divide the {gpus} GPUs")


def enumerate_points(gpus: int, space: Mapping[str, Sequence[Any]], base: Mapping[str, Any],
                     config: Mapping[str, Any]
                     ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[str]]:
    """``(points, pruned, axes)``: every point of the search (see the
    module docstring), those pruned because dp does not divide the global
    batch (with the reason), and the searched options, strategy first."""
    is_gpt = config.get("family") == "gpt"
    batch = base.get("global_batch") or (config.get("global_batch") if is_gpt else None)
    default_mb = is_gpt and not ({"micro_batch", "microbatches"} & (set(space) | set(base)))
    experts = (config.get("experts") or 0) if is_gpt else 0
    default_ep = bool(experts) and "ep" not in space and base.get("ep") is None
    cps = list(space.get("cp", [base.get("cp") or 1]))
    points: List[Dict[str, Any]] = []
    pruned: List[Dict[str, Any]] = []
    for cp in cps:
        for tp in divisors(gpus // cp):
            for pp in divisors(gpus // (cp * tp)):
                strategy = {"dp": gpus // (cp * tp * pp), "tp": tp, "pp": pp,
                            **({"cp": cp} if "cp" in space else {})}
                dp = strategy["dp"]
                extra = {k: list(v) for k, v in space.items() if k != "cp"}
                if cp == 1 and "cp_comm" in extra:
                    extra["cp_comm"] = [_NO_CP_COMM]     # nothing to choose without cp
                if default_ep:
                    extra["ep"] = divisors(math.gcd(dp * cp, experts))
                if default_mb:
                    share = batch // dp if batch and batch % dp == 0 else 0
                    sizes = [m for m in DEFAULT_MICRO_BATCHES if share and share % m == 0]
                    if not sizes:
                        pruned.append({**strategy, "reason": f"dp {dp} does not divide "
                                                             f"the global batch {batch}"})
                        continue
                    extra["micro_batch"] = sizes
                combos: List[Dict[str, Any]] = [{}]
                for k, values in extra.items():
                    combos = [{**c, k: v} for c in combos for v in values]
                points.extend({**strategy, **c} for c in combos)
    axes = list(dict.fromkeys([*STRATEGY_AXES, *space, *(["ep"] if default_ep else []),
                               *(["micro_batch"] if default_mb else [])]))
    return points, pruned, axes
