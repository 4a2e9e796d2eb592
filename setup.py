"""Build distsim; the project's metadata is in pyproject.toml.

One step is added to the build: the data folders users edit (the named
topologies and models, the example programs and sweep specs: see
``DATA_FOLDERS`` in ``distsim/paths.py``) are copied into the package as
``distsim/data/<kind>/``, so that an installed wheel finds them. An
editable install (``pip install -e .``) reads the folders in place.
"""
import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _paths_module():
    """``distsim/paths.py`` on its own (it imports only the standard
    library): the build environment need not have distsim's dependencies."""
    spec = importlib.util.spec_from_file_location("_distsim_paths", ROOT / "distsim" / "paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_data(build_lib: Path) -> list:
    """Copy the data folders into ``build_lib/distsim/data``; the files written."""
    paths = _paths_module()
    written = []
    for kind, files in paths.data_files(ROOT).items():
        target = Path(build_lib) / paths.PACKAGE_DATA / kind
        target.mkdir(parents=True, exist_ok=True)
        for source in files:
            shutil.copyfile(source, target / source.name)
            written.append(str(target / source.name))
    return written


class BuildPyWithData(build_py):
    """build_py, plus the data folders copied into the package."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            self._data_outputs = copy_data(Path(self.build_lib))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + list(getattr(self, "_data_outputs", []))


setup(cmdclass={"build_py": BuildPyWithData})
