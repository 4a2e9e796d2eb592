"""The examples of README.md, as ``test_readme_examples.py`` runs them and
as their run times are measured.

An example is every ``distsim`` command of a ``bash`` block (commands
joined by ``;`` or ``&&`` are one each; a ``console`` block's commands
are its ``$ `` lines) and every ``python`` block. The commands of one
block run in one folder, in order, as a user would type them (a
``distsim compare`` reads the runs written before it). A ``text`` block is a
synopsis, and the ``pip`` and ``python -m pytest`` steps are the install
and test commands (``.ci/run`` runs those). A README block with a
``distsim`` line and no tag is an error: it must say which it is.

The README states the run time of the slow examples in their comment
(``# 13 s, 1.3 GB``); one stated at :data:`SLOW_S` seconds or more is
*slow*: the test runs it only when ``DISTSIM_SLOW_EXAMPLES=1`` (CI sets it).

    python tests/readme_examples.py          # run every example from a temporary
                                             # folder: wall time and peak memory
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: Examples the README states at this many seconds or more are slow.
SLOW_S = 10.0
#: The variable that runs the slow ones too.
SLOW_ENV = "DISTSIM_SLOW_EXAMPLES"

_TIME = re.compile(r"(\d+(?:\.\d+)?) s\b")
_RUN = ("bash", "console", "python")
_NOT_RUN = ("text", "yaml", "json")


@dataclass(frozen=True)
class Example:
    kind: str                  # "shell" (a distsim command) or "python" (a block)
    text: str                  # the command's words joined, or the block
    line: int                  # its line in README.md
    comment: str               # the README's comments on it
    block: int = 0             # the line of its block: a block's commands share a folder

    @property
    def argv(self) -> List[str]:
        """The ``distsim`` arguments of a shell example."""
        return shlex.split(self.text)[1:]

    @property
    def stated_s(self) -> Optional[float]:
        """The run time its comment states, in seconds (None: none stated)."""
        found = [float(t) for t in _TIME.findall(self.comment)]
        return max(found) if found else None

    @property
    def slow(self) -> bool:
        return (self.stated_s or 0.0) >= SLOW_S

    @property
    def id(self) -> str:
        first = self.text.splitlines()[0]
        return f"L{self.line} {first[:60]}"


def code_blocks(text: str) -> List[Tuple[str, int, List[str]]]:
    """(tag, line of the first body line, body lines) of each fenced block."""
    blocks, body, tag, start, inside = [], [], "", 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if inside:
                blocks.append((tag, start, body))
                body = []
            else:
                tag, start = line[3:].strip(), number + 1
            inside = not inside
        elif inside:
            body.append(line)
    return blocks


def _commands(line: str) -> List[Tuple[str, str]]:
    """The commands of one shell line (``;`` and ``&&`` separate them), each
    as (words, the line's comment)."""
    comment = line.split(" #", 1)[1] if " #" in line else ""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out, words = [], []
    for token in list(lexer) + [";"]:
        if token in (";", "&&"):
            if words:
                out.append((shlex.join(words), comment))
            words = []
        else:
            words.append(token)
    return out


def examples(text: Optional[str] = None) -> List[Example]:
    """Every example of the README, in order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found: List[Example] = []
    for tag, start, body in code_blocks(text):
        if tag == "python":
            comment = " ".join(line.split("#", 1)[1] for line in body if "#" in line)
            found.append(Example("python", "\n".join(body), start, comment, start))
            continue
        if tag in _NOT_RUN:
            continue
        # continuation lines joined, each logical line keeping its first line number
        logical: List[Tuple[int, str]] = []
        for offset, line in enumerate(body):
            if logical and logical[-1][1].endswith("\\"):
                logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + line.strip())
            else:
                logical.append((start + offset, line))
        for number, line in logical:
            line = line.strip()
            if tag == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.startswith("distsim") and " distsim " not in f" {line} ":
                continue
            if tag not in _RUN:
                raise ValueError(f"README.md:{start - 1}: a block with distsim commands must be "
                                 f"tagged bash, console or text, not {tag!r}")
            for words, comment in _commands(line):
                if words.split()[0] == "distsim":
                    found.append(Example("shell", words, number, comment, start))
    return found


# -- measuring ---------------------------------------------------------------------

_PROBE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
          "rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, "
          "stderr=subprocess.DEVNULL); "
          "print(rc, time.perf_counter() - t, "
          "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def measure(example: Example, folder: str) -> Tuple[int, float, float]:
    """(exit status, wall seconds, peak resident MB of its largest process)
    of one example run in its own process from ``folder``."""
    if example.kind == "shell":
        command = [sys.executable, "-m", "distsim", *example.argv]
    else:
        command = [sys.executable, "-c", example.text]
    out = subprocess.run([sys.executable, "-c", _PROBE, *command], cwd=folder,
                         capture_output=True, text=True, check=True)
    rc, wall, kib = out.stdout.split()
    return int(rc), float(wall), int(kib) / 1024


def main() -> int:
    print(f"{'line':>5} {'wall s':>8} {'peak MB':>8} {'stated':>7} rc  example")
    folders = {}
    for example in examples():
        if example.block not in folders:      # one temporary folder per block
            folders[example.block] = tempfile.TemporaryDirectory()
        rc, wall, mb = measure(example, folders[example.block].name)
        stated = f"{example.stated_s:g}" if example.stated_s is not None else "-"
        print(f"{example.line:>5} {wall:8.1f} {mb:8.0f} {stated:>7} {rc:>2}  "
              f"{example.text.splitlines()[0][:70]}", flush=True)
    return 0


if __name__ == "__main__":
    started = time.time()
    code = main()
    print(f"all: {time.time() - started:.0f} s", file=sys.stderr)
    sys.exit(code)
