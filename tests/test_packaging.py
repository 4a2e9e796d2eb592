"""The data users edit (topologies, models, example programs and sweep
specs) is found both ways distsim runs: from a source checkout (the
repository's folders) and from a built package (the copies the build puts
into ``distsim/data``, read with importlib.resources), and named data
resolves from any working folder. ``.ci/run`` also builds a real wheel and
runs it from a fresh virtual environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import distsim
from distsim import paths

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkout_reads_the_repository_folders(monkeypatch):
    monkeypatch.delenv("DISTSIM_DATA", raising=False)
    assert paths.source_root() == ROOT
    assert paths.topologies_dir() == ROOT / "topologies"
    assert paths.models_dir() == ROOT / "models"
    assert paths.sweeps_dir() == ROOT / "reports" / "sweeps"


def test_distsim_data_moves_every_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTSIM_DATA", str(tmp_path))
    assert paths.data_dir("sweeps") == tmp_path / "reports" / "sweeps"
    assert paths.models_dir() == tmp_path / "models"


def test_the_data_files_are_the_named_things():
    files = paths.data_files(ROOT)
    names = {kind: {p.name for p in found} for kind, found in files.items()}
    assert {"dgx-a100.yaml", "torus-4x4.yaml"} <= names["topologies"]
    assert {"gpt2.yaml", "gpt2-tiny.onnx", "nested_mlp.dir"} <= names["models"]
    assert "export_hf.py" not in names["models"]          # a script, not data
    assert names["sweeps"] == {"gpt3-1.3b.yaml", "gpt3-175b.yaml", "mlp-dhpk.yaml",
                               "mlp-scaling.yaml"}


@pytest.fixture(scope="module")
def built_package(tmp_path_factory):
    """The package as ``setup.py build_py`` lays it out for a wheel."""
    pytest.importorskip("setuptools")
    build = tmp_path_factory.mktemp("build")
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                           str(build)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return build


def test_the_build_copies_every_data_file_into_the_package(built_package):
    for kind, files in paths.data_files(ROOT).items():
        copied = built_package / "distsim" / "data" / kind
        assert sorted(p.name for p in copied.iterdir()) == [p.name for p in files]
        for source in files:
            assert (copied / source.name).read_bytes() == source.read_bytes()
    assert (built_package / "distsim" / "py.typed").is_file()


BUILT_RUN = """
import distsim, distsim.paths as p
from distsim.models import load_model_config
from distsim.sweep.spec import load_spec
from distsim.topology import load_topology
assert p.source_root() is None, p.source_root()
assert str(p.topologies_dir()).startswith({build!r}), p.topologies_dir()
assert load_topology("dgx-a100-x2").num_devices == 16
assert load_model_config("gpt2-tiny")["family"] == "onnx"
assert load_spec("mlp-scaling").size == 36
r = distsim.simulate(layers=1, hidden=64, batch=64, network_mode="analytical")
print(r.step_time_s > 0)
"""


def test_a_built_package_reads_its_own_copies_from_any_folder(built_package, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DISTSIM_DATA"}
    env["PYTHONPATH"] = str(built_package)
    proc = subprocess.run([sys.executable, "-c", BUILT_RUN.format(build=str(built_package))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_one_version_everywhere():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in text and 'attr = "distsim.__version__"' in text
    assert "version=" not in (ROOT / "setup.py").read_text(encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "distsim", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == f"distsim {distsim.__version__}"
