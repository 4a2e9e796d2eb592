"""Measure the four device figures of distsim's roofline cost model on one GPU.

The cost model (distsim/cost/model.py) times one compute op as

    launch_overhead_s + max(flops / (peak_flops[dtype] * eff),
                            bytes / (memory_bandwidth_Bps * memory_efficiency))

where ``eff`` is ``matmul_efficiency`` for matrix products and
``vector_efficiency`` for every other op, and ``bytes`` counts each input
and each output once. This script measures each quantity the same way:

1. GEMMs (bf16 and fp16, ``torch.matmul(x, W.t())``, what
   ``torch.nn.functional.linear`` computes in a transformer layer): achieved FLOP/s = 2*M*N*K / time, divided by the
   peak the topology file gives (989e12 for H100 SXM5). Shapes: the
   per-GPU GEMMs of a GPT-3 175B layer (hidden 12288) under tensor
   parallelism 8 for 2048, 4096 and 8192 tokens (QKV 12288->4608,
   attention projection 1536->12288, MLP up 12288->6144, MLP down
   6144->12288, and the weight gradient of QKV, whose reduction dimension
   is the tokens), the unsharded 12288x12288 layer, and squares 4096,
   8192, 16384. Three input sets are rotated so that no operand stays in
   L2. A slice of every product is checked against float64 on the CPU.
   The card first runs ``--heat-s`` seconds of back-to-back GEMMs, so the
   shapes are timed at the clock a long training run holds (an H100 at
   its 700 W limit lowers its SM clock under dense GEMMs); the shapes are
   timed in ``--passes`` passes, the order reversed on every other pass.
   Then, for ``--cycle-s`` seconds each, the 15 TP-8 shapes back to back
   with no gap, and a TP-8 layer's forward (its four GEMMs with layernorm,
   residual adds and GELU between them) in a loop, every op between its
   own events (:func:`gemm_cycles`). A final sustained run (``--sustained-s`` seconds of back-to-back
   8192-token MLP-up GEMMs) gives the rate block by block.
2. Streaming memory traffic: device-to-device copy, add, scale, tanh-GELU,
   layernorm (hidden 12288) and softmax (over 2048 keys), bf16 and some
   fp32, on tensors of hundreds of MB (far beyond the 50 MB L2). Achieved
   bytes/s counts inputs + outputs once (the model's count), over the
   datasheet bandwidth (3.35e12 B/s) -> memory_efficiency. Each op's
   model FLOP count (distsim/cost/flops*.py) over its time is recorded too,
   to show how far the vector compute term is from binding.
3. Vector (non-matrix) arithmetic: an element-wise kernel made with
   torch.cuda.jiterator that runs a chain of NITER dependent multiply-adds
   per element in fp32 (2*NITER FLOP per element, 16 bytes per element, so
   compute-bound), on fp32 tensors and on bf16 tensors (bf16 in and out,
   fp32 arithmetic, as PyTorch's own element-wise kernels do), written
   three ways (y*a+b, fmaf, four independent fmaf chains). Achieved
   FLOP/s over peak_flops[f32] (67e12) and peak_flops[bf16] (989e12, the
   tensor-core figure the model uses for every bf16 op) -> vector_efficiency.
4. Launch overhead: a one-element add issued N times back to back from
   Python without synchronising (per-launch time = the host's issue rate),
   with a synchronisation after every launch (launch + completion round
   trip), and captured N times in one CUDA graph (device-side time per
   kernel); plus adds of 1 to 2^28 elements in both modes, fitted to
   t = L + bytes / B (least squares on relative error), over all sizes and
   over the sizes where the device, not the host's issue rate, sets the
   pace -> launch_overhead_s.

Timing: CUDA events around ``inner`` back-to-back calls (inner chosen so a
repetition lasts a few ms), after warm-up; the figure is the median over
``reps`` repetitions, with min and max kept. Inputs are random (never
zeros). A thread reads nvidia-smi (SM clock, power, temperature, clock
event reasons) every 0.5 s throughout; the JSON keeps the samples and each
section's start and end. Nothing changes the card's settings.

Usage (on the GPU machine):  python3 reports/calibration/measure_h100.py --out $OUT/h100.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

# The topology file's peaks (topologies/dgx-h100.yaml, from the H100 SXM5 datasheet).
PEAK = {"bf16": 989.0e12, "f16": 989.0e12, "f32": 67.0e12}
PEAK_BW = 3.35e12
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
HIDDEN = 12288
TP = 8


def nvidia_smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - a record, not a control path
        return f"error: {exc!r}"


SMI_QUERY = ("name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,power.draw,"
             "power.limit,temperature.gpu,clocks_throttle_reasons.active")


class SmiSampler(threading.Thread):
    """Reads SM clock, power, temperature and clock-event reasons every
    ``period`` seconds while the measurements run (read-only queries)."""

    def __init__(self, period: float = 0.5):
        super().__init__(daemon=True)
        self.period, self.samples, self._stop_flag = period, [], threading.Event()

    def run(self):
        q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
        while not self._stop_flag.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--query-gpu={q}",
                                      "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
                self.samples.append([time.time()] + [v.strip() for v in out.split(",")])
            except Exception:  # noqa: BLE001
                pass
            self._stop_flag.wait(self.period)

    def stop(self):
        self._stop_flag.set()
        self.join(timeout=15)


def time_events(fn, inner: int, reps: int, warmup: int) -> dict:
    """Median/min/max seconds per call of ``fn`` over ``reps`` repetitions of
    ``inner`` back-to-back calls between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / inner)
    return {"median_s": statistics.median(per_call), "min_s": min(per_call),
            "max_s": max(per_call), "inner": inner, "reps": reps}


