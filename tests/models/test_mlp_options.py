"""The MLP step is plain data parallelism with SGD: strategy options it
does not apply are refused by name (exit 2), not silently ignored while the
summary's config claims them."""
from __future__ import annotations

import pytest

from distsim.cli import main

SMALL = ["simulate", "--layers", "2", "--hidden", "64", "--batch", "64", "--dp", "2",
         "--no-plots"]


@pytest.mark.parametrize("flags, named", [
    (["--zero", "3"], "--zero 3"),
    (["--bucket-mb", "0"], "--bucket-mb 0.0"),
    (["--recompute", "full"], "--recompute full"),
    (["--microbatches", "4"], "--microbatches 4"),
    (["--global-batch", "64"], "--global-batch 64"),
    (["--prefetch", "3"], "--prefetch 3"),
    (["--partition", "balanced"], "--partition balanced"),
])
def test_unsupported_options_are_refused(tmp_path, capsys, flags, named):
    out = tmp_path / "out"
    assert main(SMALL + flags + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distsim: error: {named}: not supported by model 'mlp'")
    assert err.count("\n") == 1
    assert not out.exists()


def test_plain_data_parallel_still_runs(tmp_path):
    assert main(SMALL + ["--optimizer", "sgd", "--symmetry", "--out", str(tmp_path)]) == 0
