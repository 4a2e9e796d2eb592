"""Adversarial sample: the sweep estimator against full simulations on random
GPT / Llama configurations (see README.md here).

    python reports/estimator/sample.py [SEED] [N] [OUT.jsonl] [FLOW_SHARE] [LAYER_SHARE]

LAYER_SHARE: the share of ZeRO-3 points drawn with ``zero3_unit: layer``
(default 0: the sample of the README's tables); ``ZERO3_ONLY=1`` in the
environment draws ZeRO 3 on every point; ``COMM_STREAMS=per-group`` (or
``shared``) sets ``comm_streams`` on every point (default: the simulator's);
``FUSION=none`` (or another setting) sets ``fusion`` on every point
(default: distsim's, ``megatron`` for these GPT models); ``COMM_ORDER=inputs``
(or ``stream``) sets ``comm_order`` on every point (default: the
simulator's, ``stream``); ``CP_ONLY=1`` draws context-parallel points
instead (:func:`sample_cp`: cp 2 or 4, every ``cp_comm``, ZeRO 0-2);
``MOE_ONLY=1`` draws mixtures of experts instead (:func:`sample_moe`:
Mixtral-8x7B, DeepSeekMoE-16B and a GShard-style mix, ``ep`` 1, 2 or 4,
ZeRO 0-3; with ``ZERO3_ONLY=1`` ZeRO 3 on every point, by layer on
LAYER_SHARE of them, else by parameter).
``--help`` prints this.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback

import distsim
from distsim.errors import DistsimError
from distsim.estimate import estimate

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1234
N = int(sys.argv[2]) if len(sys.argv) > 2 else 150
OUT = sys.argv[3] if len(sys.argv) > 3 else "sample.jsonl"
FLOW_SHARE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
LAYER_SHARE = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
ZERO3_ONLY = os.environ.get("ZERO3_ONLY") == "1"
COMM_STREAMS = os.environ.get("COMM_STREAMS")
FUSION = os.environ.get("FUSION")
COMM_ORDER = os.environ.get("COMM_ORDER")
CP_ONLY = os.environ.get("CP_ONLY") == "1"
MOE_ONLY = os.environ.get("MOE_ONLY") == "1"
#: the layer draws on a stream of their own: a sample with and one without
#: them hold the same points otherwise
LAYER_RNG = random.Random(SEED + 1)

MODELS = {  # model -> (layers choices, seq override choices or None)
    "gpt2": ([2, 4, 6], [None, 256, 512]),
    "gpt3-1.3b": ([2, 4], [512, 1024]),
    "tiny": ([4, 8], [None]),
    "llama2-7b": ([2, 4], [512, 1024]),
    "llama3-8b": ([2, 4], [512]),
    "gpt": ([4, 8], [None]),
}
TOPOS = {"dgx-a100": 8, "dgx-a100-x2": 16, "dgx-a100-x4": 32, "workstation-4gpu-pcie": 4}
ORDERS = ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp")


def divisors(n):
    return [d for d in (1, 2, 4, 8, 16, 32) if n % d == 0 and d <= n]


def sample(rng: random.Random) -> dict:
    model = rng.choice(list(MODELS))
    layers_choice, seqs = MODELS[model]
    topo = rng.choices(list(TOPOS), weights=[4, 3, 1, 2])[0]
    n = TOPOS[topo]
    tp = rng.choice([d for d in divisors(n) if d <= 8])
    pp = rng.choice([d for d in divisors(n // tp) if d <= 4])
    dp = n // (tp * pp)
    o = {"model": model, "topology": topo, "dp": dp, "tp": tp, "pp": pp,
         "layers": rng.choice(layers_choice), "network_mode": "analytical"}
    seq = rng.choice(seqs)
    if seq:
        o["seq"] = seq
    mb = rng.choice([1, 1, 2, 4])
    m = rng.choice([1, 2, 3, 4, 6, 8]) if pp > 1 else rng.choice([1, 2, 3])
    o["micro_batch"] = mb
    o["global_batch"] = dp * mb * m
    if pp > 1:
        o["schedule"] = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved"])
        if o["schedule"] == "interleaved":
            o["virtual_stages"] = rng.choice([2, 2, 3, 4])
            o["layers"] = max(o["layers"], pp * o["virtual_stages"])
        if rng.random() < 0.25:
            o["partition"] = "balanced"
    o["layers"] = max(o["layers"], pp * o.get("virtual_stages", 1))
    if tp > 1 and rng.random() < 0.4:
        o["sp"] = True
    o["zero"] = rng.choice([0, 0, 1, 2, 3])
    if ZERO3_ONLY:
        o["zero"] = 3
    if o["zero"] == 3 and rng.random() < 0.4:
        o["prefetch"] = rng.choice([0, 2])
    if o["zero"] == 3 and LAYER_SHARE > 0 and LAYER_RNG.random() < LAYER_SHARE:
        o["zero3_unit"] = "layer"
    o["recompute"] = rng.choice(["none", "none", "selective", "full"])
    b = rng.random()
    if b < 0.25:
        o["bucket_mb"] = 0
    elif b < 0.5:
        o["bucket_mb"] = rng.choice([1, 5, 25, 100])
    if rng.random() < 0.2:
        o["order"] = rng.choice(ORDERS[1:])
    if rng.random() < 0.15:
        o["optimizer"] = "sgd"
    if rng.random() < FLOW_SHARE:
        o["network_mode"] = "flow"
    if COMM_STREAMS:
        o["comm_streams"] = COMM_STREAMS
    if FUSION:
        o["fusion"] = FUSION
    if COMM_ORDER:
        o["comm_order"] = COMM_ORDER
    return o


#: context parallelism: model -> (layer counts, sequence lengths)
CP_MODELS = {"gpt": ((2, 4), (512, 1024)), "gpt3-1.3b": ((2, 4), (1024, 2048)),
             "llama3-8b": ((2, 4), (1024, 2048)), "llama2-7b": ((2,), (2048, 4096))}
CP_TOPOS = {"dgx-a100": 8, "dgx-a100-x2": 16, "workstation-4gpu-pcie": 4}


def div(n, most):
    """The powers of two up to 16 and ``most`` that divide ``n``."""
    return [d for d in (1, 2, 4, 8, 16) if n % d == 0 and d <= most]


def sample_cp(rng: random.Random) -> dict:
    """A context-parallel point: cp 2 or 4 with each ``cp_comm`` (the
    ring under fused attention), tp, pp and its schedules, dp, sp, ZeRO
    0-2 (as drawn while the estimator refused cp with ZeRO 3; the
    agreement corpus's cp draws take ZeRO 3 too), recomputation, buckets,
    the mesh order, the optimizer."""
    model = rng.choice(sorted(CP_MODELS))
    layer_counts, seqs = CP_MODELS[model]
    topo = rng.choice(sorted(CP_TOPOS))
    n = CP_TOPOS[topo]
    cp = rng.choice([2, 4])
    tp = rng.choice(div(n // cp, 4))
    pp = rng.choice(div(n // (cp * tp), 2))
    dp = n // (cp * tp * pp)
    comm = rng.choice(["allgather", "ring", "alltoall"])
    o = {"model": model, "topology": topo, "dp": dp, "tp": tp, "pp": pp, "cp": cp,
         "cp_comm": comm, "seq": rng.choice(seqs), "layers": rng.choice(layer_counts),
         "network_mode": "analytical"}
    if comm == "ring" or rng.random() < .5:
        o["attention"] = "fused"
    mb = rng.choice([1, 1, 2])
    m = rng.randint(1, 6 if pp > 1 else 3)
    o.update(micro_batch=mb, global_batch=dp * mb * m)
    if pp > 1:
        o["schedule"] = rng.choice(["1f1b", "gpipe", "interleaved", "zb-h1"])
        if o["schedule"] == "interleaved":
            o["virtual_stages"] = 2
            o["layers"] = max(o["layers"], 4)
    if tp > 1 and rng.random() < .5:
        o["sp"] = True
    o["zero"] = rng.randint(0, 2)
    o["recompute"] = rng.choice(["none", "selective", "full"])
    draw_buckets_order_optimizer(rng, o)
    return o


def draw_buckets_order_optimizer(rng: random.Random, o: dict) -> None:
    """Gradient buckets (none, 0 or 25 MB), the mesh order and the
    optimizer into ``o`` (the cp and MoE samples' draws)."""
    bucket = rng.choice([None, 0, 25])
    if bucket is not None:
        o["bucket_mb"] = bucket
    order = rng.choice((None,) + ORDERS)
    if order:
        o["order"] = order
    o["optimizer"] = rng.choice(["adamw", "sgd"])


#: mixtures of experts: model -> (layer counts, sequence lengths); the
#: GShard-style mix (top-1 of 4 every other layer) by its fields
MOE_MODELS = {"mixtral-8x7b": ((2, 4), (256,)), "deepseek-moe-16b": ((2, 4), (256,)),
              "gpt2-moe-every-2": ((2, 4, 6), (256,))}
GPT2_MOE_EVERY_2 = {"family": "gpt", "layers": 4, "hidden": 768, "heads": 12, "vocab": 50304,
                    "seq": 256, "global_batch": 8, "experts": 4, "top_k": 1, "moe_every": 2}


def sample_moe(rng: random.Random) -> dict:
    """A mixture-of-experts point: tp, pp and its schedules, dp, ``ep`` 1,
    2 or 4 where it divides dp (and the experts), sp, ZeRO 0-3 (its
    prefetch drawn, by layer on LAYER_SHARE of the ZeRO-3 points, else by
    parameter; every point with ``ZERO3_ONLY``),
    recomputation, buckets, the mesh order, the optimizer, the routing
    balance and capacity factor."""
    name = rng.choice(sorted(MOE_MODELS))
    layer_counts, seqs = MOE_MODELS[name]
    topo = rng.choice(sorted(CP_TOPOS))
    n = CP_TOPOS[topo]
    tp = rng.choice(div(n, 4))
    pp = rng.choice(div(n // tp, 2))
    dp = n // (tp * pp)
    o = {"model": GPT2_MOE_EVERY_2 if name == "gpt2-moe-every-2" else name, "topology": topo,
         "dp": dp, "tp": tp, "pp": pp, "seq": rng.choice(seqs),
         "layers": rng.choice(layer_counts), "network_mode": "analytical"}
    o["ep"] = rng.choice([e for e in (1, 2, 4) if dp % e == 0])
    mb = rng.choice([1, 1, 2])
    m = rng.randint(1, 4 if pp > 1 else 3)
    o.update(micro_batch=mb, global_batch=dp * mb * m)
    if pp > 1:
        o["schedule"] = rng.choice(["1f1b", "gpipe", "interleaved"])
        if o["schedule"] == "interleaved":
            o["virtual_stages"] = 2
        o["layers"] = max(o["layers"], pp * o.get("virtual_stages", 1))
    if tp > 1 and rng.random() < .5:
        o["sp"] = True
    o["zero"] = 3 if ZERO3_ONLY else rng.randint(0, 3)
    if o["zero"] == 3 and rng.random() < .5:
        o["prefetch"] = rng.choice([0, 2])
    if o["zero"] == 3 and LAYER_SHARE > 0 and LAYER_RNG.random() < LAYER_SHARE:
        o["zero3_unit"] = "layer"
    o["recompute"] = rng.choice(["none", "selective"])
    draw_buckets_order_optimizer(rng, o)
    o["routing_skew"] = rng.choice([0.0, 0.1, 0.3])
    return o


KEYS = ["step_time_s", "max_peak_memory_bytes", "compute_s", "exposed_communication_s",
        "idle_s", "bubble_fraction", "communication_s"]


def main():
    rng = random.Random(SEED)
    t0 = time.time()
    with open(OUT, "w") as f:
        for i in range(N):
            o = sample_cp(rng) if CP_ONLY else sample_moe(rng) if MOE_ONLY else sample(rng)
            rec = {"i": i, "options": o}
            try:
                t = time.time()
                e = estimate(o)
                rec["est_s"] = time.time() - t
                rec["est"] = {k: e.get(k) for k in KEYS}
            except DistsimError as exc:
                rec["est_error"] = f"{type(exc).__name__}: {exc}"
            except Exception:  # a traceback: a finding
                rec["est_crash"] = traceback.format_exc()
            try:
                t = time.time()
                s = distsim.simulate(max_wall_s=60, **o).summary()
                rec["sim_s"] = time.time() - t
                rec["sim"] = {k: s.get(k) for k in KEYS}
            except DistsimError as exc:
                rec["sim_error"] = f"{type(exc).__name__}: {exc}"
            except Exception:
                rec["sim_crash"] = traceback.format_exc()
            f.write(json.dumps(rec) + "\n")
            f.flush()
    print("total", time.time() - t0, file=sys.stderr)


if __name__ == "__main__":
    main()
