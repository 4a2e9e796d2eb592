"""Per run, the error of two results.json files side by side (before: an
earlier cost model's run of run.py; after: this folder's), with the mean
|error|, max |error| and signed mean of each over the headline runs and
over all runs, as a markdown table between the ``<!-- before-after -->``
markers of README.md (or printed with ``--print``).

    python reports/validation/before_after.py before/results.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
START, END = "<!-- before-after -->", "<!-- /before-after -->"


def _load(path: Path) -> Dict[str, dict]:
    try:
        data = json.loads(path.read_text())
        return {row["id"]: row for row in data["runs"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"{path}: not a results.json of run.py ({err})", file=sys.stderr)
        raise SystemExit(2)


def _stats(errors: List[float]) -> str:
    if not errors:
        return "-"
    mean = sum(abs(e) for e in errors) / len(errors)
    signed = sum(errors) / len(errors)
    over = sum(e > 0 for e in errors)
    return (f"mean \\|error\\| {mean:.1f}%, max \\|error\\| {max(map(abs, errors)):.1f}%, "
            f"signed mean {signed:+.1f}% ({over} over, {len(errors) - over} under; n = "
            f"{len(errors)})")


def _err(row: Optional[dict]) -> Optional[float]:
    e = row.get("error_pct") if row else None
    return e if isinstance(e, (int, float)) else None


def _s(seconds: Optional[float]) -> str:
    return "refused" if seconds is None else f"{seconds:.4g}"


def table(before: Dict[str, dict], after: Dict[str, dict], headline: Dict[str, bool]) -> str:
    lines = ["| run | GPUs | published s | before s | before error | after s | after error |",
             "|---|---|---|---|---|---|---|"]
    sums = {k: ([], []) for k in ("headline", "all")}
    for rid, row in after.items():
        b, a = _err(before.get(rid)), _err(row)
        pb = (before.get(rid) or {}).get("predicted") or {}
        pa = row.get("predicted") or {}
        name = f"{row['label']}{'' if headline.get(row['source'], True) else ' *'}"
        lines.append(f"| {name} | {row['gpus']} | {_s(row['published']['step_time_s'])} | "
                     f"{_s(pb.get('step_time_s'))} | {'-' if b is None else f'{b:+.1f}%'} | "
                     f"{_s(pa.get('step_time_s'))} | {'-' if a is None else f'{a:+.1f}%'} |")
        if a is not None and b is not None:
            for k in ("headline", "all") if headline.get(row["source"], True) else ("all",):
                sums[k][0].append(b)
                sums[k][1].append(a)
    lines.append("")
    for k in ("headline", "all"):
        lines.append(f"- {k} runs, before: {_stats(sums[k][0])}")
        lines.append(f"- {k} runs, after: {_stats(sums[k][1])}")
    lines.append("")
    lines.append("\\* outside the headline figures (DeepSpeed's ZeRO-3).")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("--after", type=Path, default=HERE / "results.json")
    ap.add_argument("--print", action="store_true", help="print instead of writing README.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from run import SOURCES   # noqa: E402  (this folder's script)
    headline = {k: v.get("headline", True) for k, v in SOURCES.items()}
    text = table(_load(args.before), _load(args.after), headline)
    if args.print:
        print(text)
        return 0
    readme = HERE / "README.md"
    old = readme.read_text()
    if START not in old or END not in old:
        print(f"{readme}: no {START} ... {END} markers", file=sys.stderr)
        return 2
    head, rest = old.split(START, 1)
    readme.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
