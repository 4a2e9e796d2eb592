"""``--batch`` and ``--global-batch`` both set a GPT's global batch: when
both are given they must agree (``--global-batch`` used to win unsaid)."""
from __future__ import annotations

from distsim.cli import main


def test_batch_and_global_batch_must_agree(tmp_path, capsys):
    """For a GPT both set the global batch; --global-batch used to win unsaid."""
    assert main(["simulate", "--model", "tiny", "--batch", "16", "--global-batch", "32",
                 "--no-plots", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("distsim: error: --batch 16 and --global-batch 32 differ "
                                       "(both are the global batch: give one)\n")
    assert not (tmp_path / "out").exists()
