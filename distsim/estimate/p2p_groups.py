"""The estimator's pipeline transfers under an engine that waits for them
(the simulator's ``p2p: synchronous`` or ``separate``,
:mod:`distsim.sim.launch_queue`, *Pipeline transfers*).

A stage's consecutive transfers are one group (each its own under
``separate``); whatever the stage issues after a group starts no earlier
than the group's last end. On the :class:`~.engine.Timeline` that is the
stage's compute stream's end raised to the group's end as each transfer is
added: its next compute starts there, and under stream order (which the
estimator requires with these settings: :func:`.point.resolve`) every
collective and transfer is issued behind that end (:meth:`Timeline.issued
<.engine.Timeline.issued>`). A transfer of a group still open (nothing else
added on the stage since the group's last transfer: the stage's streams
stand where that transfer left them) is issued behind where the group
began instead, as the simulator's group goes out at once.
"""
from __future__ import annotations

from typing import Dict, Tuple

#: per stage: the compute end its open group was issued behind, and where
#: the stage's streams stood after the group's last transfer
Group = Tuple[float, Tuple[float, float, float]]


class TransferGroups:
    """Each stage's open group of transfers (``grouping``: consecutive
    transfers are one group; else each is its own)."""

    __slots__ = ("grouping", "open")

    def __init__(self, grouping: bool) -> None:
        self.grouping = grouping
        self.open: Dict[int, Group] = {}

    def copy(self) -> "TransferGroups":
        other = TransferGroups(self.grouping)
        other.open = dict(self.open)
        return other

    def issued(self, tl, stage: int) -> float:
        """What a transfer on ``stage`` of ``tl`` (a Timeline) is issued
        behind: the end of its group's predecessor if the stage's group is
        still open, else the stage's compute stream's end."""
        group = self.open.get(stage)
        s = 2 * stage
        if group is not None and self.grouping and \
                group[1] == (tl.free[s], tl.free[s + 1], tl.dp_free[stage]):
            return group[0]
        return tl.free[s]

    def waited(self, tl, stage: int, issued: float, end: float) -> None:
        """A transfer on ``stage`` issued behind ``issued`` ends at ``end``:
        what the stage issues after its group waits for it."""
        free, s = tl.free, 2 * stage
        if end > free[s]:
            free[s] = end
        self.open[stage] = (issued, (free[s], free[s + 1], tl.dp_free[stage]))
