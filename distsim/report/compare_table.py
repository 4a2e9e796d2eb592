"""A :class:`~distsim.report.compare.Comparison` as text and as HTML.

One row per figure, one column per run, and after each run but the
baseline its difference from the baseline (in the unit and in per cent),
marked ``better`` or ``worse`` where lower or higher is better. The values
of a row share one number format (:func:`~distsim.report.numbers.column_formatter`).
"""
from __future__ import annotations

import html
from typing import List, Optional, Tuple

from distsim.report.numbers import column_formatter


def _diff_text(comparison, key: str, i: int, fmt, lower_is_better: Optional[bool]) -> str:
    diff, rel = comparison.difference(key, i), comparison.relative(key, i)
    if diff is None:
        return ""
    sign = "+" if diff > 0 else "-" if diff < 0 else ""
    text = f"{sign}{fmt(abs(diff))}"
    if rel is not None:
        text += f" ({sign}{abs(rel):.1f} %)"
    if lower_is_better is not None and diff != 0:
        text += " better" if (diff < 0) == lower_is_better else " worse"
    return text


def run_lines(comparison) -> List[Tuple[str, str]]:
    """(label, what the run is): model on topology, strategy, busiest link, source."""
    d = comparison.describe()
    out = []
    for i, run in enumerate(comparison.runs):
        text = f"{d['model'][i] or 'model'} on {d['topology'][i] or 'topology'}"
        if d["strategy"][i]:
            text += f": {d['strategy'][i]}"
        if d["OOM"][i] == "yes":
            text += "; OUT OF MEMORY"
        if d["busiest link"][i]:
            text += f"; busiest link {d['busiest link'][i]}"
        if run.source:
            text += f" ({run.source})"
        out.append((run.label + (" (baseline)" if i == 0 else ""), text))
    return out


def comparison_rows(comparison) -> Tuple[List[str], List[List[str]]]:
    """(header, rows) of cells: a row per figure, a column per run and its
    difference from the baseline."""
    n = len(comparison.runs)
    header = ["", ""]
    for i, label in enumerate(comparison.labels):
        header.append(label)
        if i:
            header.append(f"vs {comparison.labels[0]}")
    rows: List[List[str]] = []
    for m in comparison.metrics:
        values = comparison.values[m.key]
        fmt = column_formatter(values, digits=4)
        row = [m.label, m.unit]
        for i in range(n):
            row.append(fmt(values[i]) if values[i] is not None else "-")
            if i:
                row.append(_diff_text(comparison, m.key, i, fmt, m.lower_is_better))
        rows.append(row)
    return header, rows


def format_comparison(comparison) -> str:
    """The terminal table."""
    header, rows = comparison_rows(comparison)
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def line(r: List[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 or (i >= 2 and not _numeric(c)) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    runs = run_lines(comparison)
    width = max(len(label) for label, _ in runs)
    out = [f"{label.ljust(width)}  {text}" for label, text in runs] + [""]
    out += [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "+-") and cell != "-"


def comparison_html(comparison) -> str:
    """The table as HTML (notebooks)."""
    header, rows = comparison_rows(comparison)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(
        f'<td style="text-align:{"left" if i < 2 or not _numeric(c) else "right"}">'
        f"{html.escape(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    runs = "".join(f"<li><b>{html.escape(label)}</b>: {html.escape(text)}</li>"
                   for label, text in run_lines(comparison))
    return (f"<ul>{runs}</ul><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            "</table>")
