"""verified_beside: verification in a forked child gives the verifier's own
verdict, with its error taking precedence over the body's."""
import os

import pytest

import distsim
import distsim.ir.verify_beside as vb
from distsim.errors import SimulationError, VerifyError
from distsim.ir import DType, Function, Op, TensorType, Value, verify

needs_fork = pytest.mark.skipif(not vb.can_fork(), reason="no fork here (or threads running)")


def t(*shape):
    return TensorType(tuple(shape), DType.F32, 0)


def _valid() -> Function:
    x = Value("x", t(4))
    y = Value("y", t(4))
    return Function("f", [x], [Op("relu", [x], [y])], [y])


def _use_before_definition() -> Function:
    x, y, z = Value("x", t(4)), Value("y", t(4)), Value("z", t(4))
    return Function("f", [x], [Op("add", [x, y], [z]), Op("relu", [x], [y])], [z])


@pytest.fixture
def counted(monkeypatch):
    """vb.verify wrapped to count the calls made in this process (the
    child's calls happen in another process and are not counted here)."""
    calls = []
    real = vb.verify

    def counting(function, known_devices=None):
        calls.append(os.getpid())
        return real(function, known_devices=known_devices)
    monkeypatch.setattr(vb, "verify", counting)
    return calls


@needs_fork
def test_a_valid_program_is_verified_in_the_child(counted):
    ran = []
    with vb.verified_beside(_valid(), min_ops=0):
        ran.append(True)
    assert ran == [True]
    assert counted == []          # nothing verified in this process


@needs_fork
def test_an_invalid_program_raises_the_verifiers_own_error(counted):
    f = _use_before_definition()
    with pytest.raises(VerifyError) as direct:
        verify(f)
    with pytest.raises(VerifyError) as beside:
        with vb.verified_beside(f, min_ops=0):
            pass
    assert str(beside.value) == str(direct.value)
    assert counted == [os.getpid()]   # the child said no; the error is raised here


@needs_fork
def test_the_verifiers_error_takes_precedence_over_the_bodys():
    with pytest.raises(VerifyError, match="used before it is defined"):
        with vb.verified_beside(_use_before_definition(), min_ops=0):
            raise SimulationError("the simulator tripped on it too")


@needs_fork
def test_the_bodys_error_passes_when_the_program_is_valid():
    with pytest.raises(SimulationError, match="deadlock"):
        with vb.verified_beside(_valid(), min_ops=0):
            raise SimulationError("deadlock")


@needs_fork
def test_a_child_that_dies_without_a_verdict_is_not_trusted(monkeypatch, counted):
    parent = os.getpid()
    real = vb.verify

    def dies_in_child(function, known_devices=None):
        if os.getpid() != parent:
            os._exit(3)
        return real(function, known_devices=known_devices)
    monkeypatch.setattr(vb, "verify", dies_in_child)
    with pytest.raises(VerifyError, match="used before it is defined"):
        with vb.verified_beside(_use_before_definition(), min_ops=0):
            pass


def test_small_programs_verify_first_in_this_process(counted):
    with pytest.raises(VerifyError):
        with vb.verified_beside(_use_before_definition()):
            pytest.fail("the body must not run: a small program is verified first")
    assert counted == [os.getpid()]


def test_no_fork_while_other_threads_run():
    import threading
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert not vb.can_fork()
    finally:
        stop.set()
        worker.join()


@needs_fork
def test_simulate_forks_for_a_large_program(monkeypatch, counted):
    """distsim.simulate verifies beside the simulation: with the threshold
    lowered, the default MLP is verified in the child (not here), and the
    step time is the one of a run that verifies first."""
    first = distsim.simulate(dp=2).step_time_s
    assert counted == [os.getpid()]       # small: verified here first
    counted.clear()
    monkeypatch.setattr(vb, "MIN_OPS_TO_FORK", 0)
    assert distsim.simulate(dp=2).step_time_s == first
    assert counted == []


@needs_fork
def test_an_interrupted_body_stops_the_child_and_verifies_nothing(counted):
    """Ctrl-C during the simulation ends the run at once: no verification
    here (of an invalid program it would take as long again), the child
    killed and reaped."""
    children = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        children.append(pid)
        return pid
    import unittest.mock
    with unittest.mock.patch.object(vb.os, "fork", fork):
        with pytest.raises(KeyboardInterrupt):
            with vb.verified_beside(_use_before_definition(), min_ops=0):
                raise KeyboardInterrupt
    assert counted == []
    with pytest.raises(ChildProcessError):   # already reaped: no zombie left
        os.waitpid(children[0], os.WNOHANG)
