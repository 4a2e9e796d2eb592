"""The README's "Importing ONNX models" section runs as written: every
``distsim ...`` command in its code blocks exits 0 (simulations write into
a temporary folder), and its Python example runs. Parsed from the README,
so a command that stops working fails here."""
import shlex
from pathlib import Path

import pytest

from distsim.cli import main

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Importing ONNX models"


def section_text() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def code_blocks(text: str):
    """(language, body) of each fenced block."""
    blocks, lines, lang, inside = [], [], "", False
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append((lang, "\n".join(lines)))
                lines = []
            else:
                lang = line[3:].strip()
            inside = not inside
        elif inside:
            lines.append(line)
    return blocks


def commands():
    """Each ``distsim`` command: continuation lines joined, comments dropped."""
    out = []
    for lang, body in code_blocks(section_text()):
        if lang not in ("", "bash", "sh", "console"):
            continue
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "distsim":
                out.append(words[1:])
    return out


def test_the_section_has_commands():
    found = commands()
    assert len(found) >= 5
    assert any(c[0] == "simulate" and "--train" in c for c in found)


@pytest.mark.parametrize("argv", commands(), ids=lambda argv: " ".join(argv)[:60])
def test_readme_command_runs(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the commands use paths relative to the repository
    if argv[0] == "simulate" and "--out" not in argv:
        argv = argv + ["--out", str(tmp_path / "out")]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    if argv[0] == "simulate":
        assert (tmp_path / "out" / "summary.json").is_file()


def test_readme_python_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = [body for lang, body in code_blocks(section_text()) if lang == "python"]
    assert blocks
    for body in blocks:
        namespace = {}
        exec(compile(body, "README.md", "exec"), namespace)
    assert str(namespace["f"].outputs[0].type) == "f32[2,64,128]@0"
