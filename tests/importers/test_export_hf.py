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


def setup_kwargs():
    """The literal keyword arguments of setup() in setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "setup")
    out = {}
    for kw in call.keywords:
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:  # not a literal (long_description=open(...))
            pass
    return out


def requirement_names(requirements):
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
            for r in requirements}


def test_export_extra_lists_every_package_the_script_imports():
    kwargs = setup_kwargs()
    available = (requirement_names(kwargs["extras_require"]["export"]) |
                 requirement_names(kwargs["install_requires"]))
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
