"""The status line of distsim simulate: the phases in order on a terminal,
cleared before the output; nothing when stderr is not a terminal."""
import io

import distsim
from distsim.cli import main
from distsim.cli.status_line import StatusLine


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_simulate_reports_its_phases_in_order(tmp_path):
    seen = []
    result = distsim.simulate(dp=2, progress=seen.append)
    result.write_outputs(tmp_path, progress=seen.append)
    assert seen[0] == "building the program"
    assert seen[1].startswith("simulating ") and seen[1].endswith(" ops on 8 devices")
    assert int(seen[1].split()[1].replace(",", "")) == len(result.program.ops)
    assert seen[2:] == ["writing summary.json", "writing trace.json", "drawing gantt.png",
                        "drawing memory.png", "drawing links.png", "writing report.html"]


def test_status_line_rewrites_one_line_and_clears_it():
    ticks = iter([0.0, 1.25, 3.5])
    term = FakeTerminal()
    with StatusLine(term, clock=lambda: next(ticks)) as status:
        status("building the program")
        status("simulating 10 ops on 8 devices")
    text = term.getvalue()
    assert "\n" not in text
    assert text == ("\r\033[Kdistsim: building the program ... (1.2 s)"
                    "\r\033[Kdistsim: simulating 10 ops on 8 devices ... (3.5 s)"
                    "\r\033[K")


def test_nothing_is_written_off_a_terminal():
    log = io.StringIO()                     # isatty() is False
    with StatusLine(log) as status:
        status("building the program")
    assert log.getvalue() == ""


def test_the_cli_shows_phases_on_a_terminal_then_the_table(tmp_path, monkeypatch, capsys):
    term = FakeTerminal()
    monkeypatch.setattr("sys.stderr", term)
    assert main(["simulate", "--out", str(tmp_path / "out")]) == 0
    status = term.getvalue()
    assert "distsim: building the program" in status and "distsim: drawing gantt.png" in status
    assert status.endswith("\r\033[K")       # cleared before the table
    assert "step time" in capsys.readouterr().out
