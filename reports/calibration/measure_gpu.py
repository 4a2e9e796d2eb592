"""Measure the microbenchmarks `distsim calibrate` fits a device's figures
to, on any CUDA GPU, with PyTorch only.

    python3 reports/calibration/measure_gpu.py --out my-gpu.json
    distsim calibrate my-gpu.json --topology dgx-h100 --out my-cluster.yaml

Sections of the JSON (reports/calibration/README.md says what each figure
means in the model):

1. ``gemm``: GEMMs (bf16, fp16) timed one shape after another, twice, the
   order reversed on the second pass, each as ``torch.matmul(x, w.t())``
   (what ``F.linear`` runs) or ``torch.bmm`` (batched): the per-GPU GEMMs
   of a GPT layer under tensor parallelism (``--hidden``, ``--tp``) for
   2048-8192 tokens, squares, GEMMs of one or two waves of tiles over a
   long K and short-K GEMMs (which show the tile and wave effects and the
   per-tile overhead), and attention's batched products. Three input sets
   are rotated so that no operand stays in L2; a slice of every product is
   checked against float64. Series ``sweep``.
2. ``gemm_cycles``: the TP GEMMs back to back with no gap, and a layer's
   forward (its GEMMs among layernorm, residual adds and GELU) in a loop,
   each GEMM between its own events, after a ``--heat-s`` heat-up: the
   clock a long training run holds (a card at its power limit lowers it
   under dense GEMMs). Series ``back-to-back`` and ``layer``; the layer
   loop is the reference the calibrated efficiencies are given at.
3. ``attention``: ``scaled_dot_product_attention`` (the flash backend when
   PyTorch has it), forward and forward + backward, head dim 128 and 64,
   causal and not, 512-8192 keys at 16k tokens.
4. ``memory``, ``vector``, ``launch`` (:mod:`gpu_bench`): bandwidth by
   kernel class, the CUDA cores' fp32 rate, the per-kernel overhead.

Efficiencies printed and recorded are fractions of the GPU's datasheet
peaks: known GPUs are recognised by name (:data:`KNOWN`), others take
``--peak-flops`` and ``--bandwidth`` (without them only times are kept,
and calibrate takes the peaks from ``--topology``). A thread samples
nvidia-smi (SM clock, power, temperature, clock-event reasons) every 0.5 s.
The JSON is written after every section, so a timeout keeps what ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import (DTYPES, PEAKS, SMI_QUERY, SmiSampler, environment, fraction,  # noqa: E402
                       measure_launch, measure_memory, measure_vector, nvidia_smi, pick_inner,
                       rel_err, time_events)

#: datasheet peaks (dense FLOP/s, memory B/s) by a piece of the device name
#: PyTorch reports; the first match wins
KNOWN = [
    ("H200", {"bf16": 989e12, "f16": 989e12, "f32": 67e12}, 4.8e12),
    ("H100 80GB HBM3", {"bf16": 989e12, "f16": 989e12, "f32": 67e12}, 3.35e12),
    ("H100 PCIe", {"bf16": 756e12, "f16": 756e12, "f32": 51e12}, 2.0e12),
    ("A100-SXM4-80GB", {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12}, 2.039e12),
    ("A100-SXM4-40GB", {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12}, 1.555e12),
    ("A100 80GB PCIe", {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12}, 1.935e12),
]
HIDDEN, TP = 12288, 8


def _show(x) -> str:
    return "   -" if x is None else f"{x:.3f}"


# -------------------------------------------------------------------- GEMMs
def gemm_shapes():
    """(label, batch, M, N, K): x[M,K] @ w[N,K]^T, batched when batch > 1."""
    h, t = HIDDEN, TP
    shapes = []
    for tokens in (2048, 4096, 8192):
        shapes += [
            (f"tp{t} qkv fwd, {tokens} tok", 1, tokens, 3 * h // t, h),
            (f"tp{t} attn-proj fwd, {tokens} tok", 1, tokens, h, h // t),
            (f"tp{t} mlp-up fwd, {tokens} tok", 1, tokens, 4 * h // t, h),
            (f"tp{t} mlp-down fwd, {tokens} tok", 1, tokens, h, 4 * h // t),
            (f"tp{t} qkv wgrad, {tokens} tok", 1, h, 3 * h // t, tokens),
        ]
    shapes.append((f"tp1 {h}x{h}, 4096 tok", 1, 4096, h, h))
    for s in (2048, 4096, 8192, 16384):
        shapes.append((f"square {s}", 1, s, s, s))
    for s in (512, 768, 1024, 1280, 1536, 2048, 2560, 3072):      # few waves, long K
        k = 131072 if s < 1024 else 65536 if s < 2048 else 32768    # tens of microseconds
        shapes.append((f"few waves {s}x{s}, K {k}", 1, s, s, k))
    for k in (128, 256, 512, 1024):                                # short K
        shapes.append((f"short K {k}", 1, 8192, 8192, k))
    heads = 96 // t
    for tokens in (2048, 4096):                                    # attention's products
        b = heads * (16384 // tokens)
        shapes.append((f"attention scores, {tokens} tok", b, tokens, tokens, 128))
        shapes.append((f"attention context, {tokens} tok", b, tokens, 128, tokens))
    return shapes


def measure_gemms(dtypes=("bf16", "f16"), reps=15, passes=2) -> list:
    """Every shape of :func:`gemm_shapes` in each dtype, ``passes`` times,
    the shape order reversed on every other pass (so that a drift of the
    clock over the section shows as a difference between passes)."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    work = [(d, shape) for d in dtypes for shape in gemm_shapes()]
    for pas in range(passes):
        for dname, (label, b, m, n, k) in (work if pas % 2 == 0 else work[::-1]):
            dt = DTYPES[dname]
            lead = (b,) if b > 1 else ()
            sets = [(torch.randn(*lead, m, k, device="cuda", dtype=dt, generator=gen),
                     torch.randn(*lead, n, k, device="cuda", dtype=dt, generator=gen) / k ** 0.5)
                    for _ in range(3)]
            outs = [torch.empty(*lead, m, n, device="cuda", dtype=dt) for _ in range(3)]
            state = {"i": 0}

            def run():
                i = state["i"] = (state["i"] + 1) % 3
                x, w = sets[i]
                if b > 1:
                    torch.bmm(x, w.transpose(1, 2), out=outs[i])
                else:
                    torch.matmul(x, w.t(), out=outs[i])   # what F.linear does, in place

            x, w = (s.reshape(-1, s.shape[-1]) for s in sets[0])
            check = F.linear(x[:64], w[:64])
            err = rel_err(check, x[:64].double().cpu() @ w[:64].double().cpu().t())
            inner = pick_inner(run)
            t_start = time.time()
            tm = time_events(run, inner, reps, warmup=max(3, inner))
            flops = 2.0 * b * m * n * k
            eff = fraction(flops / tm["median_s"], dname)
            rows.append({"pass": pas, "series": "sweep", "dtype": dname, "label": label,
                         "batch": b, "M": m, "N": n, "K": k, "flops": flops, **tm,
                         "t_start": t_start, "t_end": time.time(),
                         "tflops": flops / tm["median_s"] / 1e12, "efficiency": eff,
                         "rel_err_vs_f64": err})
            print(f"gemm p{pas} {dname} {label:32s} {b:3d}x{m:6d}x{n:6d}x{k:6d} "
                  f"{rows[-1]['tflops']:7.1f} TFLOP/s  eff {_show(eff)}  err {err:.1e}",
                  flush=True)
            del sets, outs
            torch.cuda.empty_cache()
    return rows


