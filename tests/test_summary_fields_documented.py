"""Every key of a real summary.json is documented in README.md's
``summary.json`` section, with its unit. Real runs of three families write
the files: the default MLP, a tiny transformer with pipeline, tensor and
data parallelism under --symmetry (tokens, MFU, bubble, ``represents``),
and an imported ONNX model trained (``path``, ``train``)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator, Set, Tuple

import pytest

from distsim.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"

RUNS = {
    "mlp": ["--layers", "2", "--hidden", "64", "--batch", "64"],
    "gpt": ["--model", "tiny", "--dp", "2", "--tp", "2", "--pp", "2", "--symmetry"],
    "onnx": ["--model", "gpt2-tiny", "--train", "--batch", "8", "--seq", "8"],
}


def summary_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### `summary.json`")
    return text[start:text.index("### `trace.json`", start)]


def key_paths(obj: Any, path: str = "") -> Iterator[Tuple[str, str]]:
    """(path, key) for every key in ``obj``; keys that are ranks (digits)
    are walked through but not reported."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            here = f"{path}.{key}" if path else key
            if not key.isdigit():
                yield here, key
            yield from key_paths(value, here)
    elif isinstance(obj, list):
        for value in obj:
            yield from key_paths(value, f"{path}[]")


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    out = {}
    for name, args in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        assert main(["simulate", *args, "--no-plots", "--network-mode", "analytical",
                     "--out", str(folder)]) == 0
        out[name] = json.loads((folder / "summary.json").read_text())
    return out


def test_the_runs_cover_the_optional_fields(summaries):
    gpt = summaries["gpt"]
    assert {"tokens_per_s", "mfu", "model_flops"} <= gpt.keys()
    assert "represents" in gpt["devices"][0] and gpt["bubble_fraction"] > 0
    assert summaries["mlp"]["bubble_fraction"] == 0.0      # present without pipelining
    assert summaries["mlp"]["links"] and summaries["mlp"]["trace_file"]["records"] > 0
    assert {"path", "train"} <= summaries["onnx"]["config"].keys()


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_key_is_documented_in_the_summary_section(summaries, run):
    section = summary_section()
    readme = README.read_text(encoding="utf-8")
    missing: Set[str] = set()
    for path, key in key_paths(summaries[run]):
        if f"`{key}`" in section:
            continue
        # a strategy key is documented by its command-line option
        if path.startswith("config.") and f"`--{key.replace('_', '-')}" in readme:
            continue
        missing.add(path)
    assert not missing, f"summary.json keys not documented in README.md: {sorted(missing)}"


def test_units_are_given_for_numeric_fields():
    # each table row of a top-level or per-device field names a type
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \|", summary_section(), re.M)
    assert len(rows) > 30
    for name, kind in rows:
        assert re.search(r"int|float|bool|str|list|object", kind), (name, kind)
        if name.endswith("_s") and not name.endswith("_per_s") and kind.startswith("float"):
            assert ", s" in kind, (name, kind)
        if name.endswith("_bytes"):
            assert "bytes" in kind, (name, kind)
