"""Error distribution of a sample file written by sample.py:

    python reports/estimator/analyse.py sample.jsonl
"""
import json
import sys

import numpy as np

from distsim.estimate import AGREEMENT_TOLERANCE

recs = [json.loads(l) for l in open(sys.argv[1])]
STEP = MEM = AGREEMENT_TOLERANCE
both = [r for r in recs if "est" in r and "sim" in r]
print("records", len(recs), "both ok", len(both))
print("est refused, sim ok:", sum(1 for r in recs if "est_error" in r and "sim" in r))
print("est ok, sim refused:", sum(1 for r in recs if "est" in r and "sim_error" in r))
print("both refused:", sum(1 for r in recs if "est_error" in r and "sim_error" in r))
print("est crash:", sum(1 for r in recs if "est_crash" in r), "sim crash:",
      sum(1 for r in recs if "sim_crash" in r))
for r in recs:
    if "est_crash" in r or "sim_crash" in r:
        print("CRASH", r["options"], (r.get("est_crash") or r.get("sim_crash"))[-600:])
    if "est_error" in r and "sim" in r:
        print("EST-ONLY refuse", r["options"], r["est_error"][:150])
    if "est" in r and "sim_error" in r:
        print("SIM-ONLY refuse", r["options"], r["sim_error"][:200])
    if "est_error" in r and "sim_error" in r and r["est_error"] != r["sim_error"]:
        print("DIFFERENT refusals", r["options"], "\n   est:", r["est_error"][:150],
              "\n   sim:", r["sim_error"][:150])


def rel(r, k):
    e, s = r["est"][k], r["sim"][k]
    return (e - s) / s if s else (0.0 if e == s else float("inf"))


def absfrac(r, k):
    """breakdown error as a fraction of the step"""
    return (r["est"][k] - r["sim"][k]) / r["sim"]["step_time_s"]


rows = []
for r in both:
    rows.append((rel(r, "step_time_s"), rel(r, "max_peak_memory_bytes"),
                 absfrac(r, "compute_s"), absfrac(r, "exposed_communication_s"),
                 absfrac(r, "idle_s"), r))
a = np.array([[abs(x) for x in row[:5]] for row in rows])
names = ["step", "memory", "compute/step", "exposed/step", "idle/step"]
qs = [50, 90, 95, 99, 100]
print("metric", *[f"p{q}" for q in qs], "n>claim", sep="\t")
for j, n in enumerate(names):
    lim = STEP if j != 1 else MEM
    print(n, *[f"{np.percentile(a[:, j], q)*100:.3f}%" for q in qs],
          int((a[:, j] > lim).sum()), sep="\t")
print("exact step (1e-9):", int((a[:, 0] < 1e-9).sum()))
print()
for row in sorted(rows, key=lambda x: -max(abs(x[0]) / STEP, abs(x[1]) / MEM)):
    if abs(row[0]) > STEP or abs(row[1]) > MEM or max(abs(x) for x in row[2:5]) > STEP:
        print(f"step {row[0]*100:+.2f}% mem {row[1]*100:+.2f}% comp {row[2]*100:+.2f}% "
              f"exp {row[3]*100:+.2f}% idle {row[4]*100:+.2f}%", row[5]["options"])
