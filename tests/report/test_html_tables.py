"""Tables of the HTML pages: one number format per column; the sweep
table says which rows were simulated and which estimated."""
import re

import pandas as pd

from distsim.report.html import sweep_report_html
from distsim.report.html_parts import column_formatter, table_html


def test_a_column_shares_one_format():
    fmt = column_formatter([9355.2, 10270.4, 812.0])
    assert [fmt(v) for v in (9355.2, 10270.4, 812.0)] == ["9,355", "10,270", "812"]
    fmt = column_formatter([0.0827, 0.496, 2.35])
    assert [fmt(v) for v in (0.0827, 2.35)] == ["0.08", "2.35"]    # 3 digits of the largest
    assert column_formatter([1, 2])(3) == "3" and column_formatter([None])(None) == ""


def test_a_column_of_tiny_numbers_is_written_in_exponent_form():
    # 4 bytes in GB: 3 digits would need 11 decimals, a row of zeros first
    fmt = column_formatter([4e-9, 0.0, 1.2e-9])
    assert [fmt(v) for v in (4e-9, 0.0, 1.2e-9)] == ["4e-09", "0", "1.2e-09"]
    # up to six decimals the fixed form stays
    fmt = column_formatter([0.000123, 0.0000456])
    assert [fmt(v) for v in (0.000123, 0.0000456)] == ["0.000123", "0.000046"]


def test_cells_are_escaped_and_text_stays_text():
    text = table_html([{"a": "<b>", "n": 1.5}], ["a", "n"], text_columns=["a"])
    assert "&lt;b&gt;" in text and '<td class="text">' in text and "<td>1.50</td>" in text


def _frame():
    rows = []
    for i, (tp, fidelity, step) in enumerate([(1, "simulate", 9.3552), (2, "estimate", 10.2704),
                                              (4, "estimate", 12.5)]):
        rows.append({"index": i, "key": str(i), "model": "tiny", "tp": tp, "fidelity": fidelity,
                     "status": "ok", "reason": None, "step_time_s": step, "samples_per_s": 1.0,
                     "tokens_per_s": 100.0 / step, "mfu": 0.4, "max_peak_memory_bytes": 1e9,
                     "oom": False, "bubble_s": 0.0, "exposed_communication_s": 0.001,
                     "global_batch": 8})
    return pd.DataFrame(rows)


def test_the_sweep_table_heading_counts_simulated_and_estimated_rows():
    page = sweep_report_html(_frame(), charts={})
    assert "(top 3 of 3 that ran; 1 simulated, 2 estimated)" in page
    assert "simulated)" in page and "top 3 of 3 simulated" not in page
    how = re.findall(r'<td class="text">(simulated|estimated)</td>', page)
    assert how == ["simulated", "estimated", "estimated"]
    # the step column in one format: no exponent, thousands separated
    steps = re.findall(r"<td>([0-9,]+)</td><td>[0-9.]+</td><td>40.0</td>", page)
    assert steps == ["9,355", "10,270", "12,500"]
    assert "e+" not in page.split("<table>")[1]
