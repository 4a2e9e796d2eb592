"""``max_wall_s`` (``--max-wall-s``) bounds the whole run: building and
verifying the program as well as simulating it, in the main thread (a
timer) and elsewhere (checked between the phases)."""
from __future__ import annotations

import signal
import threading
import time

import pytest

import distsim
from distsim.errors import SimulationError
from distsim.wall_clock import WallClock


def test_a_bound_shorter_than_the_build_stops_the_build():
    # GPT-2's step takes a few tenths of a second to build, far past 10 ms
    with pytest.raises(SimulationError, match="stopped while building the program: .* past "
                                              "--max-wall-s 0.01"):
        distsim.simulate(model="gpt2", max_wall_s=0.01)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_in_a_thread_the_bound_is_checked_between_phases():
    caught = []

    def run():
        try:
            distsim.simulate(model="gpt2", max_wall_s=0.01)
        except SimulationError as e:
            caught.append(str(e))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=300)
    assert len(caught) == 1 and "past --max-wall-s 0.01" in caught[0]


def test_a_phase_past_the_deadline_is_interrupted():
    with pytest.raises(SimulationError, match="stopped while sleeping"):
        with WallClock(0.05) as clock:
            with clock.phase("sleeping"):
                time.sleep(5)     # interrupted at 0.05 s by the timer


def test_no_bound_and_a_phase_in_time_change_nothing():
    with WallClock(None) as clock:
        with clock.phase("anything"):
            pass
    assert clock.remaining() is None
    with WallClock(60) as clock:
        with clock.phase("quick"):
            pass
    assert 0 < clock.remaining() <= 60
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_a_timer_of_the_callers_own_is_left_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        with WallClock(60) as clock:
            with clock.phase("quick"):
                assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert fired == []


class _SlowFinalizer:
    def __del__(self):
        time.sleep(0.5)        # the timer fires in here, where Python drops exceptions


def test_a_timer_that_lands_in_a_finalizer_fires_again_quietly(capsys):
    with pytest.raises(SimulationError, match="stopped while finalizing"):
        with WallClock(0.05) as clock:
            with clock.phase("finalizing"):
                _SlowFinalizer()       # dropped at once: its __del__ runs here
                time.sleep(5)
    assert "Exception ignored" not in capsys.readouterr().err
