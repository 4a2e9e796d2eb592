"""``distsim check`` / ``lower`` options: a seed numpy refuses (negative)
is a usage error, not a traceback; an ``--entry`` the file lacks names the
file and the functions it has."""
from __future__ import annotations

from pathlib import Path

import pytest

from distsim.cli import main

NESTED = str(Path(__file__).resolve().parents[2] / "models" / "nested_mlp.dir")


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64)])
def test_check_refuses_a_seed_out_of_range(capsys, seed):
    with pytest.raises(SystemExit) as info:
        main(["check", NESTED, "--seed", seed])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("distsim check: error: argument --seed: must be from 0 to 2^64 - 1")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["check", "lower"])
def test_unknown_entry_names_the_file(capsys, command):
    assert main([command, NESTED, "--entry", "nope"]) == 2
    assert capsys.readouterr().err == (f"distsim: error: {NESTED}: --entry nope: no function "
                                       "@nope (the file has @mlp, @main)\n")
