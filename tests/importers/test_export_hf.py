"""models/export_hf.py: its optional extra lists every package it imports,
and, where torch, transformers and onnxscript are installed, it writes
files that distsim imports. distsim never needs torch: the export test
skips without it (the shared test environment does not install it)."""
import ast
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "models" / "export_hf.py"


def project():
    """The ``[project]`` table of pyproject.toml."""
    try:
        import tomllib
    except ModuleNotFoundError:      # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def requirement_names(requirements):
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
            for r in requirements}


def test_export_extra_lists_every_package_the_script_imports():
    meta = project()
    available = (requirement_names(meta["optional-dependencies"]["export"]) |
                 requirement_names(meta["dependencies"]))
    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "__future__"}
    assert {"torch", "transformers", "onnxscript", "onnx"} <= third_party
    assert third_party <= available, sorted(third_party - available)


def load_script():
    spec = importlib.util.spec_from_file_location("export_hf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_script_writes_importable_models(tmp_path):
    for package in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(package)
    from onnx.reference import ReferenceEvaluator

    export_hf = load_script()
    for name in sorted(export_hf.TINY):
        path = export_hf.export(name, tmp_path)
        assert path == tmp_path / f"{name}-tiny.onnx" and path.stat().st_size < 1 << 20
        assert not list(tmp_path.glob(".*tmp*"))  # temporary files removed
        f = import_onnx(path, batch=2, seq=8)
        width = 32 if name == "bert" else 128
        assert f.outputs[0].type.shape == (2, 8, width)
        ids = np.random.default_rng(0).integers(0, 128, (2, 8)).astype(np.int64)
        ours = execute(f, onnx_input_arrays(f, {"input_ids": ids}))[0]
        theirs = ReferenceEvaluator(str(path)).run(None, {"input_ids": ids})[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
