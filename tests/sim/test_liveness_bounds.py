"""Liveness bounds: besides a deadlock (no event left, always
detected), a run stops with a SimulationError listing every blocked op per
device when it passes a bound of SimulationOptions: ``max_events`` (events
in all), ``stall_events`` (events in a row without an op finishing) or
``max_wall_s`` (wall-clock budget). Each bound is tried with a tiny budget
on a program that needs far more, so nothing here depends on timing."""
from __future__ import annotations

import pytest

from distsim.errors import SimulationError
from distsim.models import MLPConfig, mlp_training_step
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.topology import load_topology
from distsim.transforms.data_parallel import DataParallel


@pytest.fixture(scope="module")
def topo():
    return load_topology("dgx-a100")


@pytest.fixture(scope="module")
def program():
    return DataParallel(8)(mlp_training_step(MLPConfig(layers=4, hidden=64, batch=64)))


def blocked_streams(message: str):
    """{(device, stream): op} from a stop report."""
    _, _, body = message.partition(" blocked: ")
    out = {}
    for part in body.split("; "):
        where, _, rest = part.partition(": ")
        _, dev, stream = where.split()
        out[(int(dev), stream)] = rest.split()[0]
    return out


def stopped(program, topo, **bounds) -> str:
    with pytest.raises(SimulationError) as info:
        simulate_function(program, topo, options=SimulationOptions(**bounds))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_program_finishes_under_the_default_bounds(program, topo):
    trace = simulate_function(program, topo)
    assert trace.step_time_s > 0
    assert SimulationOptions().stall_events is not None  # on by default: no run spins forever


def test_event_budget_stops_the_run_and_lists_blocked_ops_per_device(program, topo):
    message = stopped(program, topo, max_events=20)
    assert message.startswith("stopped (event budget of 20 events spent (max_events)) at t=")
    blocked = blocked_streams(message)
    # every device's comm stream waits on its first all-reduce
    assert {d for d, s in blocked if s == "comm"} == set(range(8))
    assert all(op.startswith("%") for op in blocked.values())


def test_stall_bound_stops_a_run_without_progress(program, topo):
    # the first events only start the streams' processes: no op finishes
    message = stopped(program, topo, stall_events=1)
    assert message.startswith("stopped (no progress for 1 events (stall_events)) at t=")
    assert " stream(s) blocked: " in message


def test_wall_clock_budget_stops_the_run(program, topo):
    message = stopped(program, topo, max_wall_s=0)
    assert message.startswith("stopped (wall-clock budget of 0 s spent (max_wall_s)) at t=")
    assert blocked_streams(message)


def test_generous_bounds_give_the_same_result(program, topo):
    plain = simulate_function(program, topo)
    bounded = simulate_function(program, topo, options=SimulationOptions(
        stall_events=10 ** 9, max_events=10 ** 9, max_wall_s=3600.0))
    assert bounded.step_time_s == plain.step_time_s
    assert bounded.ops == plain.ops


@pytest.mark.parametrize("bound", ["stall_events", "max_events", "max_wall_s"])
@pytest.mark.parametrize("value", [-1, "10", True])
def test_malformed_bounds_are_errors(program, topo, bound, value):
    with pytest.raises(SimulationError, match=bound):
        simulate_function(program, topo, options=SimulationOptions(**{bound: value}))
