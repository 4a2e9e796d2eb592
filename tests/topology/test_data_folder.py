"""``DISTSIM_DATA`` moves the folder of named topologies as it moves the
models (``distsim.paths``): ``distsim topology`` lists that folder and a
name loads from it."""
from __future__ import annotations

import shutil

from distsim.paths import topologies_dir
from distsim.topology import known_topologies, load_topology


def test_named_topologies_follow_distsim_data(tmp_path, monkeypatch):
    source = topologies_dir() / "torus-4x4.yaml"
    (tmp_path / "topologies").mkdir()
    shutil.copy(source, tmp_path / "topologies" / "my-torus.yaml")
    monkeypatch.setenv("DISTSIM_DATA", str(tmp_path))
    assert known_topologies() == ["my-torus"]
    topo = load_topology("my-torus")
    assert topo.num_devices == 16 and str(tmp_path) in topo.source
