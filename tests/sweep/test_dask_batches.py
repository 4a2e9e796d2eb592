"""The Dask runner sends estimated points in batches that share a layer
profile (one Dask task each), as local workers do; a batch whose task
fails is run again point by point, so no row is lost or duplicated."""
from __future__ import annotations

import pandas as pd
import pytest

import distsim
from distsim.sweep import runners
from distsim.sweep.batches import batch_tasks

distributed = pytest.importorskip("distributed")

GPT = {"model": "gpt2", "layers": 4, "global_batch": 32, "topology": "dgx-a100",
       "network_mode": "analytical", "fidelity": "estimate"}
GRID = {"tp": [1, 2], "pp": [1, 2], "zero": [1, 2]}


@pytest.fixture(scope="module")
def reference() -> pd.DataFrame:
    return distsim.sweep(GPT, GRID, workers=1, progress=False)


@pytest.fixture()
def client():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def _points():
    return [(str(i), {**GPT, "tp": tp, "pp": pp, "zero": z})
            for i, (tp, pp, z) in enumerate((tp, pp, z) for tp in GRID["tp"]
                                            for pp in GRID["pp"] for z in GRID["zero"])]


def test_estimated_points_go_in_batches(reference, client):
    runner = runners.DaskRunner(client)
    runner.open()
    tasks = _points()
    rows = dict(runner.run(tasks))
    # points that differ only in the ZeRO stage 1 / 2 share a profile: 4 batches of 2
    assert runner.submitted == len(batch_tasks(tasks)) == 4
    assert sorted(rows) == sorted(k for k, _ in tasks)
    assert all(row["status"] == "ok" for row in rows.values())
    df = distsim.sweep(GPT, GRID, scheduler=client, progress=False)
    pd.testing.assert_frame_equal(df, reference)


def test_a_failed_batch_is_run_again_point_by_point(reference, client, monkeypatch):
    real = runners.run_batch

    def flaky(batch, simulate=None):
        if len(batch) > 1:     # as if the worker running the batch were lost
            raise OSError("connection to the worker lost")
        return real(batch, simulate)

    monkeypatch.setattr(runners, "run_batch", flaky)
    runner = runners.DaskRunner(client)
    runner.open()
    tasks = _points()
    keys = [key for key, _ in runner.run(tasks)]
    assert sorted(keys) == sorted(k for k, _ in tasks)      # none lost, none twice
    assert runner.submitted == 4 + len(tasks)
    df = distsim.sweep(GPT, GRID, scheduler=client, progress=False)
    pd.testing.assert_frame_equal(df, reference)
