"""Hooks the estimator's record-and-replay tests put on
:class:`~distsim.estimate.replay.ReplayedBackward`: count a method's
calls, or start a task with the stage's communication stream busy (where a
record would not stand for the task)."""
from __future__ import annotations

from typing import Any, List

from distsim.estimate import replay as estimate_replay

OpByOp = estimate_replay.ReplayedBackward


def calls(monkeypatch: Any, name: str) -> List[tuple]:
    """A list that gains the arguments of each call of ``OpByOpBackward.name``."""
    seen: List[tuple] = []
    method = getattr(OpByOp, name)

    def counted(self, *args):
        seen.append(args)
        return method(self, *args)

    monkeypatch.setattr(OpByOp, name, counted)
    return seen


def busy_communication_at_start(monkeypatch: Any, name: str) -> None:
    """``OpByOpBackward.name(stage, c, ready)`` finds the stage's
    communication stream running past the task's start."""
    task = getattr(OpByOp, name)

    def busy_first(self, stage, c, ready):
        start = max(ready, self.ctx.tl.free[2 * stage])
        self.ctx.tl.free[2 * stage + 1] = start + 1e-3
        return task(self, stage, c, ready)

    monkeypatch.setattr(OpByOp, name, busy_first)
