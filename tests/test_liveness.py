"""Liveness: a program that cannot finish ends with a SimulationError that
lists every blocked op per device, quickly, and never hangs. Each
simulation runs under an alarm (a hang fails the test instead of stalling
the suite); the CLI is exercised in a subprocess with a timeout."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from distsim.errors import SimulationError
from distsim.ir import DType, Function, Op, TensorType, Value
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.topology import load_topology

sys.path.insert(0, str(Path(__file__).resolve().parent / "adversarial"))
from catalogue import (deadlock_circular_wait, deadlock_member_never_reaches,  # noqa: E402
                       deadlock_sendrecv_own_output)

LIMIT_S = 20


@contextmanager
def alarm(seconds: int = LIMIT_S):
    def hung(signum, frame):
        raise TimeoutError(f"the simulation did not finish within {seconds} s")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def topo():
    return load_topology("dgx-a100")


def _t(device):
    return TensorType((1 << 16,), DType.F16, device)


def blocked_streams(message: str):
    """{(device, stream): op} from a deadlock report."""
    head, _, body = message.partition(" blocked: ")
    out = {}
    for part in body.split("; "):
        where, _, rest = part.partition(": ")
        _, dev, stream = where.split()
        out[(int(dev), stream)] = rest.split()[0]
    return out


def run_deadlock(function, topo, mode="flow"):
    with alarm():
        with pytest.raises(SimulationError) as info:
            simulate_function(function, topo, options=SimulationOptions(network_mode=mode))
    message = str(info.value)
    assert message.startswith("deadlock at t=")
    assert "\n" not in message
    return message, blocked_streams(message)


@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_collective_a_member_never_reaches(topo, mode):
    message, blocked = run_deadlock(deadlock_member_never_reaches(), topo, mode)
    assert blocked == {(0, "comm"): "%o0", (1, "comm"): "%o0", (1, "compute"): "%p1"}
    assert "device 0 comm: %o0 (comm.allreduce) waiting for ranks [1] to reach it" in message
    assert "device 1 comm: %o0 (comm.allreduce) waiting for input %p1" in message
    assert "3 stream(s) blocked" in message


def test_sendrecv_whose_input_needs_its_own_output(topo):
    message, blocked = run_deadlock(deadlock_sendrecv_own_output(), topo)
    # a SendRecv waits on its direction's point-to-point queue, named by the
    # peer; the one coming back, on the other direction's, waits for b1
    assert blocked == {(0, "p2p-to-1"): "%b1", (0, "compute"): "%a0",
                       (1, "p2p-from-0"): "%b1",
                       (0, "p2p-from-1"): "%c0", (1, "p2p-to-0"): "%c0"}
    assert "device 0 p2p-to-1: %b1 (comm.sendrecv) waiting for input %a0" in message
    assert "device 1 p2p-from-0: %b1 (comm.sendrecv) waiting for ranks [0] to reach it" in message


def test_circular_wait_of_three_collectives(topo):
    _, blocked = run_deadlock(deadlock_circular_wait(), topo)
    assert set(blocked) == {(r, s) for r in range(3) for s in ("comm", "compute")}


def ring_of_waits(n):
    """n ranks; rank r's all-reduce with r+1 is fed by a relu of what r-1's
    all-reduce gives it: a cycle through every rank of an 8-GPU server."""
    xs = [Value(f"x{r}", _t(r)) for r in range(n)]
    fed = [Value(f"fed{r}", _t(r)) for r in range(n)]
    ops, outs = [], {}
    for r in range(n):
        s = (r + 1) % n
        lo, hi = sorted((r, s))
        o = {lo: Value(f"o{r}_{lo}", _t(lo)), hi: Value(f"o{r}_{hi}", _t(hi))}
        ins = {r: fed[r], s: xs[s]}
        ops.append(Op("comm.allreduce", [ins[lo], ins[hi]], [o[lo], o[hi]],
                      {"ranks": (lo, hi), "reduce_op": "sum"}))
        outs[s] = o[s]
    for r in range(n):
        ops.append(Op("relu", [outs[r]], [fed[r]]))
    return Function("ring_of_waits", xs, ops, list(outs.values()))


def test_a_deadlock_across_eight_devices_reports_every_stream_fast(topo):
    start = time.perf_counter()
    _, blocked = run_deadlock(ring_of_waits(8), topo)
    assert time.perf_counter() - start < 5
    assert {d for d, _ in blocked} == set(range(8))
    assert all(op.startswith("%") for op in blocked.values())


def test_an_operand_nobody_produces_is_an_error_not_a_hang(topo):
    x, ghost, y = Value("x", _t(0)), Value("ghost", _t(0)), Value("y", _t(0))
    f = Function("ghost", [x], [Op("add", [x, ghost], [y])], [y])
    with alarm():
        with pytest.raises(SimulationError, match="ghost"):
            simulate_function(f, topo)


def test_no_cli_command_hangs_on_a_deadlocked_text_program(tmp_path):
    """The text format cannot express a deadlock (operands are defined
    before use), so `distsim print` verifies a tricky-but-valid program and
    exits promptly; a timeout here would mean a hang."""
    text = ("func @f(%x0: f32[4]@0, %x1: f32[4]@1) -> (f32[4]@1) {\n"
            "  %a, %b = comm.allreduce(%x0, %x1) {ranks = [0, 1], reduce_op = \"sum\"} : "
            "f32[4]@0, f32[4]@1\n"
            "  %c = comm.sendrecv(%a) {ranks = [0, 1]} : f32[4]@1\n"
            "  return %c\n}\n")
    path = tmp_path / "p.dir"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "distsim", "print", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text
