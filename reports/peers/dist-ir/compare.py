"""dist-ir's MLP grid search against distsim's, point by point.

    PYTHONPATH=. python reports/peers/dist-ir/compare.py > reports/peers/dist-ir/compare.txt

Reads ``distir-grid.csv`` (dist-ir's ``examples.mlp_grid_search``, simulate
backend) and ``distsim-results.csv`` (``distsim sweep
mlp-dhpk-distir.yaml``) from this folder.
"""
import csv
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _distir():
    out = {}
    with open(HERE / "distir-grid.csv") as f:
        for r in csv.DictReader(f):
            key = (int(r["dp_degree"]), int(r["hp_degree"]), int(r["pp_degree"]),
                   int(r["num_microbatches"]))
            out[key] = (float(r["latency"]), float(r["peak_memory"]))
    return out


def _distsim():
    out = {}
    with open(HERE / "distsim-results.csv") as f:
        for r in csv.DictReader(f):
            if r["status"] != "ok":
                continue
            key = (int(r["dp"]), int(r["tp"]), int(r["pp"]), int(r["microbatches"]))
            out[key] = (float(r["step_time_s"]), float(r["max_peak_memory_bytes"]),
                        float(r["exposed_communication_s"]), float(r["bubble_s"]))
    return out


def main() -> None:
    a, b = _distir(), _distsim()
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    print(f"{len(a)} configurations, both tools\n")
    print(" D  H  P    K | dist-ir s  distsim s  ratio | dist-ir GB  distsim GB")
    ratios = {}
    for key in sorted(a, key=lambda k: (k[0] * k[1] * k[2], k)):
        (ta, ma), (tb, mb, _, _) = a[key], b[key]
        ratios[key] = tb / ta
        d, h, p, k = key
        print(f"{d:2d} {h:2d} {p:2d} {k:4d} | {ta:9.4f} {tb:10.4f} {tb / ta:6.3f} | "
              f"{ma / 1e9:10.2f} {mb / 1e9:11.2f}")
    print("\nratio distsim / dist-ir by the parallelism used:")
    groups = {"D only": lambda d, h, p: h == 1 and p == 1 and d > 1,
              "H only": lambda d, h, p: d == 1 and p == 1 and h > 1,
              "P only": lambda d, h, p: d == 1 and h == 1 and p > 1,
              "mixed": lambda d, h, p: sum(x > 1 for x in (d, h, p)) > 1,
              "one device": lambda d, h, p: d == h == p == 1}
    for name, test in groups.items():
        rs = [r for (d, h, p, k), r in ratios.items() if test(d, h, p)]
        print(f"  {name:<10} {len(rs):3d} points  median {statistics.median(rs):.3f}  "
              f"min {min(rs):.3f}  max {max(rs):.3f}")
    print("\nwinners per world size (fastest step):")
    for w in (1, 2, 4, 8, 16):
        keys = [k for k in a if k[0] * k[1] * k[2] == w]
        wa = min(keys, key=lambda k: a[k][0])
        wb = min(keys, key=lambda k: b[k][0])
        rank_b = sorted(keys, key=lambda k: b[k][0]).index(wa) + 1
        rank_a = sorted(keys, key=lambda k: a[k][0]).index(wb) + 1
        print(f"  {w:2d}: dist-ir D{wa[0]} H{wa[1]} P{wa[2]} K{wa[3]} {a[wa][0]:.4f} s "
              f"(distsim ranks it {rank_b} of {len(keys)}) | distsim D{wb[0]} H{wb[1]} "
              f"P{wb[2]} K{wb[3]} {b[wb][0]:.4f} s (dist-ir ranks it {rank_a})")


if __name__ == "__main__":
    main()
