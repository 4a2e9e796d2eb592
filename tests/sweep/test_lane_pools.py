"""LocalProcessRunner gives each worker a pool of its own that runs one lane
of batches (distsim.sweep.batches.Lanes), so that a worker keeps to its part
of the grid (and the collectives its points time). Driven here by fake
one-worker pools whose futures finish when the runner waits: no process is
started, the order of events is exact."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any, List

import pytest

from distsim.sweep import runners
from distsim.sweep.batches import Lanes, batch_tasks

EST = {"model": "gpt2", "layers": 4, "topology": "dgx-a100", "fidelity": "estimate"}


class FakePool:
    """A one-worker pool: batches queue up and finish one at a time, the
    oldest first, when the runner waits (see :func:`_wait`)."""

    def __init__(self, name: int) -> None:
        self.name = name
        self.pending: List[Future] = []
        self.received: List[List[str]] = []    # point keys of each batch, in order
        self.most_in_flight = 0
        self.closed = False

    def submit(self, fn: Any, params: List[dict], simulate: Any) -> Future:
        fut: Future = Future()
        fut.params = params
        self.pending.append(fut)
        self.received.append([_KEYS[id(p)] for p in params])
        self.most_in_flight = max(self.most_in_flight, len(self.pending))
        return fut

    def finish_one(self) -> Future:
        fut = self.pending.pop(0)
        fut.set_result([{"status": "ok", "ran_in": self.name} for _ in fut.params])
        return fut


def _runner(monkeypatch, workers: int):
    pools = [FakePool(i) for i in range(workers)]
    runner = runners.LocalProcessRunner(workers)
    monkeypatch.setattr(runner, "_pools", lambda n: pools[:n])
    monkeypatch.setattr(runners, "close_pool", lambda pool: setattr(pool, "closed", True))

    def _wait(futures, return_when):          # each busy worker finishes its running batch
        return {pool.finish_one() for pool in pools if pool.pending}, set()
    monkeypatch.setattr(runners, "wait", _wait)
    return runner, pools


_KEYS: dict = {}       # id of a point's options -> its key


def _tasks(params: List[dict]):
    """(key, options) of each point: the key kept apart (an option of its
    own would put every point in a profile group of its own)."""
    tasks = []
    for p in params:
        options = {k: v for k, v in p.items() if k != "key"}
        _KEYS[id(options)] = p["key"]
        tasks.append((p["key"], options))
    return tasks


def test_each_worker_runs_its_own_lane_then_takes_from_the_longest(monkeypatch):
    # 8 estimated batches of one point each (a profile group per sequence length)
    tasks = _tasks([{**EST, "seq": 64 * k, "key": f"k{k}"} for k in range(1, 9)])
    runner, pools = _runner(monkeypatch, 2)
    rows = dict(runner.run(tasks))
    assert sorted(rows) == [f"k{i}" for i in range(1, 9)]
    lanes = Lanes(batch_tasks(tasks), 2)
    first_half = [[k for k, _ in b] for b in lanes.lanes[0]]
    second_half = [[k for k, _ in b] for b in lanes.lanes[1]]
    assert first_half == [["k1"], ["k2"], ["k3"], ["k4"]]
    # every batch ran in the pool of its own lane, in lane order (both
    # lanes finish together here: nothing to take from the other)
    assert pools[0].received == first_half and pools[1].received == second_half
    assert all(rows[k]["ran_in"] == 0 for b in first_half for k in b)
    # estimated batches queue one behind the running one
    assert pools[0].most_in_flight == runners.BATCHES_PER_WORKER == 2
    assert all(p.closed for p in pools)


def test_an_idle_worker_takes_the_last_batch_of_the_longest_lane(monkeypatch):
    # lane 0 holds one batch (six points), lane 1 three: worker 0's
    # second batch (queued behind its first) is the last of lane 1
    tasks = _tasks([{**EST, "tp": 1, "key": "a", "micro_batch": 1}]
                   + [{**EST, "tp": 1, "micro_batch": 1, "key": f"a{i}"} for i in range(5)]
                   + [{**EST, "tp": tp, "key": f"b{tp}"} for tp in (2, 3, 4)])
    runner, pools = _runner(monkeypatch, 2)
    dict(runner.run(tasks))
    assert pools[0].received[0][0] == "a"
    assert pools[1].received[0] == ["b2"]
    assert ["b4"] in pools[0].received          # taken from the end of lane 1
    assert ["b4"] not in pools[1].received


def test_no_batch_waits_behind_a_simulated_point(monkeypatch):
    """A simulated point may run for minutes: nothing queues behind it (an
    idle worker would otherwise wait while a batch sat in a busy one's
    queue), and a simulated point queues behind nothing."""
    sims = [{"model": "mlp", "dp": dp, "key": f"s{dp}"} for dp in (1, 2, 4, 8)]
    runner, pools = _runner(monkeypatch, 2)
    assert sorted(dict(runner.run(_tasks(sims)))) == ["s1", "s2", "s4", "s8"]
    assert all(p.most_in_flight == 1 for p in pools)
    mixed = [{**EST, "tp": 1, "key": "e1"}, {"model": "mlp", "dp": 2, "key": "s"},
             {**EST, "tp": 2, "key": "e2"}, {**EST, "tp": 4, "key": "e4"}]
    runner, pools = _runner(monkeypatch, 1)
    assert sorted(dict(runner.run(_tasks(mixed)))) == ["e1", "e2", "e4", "s"]
    assert pools[0].received == [["e1"], ["s"], ["e2"], ["e4"]]
    assert pools[0].most_in_flight == 2          # e4 behind e2, once s was done


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_fewer_batches_than_workers_start_one_pool_per_batch(monkeypatch, workers):
    tasks = _tasks([{"model": "mlp", "dp": 1, "key": "only"}])
    runner, pools = _runner(monkeypatch, workers)
    assert list(dict(runner.run(tasks))) == ["only"]
    assert pools[0].received == [["only"]]
    assert all(not p.received for p in pools[1:])
