"""CI runs exactly the test command the README gives a user: the README
states these commands exactly, and .ci/run installs the project the same
way on a clean machine and runs that same test command."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    """The command in the code block after 'Install and run the tests:'."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"Install and run the tests:\s*```bash\n(.+?)\n```", text, re.S)
    assert match, "README.md has no 'Install and run the tests:' block"
    return match.group(1).strip()


def test_ci_runs_the_readme_test_command_exactly():
    command = readme_test_command()
    assert command == 'pip install -e ".[test]" && python -m pytest -q'
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [part.strip() for part in command.split("&&")]
    # each step of the README's command is a line of .ci/run, in that order,
    # and the test step is the last command CI runs
    positions = [ci_lines.index(step) for step in steps]
    assert positions == sorted(positions)
    commands = [line for line in ci_lines if line and not line.startswith("#")]
    assert commands[-1] == steps[-1]
    assert not any("pytest" in line for line in commands[:-1])


def test_ci_runs_a_wheel_from_elsewhere_and_lints_first():
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines()]
    # a wheel built and installed in a venv of its own, the main job run from a temporary folder
    wheel = next(i for i, line in enumerate(lines) if " wheel " in line and "-w" in line)
    install = next(i for i, line in enumerate(lines) if "pip install" in line and ".whl" in line)
    run = next(i for i, line in enumerate(lines) if "wheel-venv/bin/distsim\" simulate" in line)
    assert wheel < install < run
    assert lines[run - 1].startswith('cd "$work/')        # not the repository
    # the lint runs on the code and the tests, before the test command
    assert lines.index("ruff check distsim tests") < lines.index("python -m pytest -q")
    assert "export DISTSIM_SLOW_EXAMPLES=1" in lines
