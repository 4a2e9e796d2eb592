"""report.html shows the summary as the CLI prints it: the table and the
training-metrics lines after it (tokens/s, MFU, bubble, memory by
category), which the page used to leave out."""
import html

import distsim


def test_the_page_holds_the_lines_the_cli_prints_after_the_table(tmp_path):
    result = distsim.simulate(model="tiny", topology="dgx-a100", pp=2, dp=4, microbatches=2)
    paths = result.write_outputs(tmp_path / "out")
    page = paths["report"].read_text()
    printed = result.summary_table()            # what `distsim simulate` prints
    assert "tokens/s:" in printed and "MFU:" in printed and "pipeline bubble:" in printed
    for line in printed.splitlines():
        assert html.escape(line) in page, line
