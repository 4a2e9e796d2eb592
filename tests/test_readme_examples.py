"""Every command and Python example of README.md runs as written, from a
temporary folder (so names, not paths into the repository, must do; the
commands of one block share the folder, in order), and the README states
the run time of the slow ones.

The examples are read from the README (``readme_examples.py``); those the
README states at 10 s or more run when ``DISTSIM_SLOW_EXAMPLES=1``, as
``.ci/run`` sets it."""
from __future__ import annotations

import os

import pytest

from distsim.cli import main
from readme_examples import SLOW_ENV, Example, examples

EXAMPLES = examples()
RUN_SLOW = os.environ.get(SLOW_ENV) == "1"


def _maybe_slow(example: Example):
    marks = [pytest.mark.skipif(example.slow and not RUN_SLOW,
                                reason=f"stated at {example.stated_s:g} s: {SLOW_ENV}=1 runs it")
             ] if example.slow else []
    return pytest.param(example, id=example.id, marks=marks)


def test_the_readme_has_its_examples():
    shell = [e for e in EXAMPLES if e.kind == "shell"]
    commands = {e.argv[0] for e in shell if e.argv}
    assert {"simulate", "print", "models", "topology", "collective", "lower", "check", "import",
            "sweep", "search", "bench"} <= commands
    assert len([e for e in EXAMPLES if e.kind == "python"]) >= 6
    # the main job, as the quick start gives it
    assert any(e.text == "distsim simulate" for e in shell)


@pytest.fixture(scope="module")
def block_folders(tmp_path_factory):
    """A temporary folder per README block, made on first use."""
    folders = {}

    def folder(block: int):
        if block not in folders:
            folders[block] = tmp_path_factory.mktemp(f"readme-L{block}")
        return folders[block]
    return folder


@pytest.mark.parametrize("example", [_maybe_slow(e) for e in EXAMPLES if e.kind == "shell"])
def test_readme_command_runs_from_a_temporary_folder(example, block_folders, monkeypatch,
                                                     capsys):
    tmp_path = block_folders(example.block)
    monkeypatch.chdir(tmp_path)
    try:
        code = main(example.argv)
    except SystemExit as e:      # --help
        code = e.code
    captured = capsys.readouterr()
    assert code == 0, captured.err
    if example.argv[0] == "simulate" and "--help" not in example.argv:
        out = example.argv[example.argv.index("--out") + 1] if "--out" in example.argv \
            else "distsim-out"
        assert (tmp_path / out / "summary.json").is_file()


@pytest.mark.parametrize("example", [_maybe_slow(e) for e in EXAMPLES if e.kind == "python"])
def test_readme_python_example_runs_from_a_temporary_folder(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme_example"}
    exec(compile(example.text, f"README.md:{example.line}", "exec"), namespace)
    if "import_onnx(" in example.text:
        assert str(namespace["f"].outputs[0].type) == "f32[2,64,128]@0"


def test_slow_examples_state_their_time():
    """An example that takes long says so beside it (the README's
    measurements, rerun with ``python tests/readme_examples.py``)."""
    stated = [e for e in EXAMPLES if e.stated_s is not None]
    assert len(stated) >= 6
    assert all(e.stated_s > 0 for e in stated)


def test_every_block_with_commands_says_whether_they_run():
    text = "```\ndistsim simulate\n```\n"
    with pytest.raises(ValueError, match="must be tagged bash, console or text"):
        examples(text)
    assert [e.argv for e in examples("```bash\ndistsim a; distsim b && distsim c  # 3 s\n```\n")] \
        == [["a"], ["b"], ["c"]]
    assert examples("```text\ndistsim sweep SPEC.yaml [--out DIR]\n```\n") == []
