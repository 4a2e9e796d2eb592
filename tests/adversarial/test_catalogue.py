"""Every row of the adversarial catalogue (catalogue.py, README.md): the
Python entry point raises exactly the listed error class with the listed
message; the CLI exits with status 2, prints exactly one line on stderr (no
traceback), and leaves no output files behind."""
from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from catalogue import CASES, CASES_DIR, ONNX_KINDS, Case, write_onnx
from distsim.cli import main
from distsim.errors import DistsimError

README = Path(__file__).resolve().parent / "README.md"


def _ids(cases):
    return [c.id for c in cases]


def test_catalogue_is_big_and_covers_every_entry_point():
    assert len(CASES) >= 40
    assert len(set(_ids(CASES))) == len(CASES)
    entries = {c.entry for c in CASES}
    assert {"CLI flags", "topology YAML", "model YAML", "sweep spec", "text format",
            "ONNX file", "program"} <= entries


@pytest.fixture
def scratch(tmp_path):
    """A scratch folder with the generated ONNX files, and an empty working
    directory (the CLI must write nothing into it)."""
    gen = tmp_path / "gen"
    gen.mkdir()
    for kind in ONNX_KINDS:
        write_onnx(gen, kind)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return gen, cwd


@pytest.mark.parametrize("case", [c for c in CASES if c.python is not None], ids=lambda c: c.id)
def test_python_entry_point(case: Case, scratch):
    gen, _ = scratch
    with pytest.raises(DistsimError) as info:
        case.python(gen)
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert case.message in message
    assert "\n" not in message and len(message) < 1000


def _args(case: Case, gen: Path, out: Path):
    return [a.format(cases=CASES_DIR, tmp=gen, out=out) for a in case.cli]


class _FullStdout(io.TextIOBase):
    """A stdout that refuses every write, as /dev/full does."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("case", [c for c in CASES if c.cli is not None], ids=lambda c: c.id)
def test_cli(case: Case, scratch, capsys, monkeypatch):
    gen, cwd = scratch
    out = cwd / "out"
    monkeypatch.chdir(cwd)
    if case.stdout == "full":
        monkeypatch.setattr(sys, "stdout", _FullStdout())
    try:
        code = main(_args(case, gen, out))
    except SystemExit as e:          # argparse usage errors
        code = e.code
    captured = capsys.readouterr()
    err_lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(err_lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert case.message in err_lines[0]
    if case.error is not None:
        assert err_lines[0].startswith("distsim: error: ")
    assert not out.exists()
    assert sorted(os.listdir(cwd)) == []


# A few rows through a real process too: the installed entry point, its exit
# status and its stderr, not only main().
SUBPROCESS_ROWS = ["dp-zero", "topology-builder-list", "text-deep-nesting", "onnx-truncated",
                   "sweep-constraint-code", "dp-not-an-int", "topology-alias-bomb",
                   "stdout-full"]


@pytest.mark.parametrize("case_id", SUBPROCESS_ROWS)
def test_cli_in_a_process(case_id, scratch):
    case = next(c for c in CASES if c.id == case_id)
    gen, cwd = scratch
    out = cwd / "out"
    if case.stdout == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full" if case.stdout == "full" else os.devnull, "w") as full:
        proc = subprocess.run([sys.executable, "-m", "distsim", *_args(case, gen, out)], cwd=cwd,
                              stdout=full if case.stdout == "full" else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert case.message in proc.stderr
    assert not proc.stdout
    assert sorted(os.listdir(cwd)) == []


def _readme_rows():
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| `([a-z0-9-]+)` \|", line)
        if m:
            rows[m.group(1)] = line
    return rows


def test_readme_table_lists_every_case():
    rows = _readme_rows()
    assert sorted(rows) == sorted(_ids(CASES))
    for case in CASES:
        row = rows[case.id]
        cls = case.error.__name__ if case.error is not None else "usage error (argparse)"
        assert f"`{cls}`" in row, row
        assert (" 2 |" if case.cli is not None else " — |") in row, row