def pick_inner(fn, target_s: float = 5e-3, cap: int = 10000) -> int:
    """How many calls make one repetition last about ``target_s``."""
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-7)
    return max(1, min(cap, int(target_s / one)))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    ref = ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


# ---------------------------------------------------------------- 1. GEMMs
def gemm_shapes():
    """(label, M, N, K): F.linear(x[M,K], W[N,K]) -> [M,N]."""
    shapes = []
    h, t = HIDDEN, TP
    for tokens in (2048, 4096, 8192):
        shapes += [
            (f"tp8 qkv fwd, {tokens} tok", tokens, 3 * h // t, h),
            (f"tp8 attn-proj fwd, {tokens} tok", tokens, h, h // t),
            (f"tp8 mlp-up fwd, {tokens} tok", tokens, 4 * h // t, h),
            (f"tp8 mlp-down fwd, {tokens} tok", tokens, h, 4 * h // t),
            (f"tp8 qkv wgrad, {tokens} tok", h, 3 * h // t, tokens),
        ]
    shapes.append(("tp1 12288x12288, 4096 tok", 4096, h, h))
    for s in (4096, 8192, 16384):
        shapes.append((f"square {s}", s, s, s))
    return shapes


def measure_gemms(dtypes=("bf16", "f16"), reps=15, passes=2) -> list:
    """Every shape of :func:`gemm_shapes` in each dtype, ``passes`` times,
    the shape order reversed on every other pass (so that a drift of the
    clock over the section shows as a difference between passes)."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    work = [(d, shape) for d in dtypes for shape in gemm_shapes()]
    for pas in range(passes):
        for dname, (label, m, n, k) in (work if pas % 2 == 0 else work[::-1]):
            dt = DTYPES[dname]
            sets = [(torch.randn(m, k, device="cuda", dtype=dt, generator=gen),
                     torch.randn(n, k, device="cuda", dtype=dt, generator=gen) / k ** 0.5)
                    for _ in range(3)]
            outs = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(3)]
            state = {"i": 0}

            def run():
                i = state["i"] = (state["i"] + 1) % 3
                x, w = sets[i]
                torch.matmul(x, w.t(), out=outs[i])   # what F.linear does, written in place

            x, w = sets[0]
            check = F.linear(x[:64], w[:64])
            err = rel_err(check, x[:64].double().cpu() @ w[:64].double().cpu().t())
            inner = pick_inner(run)
            t_start = time.time()
            tm = time_events(run, inner, reps, warmup=max(3, inner))
            flops = 2.0 * m * n * k
            rows.append({"pass": pas, "dtype": dname, "label": label, "M": m, "N": n, "K": k,
                         "flops": flops, **tm, "t_start": t_start, "t_end": time.time(),
                         "tflops": flops / tm["median_s"] / 1e12,
                         "efficiency": flops / tm["median_s"] / PEAK[dname],
                         "rel_err_vs_f64": err})
            print(f"gemm p{pas} {dname} {label:32s} {m:6d}x{n:6d}x{k:6d} "
                  f"{rows[-1]['tflops']:7.1f} TFLOP/s  eff {rows[-1]['efficiency']:.3f}  "
                  f"err {err:.1e}", flush=True)
            del sets, outs
            torch.cuda.empty_cache()
    return rows


def gemm_cycles(seconds: float = 12.0, tokens=(2048, 4096, 8192)) -> dict:
    """GEMMs at the clock they get in a long run, two ways, each for about
    ``seconds`` after the card is hot, each GEMM between its own events:

    * ``gemms_only``: the 15 bf16 TP-8 GPT-3 shapes of :func:`gemm_shapes`
      (5 per token count) one after another, round after round, with no gap;
    * ``layer``: a TP-8 GPT-3 layer's forward at 4096 tokens, its GEMMs with
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
        """ops: list of (label, flops or None, fn); times every op with events."""
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
        for i, (label, flops, _) in enumerate(ops):
            ts = [events[r][i].elapsed_time(events[r][i + 1]) / 1e3 for r in range(skip, rounds)]
            med = statistics.median(ts)
            row = {"label": label, "median_s": med, "min_s": min(ts), "max_s": max(ts)}
            if flops:
                row.update(flops=flops, tflops=flops / med / 1e12,
                           efficiency=flops / med / PEAK["bf16"])
            rows.append(row)
        total = [events[r][0].elapsed_time(events[r][-1]) / 1e3 for r in range(skip, rounds)]
        return {"rounds": rounds, "round_median_s": statistics.median(total), "ops": rows}

    result = {}
    ops = []
    for label, m, n, k in gemm_shapes():
        if label.startswith("tp8") and any(label.endswith(f" {tk} tok") for tk in tokens):
            ops.append((label, 2.0 * m * n * k, gemm_op(m, n, k)))
    result["gemms_only"] = run_cycle(ops, seconds)
    del ops
    torch.cuda.empty_cache()

    tk = 4096

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=bf, generator=gen) * scale

    xs, g, b = rnd(tk, h), rnd(h, scale=0.1) + 1, rnd(h, scale=0.1)
    qkv_w, proj_w = rnd(3 * h // t, h, scale=h ** -0.5), rnd(h, h // t, scale=(h // t) ** -0.5)
    up_w, down_w = rnd(4 * h // t, h, scale=h ** -0.5), rnd(h, 4 * h // t, scale=(4 * h // t) ** -0.5)
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
        ("qkv fwd", 2.0 * tk * (3 * h // t) * h, lambda: torch.matmul(ln1, qkv_w.t(), out=qkv)),
        ("attn-proj fwd", 2.0 * tk * h * (h // t), lambda: torch.matmul(ctx, proj_w.t(), out=proj)),
        ("residual add 1", None, lambda: torch.add(xs, proj, out=res1)),
        ("layernorm 2", None, lambda: F.layer_norm(res1, (h,), g, b)),
        ("mlp-up fwd", 2.0 * tk * (4 * h // t) * h, lambda: torch.matmul(ln2, up_w.t(), out=up)),
        ("gelu", None, lambda: F.gelu(up, approximate="tanh")),
        ("mlp-down fwd", 2.0 * tk * h * (4 * h // t), lambda: torch.matmul(act, down_w.t(), out=down)),
        ("residual add 2", None, lambda: torch.add(res1, down, out=res2)),
    ]
    result["layer"] = run_cycle(layer, seconds)
    result["layer"]["tokens"] = tk
    gemm_time = sum(r["median_s"] for r in result["layer"]["ops"] if "flops" in r)
    result["layer"]["gemm_share_of_round"] = gemm_time / result["layer"]["round_median_s"]
    for part in ("gemms_only", "layer"):
        for r in result[part]["ops"]:
            if "efficiency" in r:
                print(f"cycle {part:10s} {r['label']:28s} {r['tflops']:6.1f} TFLOP/s  "
                      f"eff {r['efficiency']:.3f}", flush=True)
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
            "last_fifth_efficiency": flops / last / PEAK["bf16"], "nvidia_smi_during": smi_mid}


# ------------------------------------------------------- 2. memory traffic
def measure_memory(reps=15) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)

    def record(name, dname, fn, nbytes, model_flops, check=None):
        inner = pick_inner(fn, target_s=5e-3)
        tm = time_events(fn, inner, reps, warmup=3)
        bw = nbytes / tm["median_s"]
        row = {"op": name, "dtype": dname, "bytes": nbytes, "model_flops": model_flops, **tm,
               "GBps": bw / 1e9, "memory_efficiency": bw / PEAK_BW,
               "model_flops_per_s": model_flops / tm["median_s"],
               "model_flops_fraction_of_peak": model_flops / tm["median_s"] / PEAK[dname]}
        if check is not None:
            row["rel_err"] = check()
        rows.append(row)
        print(f"mem {name:28s} {dname:4s} {nbytes / 1e6:8.0f} MB  {bw / 1e9:7.0f} GB/s  "
              f"eff {row['memory_efficiency']:.3f}  {row.get('rel_err', '')}", flush=True)

    n = 1 << 28   # elements: 512 MB in bf16, 1 GB in fp32
    for dname in ("bf16", "f32"):
        dt = DTYPES[dname]
        es = torch.finfo(dt).bits // 8
        a = torch.randn(n, device="cuda", dtype=dt, generator=gen)
        b = torch.randn(n, device="cuda", dtype=dt, generator=gen)
        c = torch.empty_like(a)
        record("copy (d2d)", dname, lambda: c.copy_(a), 2 * n * es, 0,
               lambda: float((c[:4096] != a[:4096]).sum()))
        record("add", dname, lambda: torch.add(a, b, out=c), 3 * n * es, n,
               lambda: rel_err(c[:4096], a[:4096].double() + b[:4096].double()))
        record("scale (mul by scalar)", dname, lambda: torch.mul(a, 1.5, out=c), 2 * n * es, n)
        record("gelu tanh", dname, lambda: F.gelu(a, approximate="tanh"), 2 * n * es, 8 * n)
        del a, b, c
        torch.cuda.empty_cache()
    # layernorm over hidden 12288 of 16384 tokens (x, gamma, beta in; y out)
    rows_ln, hid = 16384, HIDDEN
    for dname in ("bf16", "f32"):
        dt = DTYPES[dname]
        es = torch.finfo(dt).bits // 8
        x = torch.randn(rows_ln, hid, device="cuda", dtype=dt, generator=gen)
        g = torch.randn(hid, device="cuda", dtype=dt, generator=gen)
        bt = torch.randn(hid, device="cuda", dtype=dt, generator=gen)
        nel = rows_ln * hid
        record(f"layernorm [{rows_ln},{hid}]", dname,
               lambda: F.layer_norm(x, (hid,), g, bt), (2 * nel + 2 * hid) * es, 8 * nel)
        del x, g, bt
        torch.cuda.empty_cache()
    # attention-score softmax: [batch 4 x 12 heads (96/8), 2048, 2048] over the keys
    s = torch.randn(48, 2048, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    nel = s.numel()
    record("softmax [48,2048,2048]", "bf16", lambda: torch.softmax(s, dim=-1),
           2 * nel * 2, 5 * nel)
    del s
    torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------ 3. vector arithmetic
# Three forms of the same recurrence y <- y * a + b in fp32: as written
# (the compiler may or may not contract it to one FMA), with fmaf, and as four
# independent fmaf chains per element (more instruction-level parallelism).
FMA_SRC = {
    "mul+add": ("""
template <typename T> T fma_chain(T x, T a, T b) {{
  float y = static_cast<float>(x);
  const float fa = static_cast<float>(a);
  const float fb = static_cast<float>(b);
  #pragma unroll 32
  for (int i = 0; i < {niter}; ++i) {{ y = y * fa + fb; }}
  return static_cast<T>(y);
}}
""", 1),
    "fmaf": ("""
template <typename T> T fma_chain(T x, T a, T b) {{
  float y = static_cast<float>(x);
  const float fa = static_cast<float>(a);
  const float fb = static_cast<float>(b);
  #pragma unroll 32
  for (int i = 0; i < {niter}; ++i) {{ y = fmaf(y, fa, fb); }}
  return static_cast<T>(y);
}}
""", 1),
    "fmaf x4 chains": ("""
template <typename T> T fma_chain(T x, T a, T b) {{
  float y0 = static_cast<float>(x), y1 = y0 + 1.0f, y2 = y0 - 1.0f, y3 = y0 * 0.5f;
  const float fa = static_cast<float>(a);
  const float fb = static_cast<float>(b);
  #pragma unroll 32
  for (int i = 0; i < {niter}; ++i) {{
    y0 = fmaf(y0, fa, fb); y1 = fmaf(y1, fa, fb); y2 = fmaf(y2, fa, fb); y3 = fmaf(y3, fa, fb);
  }}
  return static_cast<T>(0.25f * (y0 + y1 + y2 + y3));
}}
""", 4),
}


def measure_vector(niter=1024, reps=15) -> list:
    rows = []
    n = 1 << 24
    gen = torch.Generator(device="cuda").manual_seed(2)
    for variant, (src, chains) in FMA_SRC.items():
        try:
            fma = torch.cuda.jiterator._create_jit_fn(src.format(niter=niter))
        except Exception as exc:  # noqa: BLE001
            rows.append({"variant": variant, "error": f"jiterator unavailable: {exc!r}"})
            continue
        for dname in ("f32", "bf16"):
            dt = DTYPES[dname]
            x = torch.randn(n, device="cuda", dtype=dt, generator=gen)
            a = (torch.rand(n, device="cuda", generator=gen) * 0.1 + 0.85).to(dt)
            b = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(dt)
            try:
                out = fma(x, a, b)
                # reference: the same recurrence in float64 on a slice
                x64 = x[:1024].double().cpu()
                fa, fb = a[:1024].double().cpu(), b[:1024].double().cpu()
                ys = [x64, x64 + 1, x64 - 1, x64 * 0.5][:chains]
                for _ in range(niter):
                    ys = [y * fa + fb for y in ys]
                err = rel_err(out[:1024], sum(ys) / chains)
                fn = lambda: fma(x, a, b)  # noqa: E731
                inner = pick_inner(fn)
                tm = time_events(fn, inner, reps, warmup=3)
            except Exception as exc:  # noqa: BLE001
                rows.append({"variant": variant, "dtype": dname, "error": repr(exc)})
                continue
            flops = 2.0 * niter * chains * n
            rate = flops / tm["median_s"]
            rows.append({"kernel": f"jiterator fp32 {variant}, {niter} per chain",
                         "variant": variant, "dtype": dname, "elements": n, "flops": flops,
                         **tm, "tflops": rate / 1e12,
                         "fraction_of_peak_same_dtype": rate / PEAK[dname],
                         "fraction_of_f32_peak": rate / PEAK["f32"], "rel_err_vs_f64": err})
            print(f"vector {variant:15s} {dname:4s} {rate / 1e12:6.1f} TFLOP/s = "
                  f"{rate / PEAK[dname]:.3f} of peak_flops[{dname}], "
                  f"{rate / PEAK['f32']:.3f} of f32 peak  err {err:.1e}", flush=True)
            del x, a, b
    return rows


# --------------------------------------------------------- 4. launch overhead
def fit_intercept(points) -> dict:
    """Least squares of t = L + bytes * s on relative error (weights 1/t^2)."""
    sw = swx = swy = swxx = swxy = 0.0
    for nbytes, t in points:
        w = 1.0 / (t * t)
        sw += w
        swx += w * nbytes
        swy += w * t
        swxx += w * nbytes * nbytes
        swxy += w * nbytes * t
    det = sw * swxx - swx * swx
    slope = (sw * swxy - swx * swy) / det
    intercept = (swy - slope * swx) / sw
    return {"intercept_s": intercept, "bandwidth_Bps": 1.0 / slope if slope > 0 else None}


def measure_launch() -> dict:
    res = {}
    x = torch.rand(1, device="cuda")
    y = torch.empty_like(x)
    add = lambda: torch.add(x, x, out=y)  # noqa: E731
    for _ in range(200):
        add()
    torch.cuda.synchronize()

    # (a) asynchronous back-to-back launches
    n = 10000
    samples, host = [], []
    for _ in range(7):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter()
        start.record()
        for _ in range(n):
            add()
        end.record()
        h1 = time.perf_counter()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / n)
        host.append((h1 - h0) / n)
    res["async_eager_per_launch_s"] = statistics.median(samples)
    res["async_eager_host_issue_per_launch_s"] = statistics.median(host)

    # (b) synchronise after every launch
    n = 2000
    samples = []
    for _ in range(5):
        h0 = time.perf_counter()
        for _ in range(n):
            add()
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - h0) / n)
    res["sync_each_per_launch_s"] = statistics.median(samples)

    # (c) N launches in one CUDA graph
    n = 1000
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            add()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            add()
    tm = time_events(graph.replay, inner=5, reps=15, warmup=3)
    res["cuda_graph_per_kernel_s"] = tm["median_s"] / n

    # (d) adds of growing size, eager (async) and graph: t per op against bytes
    sweep = []
    gen = torch.Generator(device="cuda").manual_seed(3)
    for nel in ([1 << p for p in range(0, 18, 2)] + [1 << p for p in range(18, 24)]
                + sorted({int(2 ** (p / 2)) for p in range(48, 57)})):
        a = torch.randn(nel, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(nel, device="cuda", dtype=torch.bfloat16, generator=gen)
        c = torch.empty_like(a)
        op = lambda: torch.add(a, b, out=c)  # noqa: E731
        inner = pick_inner(op, target_s=5e-3, cap=5000)
        eager = time_events(op, inner, reps=9, warmup=20)["median_s"]
        k = max(1, min(200, inner))
        g = torch.cuda.CUDAGraph()
        s2 = torch.cuda.Stream()
        s2.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s2):
            op()
        torch.cuda.current_stream().wait_stream(s2)
        with torch.cuda.graph(g):
            for _ in range(k):
                op()
        graphed = time_events(g.replay, inner=max(1, inner // k), reps=9, warmup=2)["median_s"] / k
        sweep.append({"elements": nel, "bytes": 3 * nel * 2, "eager_s": eager, "graph_s": graphed})
        print(f"launch sweep add bf16 {nel:10d} el  eager {eager * 1e6:9.2f} us  "
              f"graph {graphed * 1e6:9.2f} us", flush=True)
        del a, b, c, g
        torch.cuda.empty_cache()
    res["add_size_sweep"] = sweep
    res["fit_eager"] = fit_intercept([(r["bytes"], r["eager_s"]) for r in sweep])
    res["fit_graph"] = fit_intercept([(r["bytes"], r["graph_s"]) for r in sweep])
    # Where the device, not the host's issue rate, sets the pace (an eager op
    # takes over twice the host's issue time) and the data is beyond L2.
    host = res["async_eager_host_issue_per_launch_s"]
    big = [r for r in sweep if r["eager_s"] > 2 * host and r["bytes"] > 4 * 50e6]
    if len(big) >= 2:
        res["fit_eager_device_bound"] = fit_intercept([(r["bytes"], r["eager_s"]) for r in big])
        res["fit_graph_device_bound"] = fit_intercept([(r["bytes"], r["graph_s"]) for r in big])
        res["device_bound_points"] = [r["elements"] for r in big]
    print("launch", {k: v for k, v in res.items() if k != "add_size_sweep"}, flush=True)
    return res


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {
        "gpu": props.name, "sm_count": props.multi_processor_count,
        "total_memory_bytes": props.total_memory,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "nvidia_smi_before": nvidia_smi(SMI_QUERY),
    }
    try:
        from importlib import metadata
        for dist in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"):
            try:
                env["cublas_wheel"] = f"{dist} {metadata.version(dist)}"
                break
            except metadata.PackageNotFoundError:
                continue
    except Exception:  # noqa: BLE001
        pass
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "h100.json"))
    ap.add_argument("--heat-s", type=float, default=10.0,
                    help="seconds of back-to-back GEMMs before the GEMM shapes")
    ap.add_argument("--passes", type=int, default=2, help="passes over the GEMM shapes")
    ap.add_argument("--cycle-s", type=float, default=12.0,
                    help="seconds of each GEMM cycle (shapes back to back; a layer)")
    ap.add_argument("--sustained-s", type=float, default=20.0,
                    help="seconds of the final sustained GEMM run")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    t0 = time.time()
    result = {"script": "reports/calibration/measure_h100.py",
              "peaks_used": {"peak_flops": PEAK, "memory_bandwidth_Bps": PEAK_BW},
              "environment": environment()}
    print(json.dumps(result["environment"], indent=1), flush=True)
    sampler = SmiSampler()
    sampler.start()
    # launch and memory first, on a cool card; then a heat-up so that the
    # GEMMs are measured at the clock a long training run holds (power cap).
    sections = (("launch", measure_launch), ("memory", measure_memory),
                ("vector", measure_vector),
                ("heat_up", lambda: sustained_gemm(seconds=args.heat_s)),
                ("gemm", lambda: measure_gemms(passes=args.passes)),
                ("gemm_cycles", lambda: gemm_cycles(seconds=args.cycle_s)),
                ("gemm_sustained", lambda: sustained_gemm(seconds=args.sustained_s)))
    result["section_times"] = {}
    for name, fn in sections:
        t_start = time.time()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001 - keep what the other sections measured
            result[name] = {"error": repr(exc)}
            print(f"{name}: FAILED {exc!r}", flush=True)
        result["section_times"][name] = [t_start, time.time()]
        result["nvidia_smi_samples"] = list(sampler.samples)
        with open(args.out, "w") as fh:   # write after each section: a timeout keeps the rest
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
