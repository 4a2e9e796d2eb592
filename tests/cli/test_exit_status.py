"""The exit statuses of ``distsim`` are the ones the README lists: 0 success;
1 when ``check`` finds a value that differs or ``search`` finds no strategy
that fits; 2 bad input; 3 a bug; 130 Ctrl-C. The README used to say that 1
always means a bug, then that 1 meant a finding or a bug (a script could
not tell them apart)."""
from __future__ import annotations

import re
from pathlib import Path

from distsim.cli import check_cmd, main

ROOT = Path(__file__).resolve().parents[2]
NESTED = str(ROOT / "models" / "nested_mlp.dir")


def _guarantees() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def test_readme_lists_every_exit_status():
    text = _guarantees()
    assert "Exit status 1 means a bug" not in text
    sentence = re.search(r"Exit status: (.*?resume\)\.)", text).group(1)
    for piece in ("0 success", "1 when `distsim check` finds a value that differs",
                  "`distsim search` finds no strategy that fits", "2 bad input",
                  "3 a bug in distsim", "130 Ctrl-C",
                  "143 when `distsim sweep` or `distsim search` is "
                  "stopped by SIGTERM"):
        assert piece in sentence


def test_check_exits_0_when_values_agree_and_1_when_they_differ(monkeypatch, capsys):
    assert main(["check", NESTED]) == 0

    class Differs:
        ok = False

        def __str__(self):
            return "value %y differs"
    monkeypatch.setattr(check_cmd, "check_lowering", lambda *args, **kwargs: Differs())
    assert main(["check", NESTED]) == 1
    assert capsys.readouterr().out.endswith("value %y differs\n")


def test_search_exits_1_when_no_strategy_fits(capsys):
    # a forward-only ONNX import at a symbolic batch: no strategy splits it, nothing fits
    assert main(["search", "--model", "gpt2-tiny", "--topology", "dgx-a100"]) == 1
    assert "no strategy fits" in capsys.readouterr().out


def test_bad_input_exits_2_and_a_bug_exits_3(monkeypatch, capsys):
    assert main(["simulate", "--dp", "0"]) == 2
    assert capsys.readouterr().err == "distsim: error: --dp: must be a positive integer, got 0\n"

    def bug(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(check_cmd, "check_lowering", bug)
    assert main(["check", NESTED]) == 3
    assert "distsim: internal error" in capsys.readouterr().err


def test_the_help_lists_the_exit_statuses(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for piece in ("0 success", "2 bad input", "3 an internal error", "130 Ctrl-C", "143"):
        assert piece in text
