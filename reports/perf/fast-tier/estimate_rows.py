"""Compare two versions of the sweep estimator to the bit.

    python reports/perf/fast-tier/estimate_rows.py dump OUT.json      # from a checkout's root
    python reports/perf/fast-tier/estimate_rows.py compare A.json B.json

``dump`` estimates a fixed set of 984 GPT-3 175B points on 1024 GPUs (the
benchmark's grid of tp x pp x micro-batch x ZeRO x recomputation, and a
grid of buckets, schedules and ZeRO-3 units) and writes every row (an
error's type where the estimator refuses a point). ``compare`` counts the
rows that differ, ignoring the fields that depend on the device's memory
capacity, and prints the first few and the largest relative difference: a
speed change to the estimator must say ``0 differ``.

``COMM_STREAMS=per-group`` (or ``shared``) in the environment sets
``comm_streams`` on every point (default: the simulator's);
``NO_REPLAY=1`` dumps with nothing recorded to replay
(:meth:`distsim.estimate.engine.Timeline.since` gives None), every task
emitted item by item: compared with a dump with replays, it shows that
replaying changes no row.
"""
import itertools
import json
import os
import sys
import time

SKIP = {"memory_capacity_bytes", "fits", "oom", "memory_headroom_bytes"}


def points():
    base = {"model": "gpt3-175b", "topology": "dgx-a100-x128"}
    if os.environ.get("COMM_STREAMS"):
        base["comm_streams"] = os.environ["COMM_STREAMS"]
    for tp, pp, mb, zero, rec in itertools.product([1, 2, 4, 8], [1, 2, 4, 8, 16, 32], [1, 2, 4],
                                                   [0, 1, 2, 3], ["none", "selective", "full"]):
        yield dict(base, tp=tp, pp=pp, micro_batch=mb, zero=zero, recompute=rec)
    for tp, pp, zero, bucket, sched, unit in itertools.product(
            [4, 8], [4, 16], [0, 1, 2, 3], [0, 25, None], ["1f1b", "interleaved"],
            ["param", "layer"]):
        if unit == "layer" and zero != 3:
            continue
        yield dict(base, tp=tp, pp=pp, micro_batch=1, zero=zero, bucket_mb=bucket,
                   schedule=sched, zero3_unit=unit, global_batch=512)


def dump(out_path):
    from distsim.errors import DistsimError
    from distsim.estimate import estimate
    if os.environ.get("NO_REPLAY") == "1":
        from distsim.estimate.engine import Timeline
        Timeline.since = lambda self, *args, **kwargs: None
    rows, start = [], time.time()
    for p in points():
        try:
            rows.append(dict(estimate(p)))
        except DistsimError as e:
            rows.append({"error": type(e).__name__})
    print(f"{len(rows)} points, {time.time() - start:.1f} s", file=sys.stderr)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(rows, f)


def compare(a_path, b_path):
    with open(a_path, encoding="utf-8") as f:
        a = json.load(f)
    with open(b_path, encoding="utf-8") as f:
        b = json.load(f)
    differ, worst, fields = 0, 0.0, {}
    for i, (x, y) in enumerate(zip(a, b)):
        d = {k: (x[k], y.get(k)) for k in x if k not in SKIP and x[k] != y.get(k)}
        if not d:
            continue
        differ += 1
        for k, (u, v) in d.items():
            fields[k] = fields.get(k, 0) + 1
            if isinstance(u, float) and isinstance(v, float):
                worst = max(worst, abs(u - v) / max(abs(u), 1e-30))
        if differ <= 3:
            print(i, {k: d[k] for k in list(d)[:4]})
    if len(a) != len(b):
        print(f"row counts differ: {len(a)} vs {len(b)}")
    print(f"{len(a)} rows, {differ} differ (capacity ignored), worst relative {worst:.3g}",
          fields or "")
    return 0 if differ == 0 and len(a) == len(b) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