def gemm_cycles(seconds: float = 12.0, tokens=(2048, 4096, 8192)) -> dict:
    """GEMMs at the clock they get in a long run, two ways, each for about
    ``seconds`` after the card is hot, each GEMM between its own events:

    * ``gemms_only``: the 15 bf16 tensor-parallel shapes of :func:`gemm_shapes`
      (5 per token count) one after another, round after round, with no gap;
    * ``layer``: a tensor-parallel layer's forward at 4096 tokens, its GEMMs with
      the element-wise ops between them (layernorm, residual add, GELU), as
      in training, where the memory-bound ops leave the card some power.

    Per GEMM: the median over the rounds after the first fifth."""
    h, t = HIDDEN, TP
    gen = torch.Generator(device="cuda").manual_seed(4)
    bf = torch.bfloat16

    def gemm_op(m, n, k):
        x = torch.randn(m, k, device="cuda", dtype=bf, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=bf, generator=gen) / k ** 0.5
        out = torch.empty(m, n, device="cuda", dtype=bf)
        return lambda: torch.matmul(x, w.t(), out=out)

    def run_cycle(ops, seconds):
        """ops: list of (label, (M, N, K) or None, fn); times every op with events."""
        for _, _, fn in ops:
            fn()
        torch.cuda.synchronize()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        for _, _, fn in ops:
            fn()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        rounds = max(20, int(seconds / max(ev.elapsed_time(end) / 1e3, 1e-4)))
        events = [[torch.cuda.Event(enable_timing=True) for _ in range(len(ops) + 1)]
                  for _ in range(rounds)]
        for r in range(rounds):
            events[r][0].record()
            for i, (_, _, fn) in enumerate(ops):
                fn()
                events[r][i + 1].record()
        torch.cuda.synchronize()
        skip = rounds // 5
        rows = []
        for i, (label, shape, _) in enumerate(ops):
            ts = [events[r][i].elapsed_time(events[r][i + 1]) / 1e3 for r in range(skip, rounds)]
            med = statistics.median(ts)
            row = {"label": label, "median_s": med, "min_s": min(ts), "max_s": max(ts)}
            if shape:
                flops = 2.0 * shape[0] * shape[1] * shape[2]
                row.update(M=shape[0], N=shape[1], K=shape[2], dtype="bf16", flops=flops,
                           tflops=flops / med / 1e12, efficiency=fraction(flops / med, "bf16"))
            rows.append(row)
        total = [events[r][0].elapsed_time(events[r][-1]) / 1e3 for r in range(skip, rounds)]
        return {"rounds": rounds, "round_median_s": statistics.median(total), "ops": rows}

    result = {}
    ops = []
    for label, _, m, n, k in gemm_shapes():
        if label.startswith(f"tp{t} ") and any(label.endswith(f" {tk} tok") for tk in tokens):
            ops.append((label, (m, n, k), gemm_op(m, n, k)))
    result["gemms_only"] = run_cycle(ops, seconds)
    del ops
    torch.cuda.empty_cache()

    tk = 4096

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=bf, generator=gen) * scale

    xs, g, b = rnd(tk, h), rnd(h, scale=0.1) + 1, rnd(h, scale=0.1)
    qkv_w, proj_w = rnd(3 * h // t, h, scale=h ** -0.5), rnd(h, h // t, scale=(h // t) ** -0.5)
    up_w = rnd(4 * h // t, h, scale=h ** -0.5)
    down_w = rnd(h, 4 * h // t, scale=(4 * h // t) ** -0.5)
    ctx = rnd(tk, h // t)   # stands in for the attention's output (attention itself not run)
    # Each op's input holds what the op before it really produces; outputs
    # the next op does not read are written to their own buffers.
    ln1 = F.layer_norm(xs, (h,), g, b)
    qkv = torch.empty(tk, 3 * h // t, device="cuda", dtype=bf)
    proj = torch.matmul(ctx, proj_w.t())
    res1 = xs + proj
    ln2 = F.layer_norm(res1, (h,), g, b)
    up = torch.matmul(ln2, up_w.t())
    act = F.gelu(up, approximate="tanh")
    down = torch.matmul(act, down_w.t())
    res2 = torch.empty_like(xs)
    layer = [
        ("layernorm 1", None, lambda: F.layer_norm(xs, (h,), g, b)),
        ("qkv fwd", (tk, 3 * h // t, h), lambda: torch.matmul(ln1, qkv_w.t(), out=qkv)),
        ("attn-proj fwd", (tk, h, h // t), lambda: torch.matmul(ctx, proj_w.t(), out=proj)),
        ("residual add 1", None, lambda: torch.add(xs, proj, out=res1)),
        ("layernorm 2", None, lambda: F.layer_norm(res1, (h,), g, b)),
        ("mlp-up fwd", (tk, 4 * h // t, h), lambda: torch.matmul(ln2, up_w.t(), out=up)),
        ("gelu", None, lambda: F.gelu(up, approximate="tanh")),
        ("mlp-down fwd", (tk, h, 4 * h // t), lambda: torch.matmul(act, down_w.t(),
                                                                  out=down)),
        ("residual add 2", None, lambda: torch.add(res1, down, out=res2)),
    ]
    result["layer"] = run_cycle(layer, seconds)
    result["layer"]["tokens"] = tk
    gemm_time = sum(r["median_s"] for r in result["layer"]["ops"] if "flops" in r)
    result["layer"]["gemm_share_of_round"] = gemm_time / result["layer"]["round_median_s"]
    for part in ("gemms_only", "layer"):
        for r in result[part]["ops"]:
            if "flops" in r:
                print(f"cycle {part:10s} {r['label']:28s} {r['tflops']:6.1f} TFLOP/s  "
                      f"eff {_show(r['efficiency'])}", flush=True)
    return result


def sustained_gemm(seconds: float = 3.0) -> dict:
    """Back-to-back 8192-token MLP-up bf16 GEMMs for about ``seconds``: the
    rate over the first and the last fifth, and nvidia-smi read mid-run
    (the sampler thread of :func:`main` reads it throughout too)."""
    m, n, k = 8192, 4 * HIDDEN // TP, HIDDEN
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    run = lambda: torch.matmul(x, w.t(), out=out)  # noqa: E731
    inner = pick_inner(run, target_s=0.02)
    nblocks = max(10, int(seconds / 0.02))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(nblocks + 1)]
    torch.cuda.synchronize()
    events[0].record()
    for b in range(nblocks):
        for _ in range(inner):
            run()
        events[b + 1].record()
    # The host ran ahead (it blocks only when the launch queue is full): read
    # the card while the queued GEMMs still execute.
    smi_mid = nvidia_smi(SMI_QUERY)
    torch.cuda.synchronize()
    block_s = [events[b].elapsed_time(events[b + 1]) / 1e3 / inner for b in range(nblocks)]
    flops = 2.0 * m * n * k
    fifth = max(1, nblocks // 5)
    first = statistics.median(block_s[:fifth])
    last = statistics.median(block_s[-fifth:])
    print(f"sustained bf16 {m}x{n}x{k} for {sum(block_s) * inner:.1f} s: first fifth "
          f"{flops / first / 1e12:.0f}, last fifth {flops / last / 1e12:.0f} TFLOP/s", flush=True)
    return {"M": m, "N": n, "K": k, "dtype": "bf16", "blocks": nblocks, "inner": inner,
            "total_s": sum(block_s) * inner,
            "block_tflops": [flops / t / 1e12 for t in block_s],
            "first_fifth_tflops": flops / first / 1e12, "last_fifth_tflops": flops / last / 1e12,
            "last_fifth_efficiency": fraction(flops / last, "bf16"), "nvidia_smi_during": smi_mid}


# ---------------------------------------------------------------- attention
def _sdpa_context():
    """The flash backend of scaled_dot_product_attention where PyTorch has
    the selector (what FlashAttention-2 runs); the default otherwise."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION), "flash"
    except Exception:  # noqa: BLE001
        import contextlib
        return contextlib.nullcontext(), "default"


def measure_attention(reps=9, tokens=16384) -> list:
    """Forward and forward + backward of scaled_dot_product_attention, bf16,
    ``tokens`` tokens per call (batch = tokens / seq), hidden 2048 (16 heads
    of 128, 32 of 64), the shapes FlashAttention's own benchmarks use."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(5)
    for d in (128, 64):
        heads = 2048 // d
        for seq in (512, 1024, 2048, 4096, 8192):
            b = tokens // seq
            for causal in (False, True):
                q, k, v = (torch.randn(b, heads, seq, d, device="cuda", dtype=torch.bfloat16,
                                       generator=gen, requires_grad=True) for _ in range(3))
                grad = torch.randn_like(q)
                ctx, backend = _sdpa_context()
                fwd_flops = 4.0 * b * heads * seq * seq * d * (0.5 if causal else 1.0)
                with ctx:
                    def fwd():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def both():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        out.backward(grad)
                    for direction, fn, flops in (("fwd", fwd, fwd_flops),
                                                 ("fwd+bwd", both, 3.5 * fwd_flops)):
                        try:
                            tm = time_events(fn, pick_inner(fn), reps, warmup=3)
                        except Exception as exc:  # noqa: BLE001
                            rows.append({"direction": direction, "seq_q": seq, "head_dim": d,
                                         "error": repr(exc)})
                            continue
                        rate = flops / tm["median_s"]
                        rows.append({"direction": direction, "batch": b, "heads": heads,
                                     "seq_q": seq, "seq_k": seq, "head_dim": d,
                                     "causal": causal, "dtype": "bf16", "backend": backend,
                                     "series": f"sdpa-{backend}", "flops": flops, **tm,
                                     "tflops": rate / 1e12,
                                     "efficiency": fraction(rate, "bf16")})
                        print(f"attention {direction:7s} d{d} s{seq:5d} "
                              f"{'causal' if causal else 'full  '} {rate / 1e12:6.1f} TFLOP/s "
                              f"eff {_show(fraction(rate, 'bf16'))}", flush=True)
                del q, k, v, grad
                torch.cuda.empty_cache()
    return rows


def set_peaks(args, gpu: str) -> None:
    """Fill :data:`gpu_bench.PEAKS` from the flags or the known GPUs."""
    if args.peak_flops:
        flops = {}
        for part in args.peak_flops.split(","):
            name, _, value = part.partition("=")
            flops[name.strip()] = float(value)
        PEAKS["peak_flops"] = flops
        if args.bandwidth:
            PEAKS["memory_bandwidth_Bps"] = float(args.bandwidth)
        return
    for key, flops, bw in KNOWN:
        if key in gpu:
            PEAKS.update(peak_flops=flops, memory_bandwidth_Bps=bw)
            return
    print(f"{gpu}: peaks unknown (give --peak-flops and --bandwidth): times only", flush=True)


def main(argv=None) -> int:
    global HIDDEN, TP
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu.json"))
    ap.add_argument("--peak-flops", help="dense peaks, e.g. bf16=989e12,f16=989e12,f32=67e12 "
                                         "(default: the datasheet's, for a known GPU)")
    ap.add_argument("--bandwidth", help="memory bandwidth in B/s, e.g. 3.35e12")
    ap.add_argument("--hidden", type=int, default=HIDDEN,
                    help="the GPT layer's hidden size whose GEMMs are measured")
    ap.add_argument("--tp", type=int, default=TP, help="its tensor-parallel degree")
    ap.add_argument("--heat-s", type=float, default=10.0,
                    help="seconds of back-to-back GEMMs before the GEMM shapes")
    ap.add_argument("--passes", type=int, default=2, help="passes over the GEMM shapes")
    ap.add_argument("--cycle-s", type=float, default=12.0,
                    help="seconds of each GEMM cycle (shapes back to back; a layer)")
    ap.add_argument("--sustained-s", type=float, default=20.0,
                    help="seconds of the final sustained GEMM run")
    ap.add_argument("--skip", action="append", default=[],
                    help="a section not to run (repeatable): launch, memory, vector, "
                         "attention, gemm, gemm_cycles, gemm_sustained")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    HIDDEN, TP = args.hidden, args.tp
    t0 = time.time()
    env = environment()
    set_peaks(args, env["gpu"])
    result = {"script": "reports/calibration/measure_gpu.py", "environment": env}
    if PEAKS:
        result["peaks_used"] = dict(PEAKS)
    print(json.dumps(result, indent=1), flush=True)
    sampler = SmiSampler()
    sampler.start()
    # launch, memory, vector and attention first, on a cool card; then a
    # heat-up so that the GEMMs are measured at the clock a long training
    # run holds (power cap)
    sections = (("launch", measure_launch), ("memory", measure_memory),
                ("vector", measure_vector), ("attention", measure_attention),
                ("heat_up", lambda: sustained_gemm(seconds=args.heat_s)),
                ("gemm", lambda: measure_gemms(passes=args.passes)),
                ("gemm_cycles", lambda: gemm_cycles(seconds=args.cycle_s)),
                ("gemm_sustained", lambda: sustained_gemm(seconds=args.sustained_s)))
    result["section_times"] = {}
    for name, fn in sections:
        if name in args.skip:
            continue
        t_start = time.time()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - keep what the other sections measured
            result[name] = {"error": repr(exc)}
            print(f"{name}: FAILED {exc!r}", flush=True)
        result["section_times"][name] = [t_start, time.time()]
        result["nvidia_smi_samples"] = list(sampler.samples)
        with open(args.out, "w") as fh:   # after each section: a timeout keeps the rest
            json.dump(result, fh, indent=1)
    sampler.stop()
    result["nvidia_smi_samples"] = list(sampler.samples)
    result["nvidia_smi_sample_fields"] = ["time", "clocks.sm MHz", "clocks.mem MHz",
                                          "power.draw W", "temperature C",
                                          "clocks_event_reasons.active"]
    result["environment"]["nvidia_smi_after"] = nvidia_smi(SMI_QUERY)
    result["wall_s"] = time.time() - t0
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
