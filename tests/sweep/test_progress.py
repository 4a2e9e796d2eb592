"""Progress output, driven by a fake clock (no sleeps): plain lines every
10 % and a heartbeat every 30 s while points run; a terminal bar that
also redraws on a timer."""
from __future__ import annotations

import io

from distsim.sweep.progress import HEARTBEAT_S, Progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(stream: io.StringIO):
    return [line for line in stream.getvalue().splitlines() if line]


def test_plain_lines_have_a_heartbeat_while_points_run():
    clock, out = Clock(), io.StringIO()
    running = [2]
    bar = Progress(20, stream=out, tty=False, label="s", running=lambda: running[0],
                   clock=clock)
    clock.now += 10
    bar.update(1)                                   # 5 %: first decile line
    assert lines(out) == ["s: 1/20 (5%)  0.10 configs/s  ETA 3:10  running 2  elapsed 0:10"]
    clock.now += HEARTBEAT_S - 1
    bar.tick()                                      # 29 s since the last line: quiet
    assert len(lines(out)) == 1
    clock.now += 1
    bar.tick()                                      # 30 s: a heartbeat
    assert lines(out)[-1] == ("s: 1/20 (5%)  0.03 configs/s  ETA 12:40  running 2  "
                              "elapsed 0:40  (working)")
    clock.now += 10
    bar.tick()                                      # 10 s after the heartbeat: quiet
    assert len(lines(out)) == 2
    running[0] = 1
    clock.now += 20
    bar.tick()                                      # 30 s after the heartbeat
    assert lines(out)[-1].endswith("running 1  elapsed 1:10  (working)")
    bar.update(20)                                  # the end: a last line, no 'running'
    assert lines(out)[-1] == "s: 20/20 (100%)  0.29 configs/s  ETA 0:00  elapsed 1:10"
    clock.now += 100
    bar.tick()                                      # nothing after the end
    assert len(lines(out)) == 4
    bar.close()


def test_deciles_print_without_waiting():
    clock, out = Clock(), io.StringIO()
    bar = Progress(10, stream=out, tty=False, label="s", clock=clock)
    for i in range(1, 11):
        clock.now += 1
        bar.update(i)
    assert [line.split()[1] for line in lines(out)] == [f"{i}/10" for i in range(1, 11)]


def test_terminal_bar_redraws_on_a_timer():
    clock, out = Clock(), io.StringIO()
    bar = Progress(4, stream=out, tty=True, label="s", running=lambda: 1, clock=clock)
    clock.now += 5
    bar.tick()                                      # nothing finished yet: drawn anyway
    first = out.getvalue()
    assert first.startswith("\rs [") and "0/4 (0%)" in first and "elapsed 0:05" in first
    clock.now += 0.5
    bar.tick()                                      # under a second: no redraw
    assert out.getvalue() == first
    clock.now += 0.5
    bar.tick()
    assert out.getvalue().count("\r") == 2 and "elapsed 0:06" in out.getvalue()
    bar.update(4)
    bar.close()
    assert out.getvalue().endswith("\n") and "4/4 (100%)" in out.getvalue()


def test_quiet_progress_prints_nothing():
    clock, out = Clock(), io.StringIO()
    bar = Progress(4, stream=out, tty=False, enabled=False, clock=clock)
    clock.now += 100
    bar.tick()
    bar.update(2)
    bar.close()
    assert out.getvalue() == ""
