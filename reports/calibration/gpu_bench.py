"""Timing, nvidia-smi sampling and the non-GEMM microbenchmarks of
``measure_gpu.py`` (memory traffic by kernel class, CUDA-core arithmetic,
launch overhead, the machine's description). PyTorch only.

Timing: CUDA events around ``inner`` back-to-back calls (inner chosen so a
repetition lasts a few ms), after warm-up; the figure is the median over
``reps`` repetitions, with min and max kept. Inputs are random (never
zeros). Nothing changes the card's settings: nvidia-smi is only read.
"""
from __future__ import annotations

import platform
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
#: the peaks the efficiencies printed and recorded are fractions of:
#: ``{"peak_flops": {dtype: FLOP/s}, "memory_bandwidth_Bps": B/s}``, set by
#: measure_gpu.py (empty when the GPU's peaks are unknown)
PEAKS: dict = {}


def fraction(value: float, dtype: str | None = None):
    """``value`` over the peak FLOP/s of ``dtype``, or over the memory
    bandwidth (``dtype`` None); None when that peak is unknown."""
    peak = PEAKS.get("peak_flops", {}).get(dtype) if dtype else PEAKS.get("memory_bandwidth_Bps")
    return value / peak if peak else None


def _show(x) -> str:
    return "   -" if x is None else f"{x:.3f}"



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



def measure_memory(reps=15) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)

    def record(name, kind, dname, fn, nbytes, model_flops, check=None):
        inner = pick_inner(fn, target_s=5e-3)
        tm = time_events(fn, inner, reps, warmup=3)
        bw = nbytes / tm["median_s"]
        row = {"op": name, "kernel_class": kind, "dtype": dname, "bytes": nbytes,
               "model_flops": model_flops, **tm, "GBps": bw / 1e9,
               "memory_efficiency": fraction(bw),
               "model_flops_per_s": model_flops / tm["median_s"],
               "model_flops_fraction_of_peak": fraction(model_flops / tm["median_s"], dname)}
        if check is not None:
            row["rel_err"] = check()
        rows.append(row)
        print(f"mem {name:28s} {dname:4s} {nbytes / 1e6:8.0f} MB  {bw / 1e9:7.0f} GB/s  "
              f"eff {_show(row['memory_efficiency'])}  {row.get('rel_err', '')}", flush=True)

    n = 1 << 28   # elements: 512 MB in bf16, 1 GB in fp32
    for dname in ("bf16", "f32"):
        dt = DTYPES[dname]
        es = torch.finfo(dt).bits // 8
        a = torch.randn(n, device="cuda", dtype=dt, generator=gen)
        b = torch.randn(n, device="cuda", dtype=dt, generator=gen)
        c = torch.empty_like(a)
        record("copy (d2d)", "copy", dname, lambda: c.copy_(a), 2 * n * es, 0,
               lambda: float((c[:4096] != a[:4096]).sum()))
        record("add", "elementwise", dname, lambda: torch.add(a, b, out=c), 3 * n * es, n,
               lambda: rel_err(c[:4096], a[:4096].double() + b[:4096].double()))
        record("scale (mul by scalar)", "elementwise", dname, lambda: torch.mul(a, 1.5, out=c),
               2 * n * es, n)
        record("gelu tanh", "elementwise", dname, lambda: F.gelu(a, approximate="tanh"),
               2 * n * es, 8 * n)
        del a, b, c
        torch.cuda.empty_cache()
    # layernorm over hidden 12288 of 16384 tokens (x, gamma, beta in; y out)
    rows_ln, hid = 16384, 12288
    for dname in ("bf16", "f32"):
        dt = DTYPES[dname]
        es = torch.finfo(dt).bits // 8
        x = torch.randn(rows_ln, hid, device="cuda", dtype=dt, generator=gen)
        g = torch.randn(hid, device="cuda", dtype=dt, generator=gen)
        bt = torch.randn(hid, device="cuda", dtype=dt, generator=gen)
        nel = rows_ln * hid
        record(f"layernorm [{rows_ln},{hid}]", "norm", dname,
               lambda: F.layer_norm(x, (hid,), g, bt), (2 * nel + 2 * hid) * es, 8 * nel)
        if hasattr(F, "rms_norm"):
            record(f"rmsnorm [{rows_ln},{hid}]", "norm", dname,
                   lambda: F.rms_norm(x, (hid,), g), (2 * nel + hid) * es, 5 * nel)
        record(f"sum over rows [{rows_ln},{hid}]", "reduction", dname,
               lambda: x.sum(dim=-1), (nel + rows_ln) * es, nel)
        del x, g, bt
        torch.cuda.empty_cache()
    # attention-score softmax: [batch 4 x 12 heads (96/8), 2048, 2048] over the keys
    s = torch.randn(48, 2048, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    nel = s.numel()
    record("softmax [48,2048,2048]", "softmax", "bf16", lambda: torch.softmax(s, dim=-1),
           2 * nel * 2, 5 * nel)
    del s
    torch.cuda.empty_cache()
    return rows



# -------------------------------------------------------- vector arithmetic
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
                         "fraction_of_peak_same_dtype": fraction(rate, dname),
                         "fraction_of_f32_peak": fraction(rate, "f32"), "rel_err_vs_f64": err})
            print(f"vector {variant:15s} {dname:4s} {rate / 1e12:6.1f} TFLOP/s = "
                  f"{_show(fraction(rate, dname))} of peak_flops[{dname}], "
                  f"{_show(fraction(rate, 'f32'))} of f32 peak  err {err:.1e}", flush=True)
            del x, a, b
    return rows



# ----------------------------------------------------------- launch overhead
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
        # the figure distsim calibrate reads: the fixed cost per kernel on the
        # device's timeline when the host runs ahead of it
        res["overhead_s"] = res["fit_eager_device_bound"]["intercept_s"]
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

