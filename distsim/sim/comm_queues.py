"""Which queue of a device takes each of its communication ops.

A queue takes its ops in program order: an op starts when the previous one
of its queue has ended (and every member of its team has reached it), so
the queues decide which communications may overlap on a device.

* **Point-to-point** (SendRecv): one queue per direction of each pair of
  ranks, ``p2p-to-<peer>`` for the sends and ``p2p-from-<peer>`` for the
  receives, apart from the collectives'. Transfers one way between two
  ranks run in program order (NCCL executes point-to-point calls to the
  same peer in order); the two ways run side by side, as a pipeline's
  exchange does: Megatron-LM's ``send_forward_recv_backward`` and PyTorch's
  ``Schedule1F1B`` issue a stage's send to the next stage and its receive
  from it in one ``batch_isend_irecv``, one NCCL group, whose calls
  progress concurrently (NCCL's *sendrecv*: "both sending and receiving at
  the same time").
* **Collectives**, by the ``comm_streams`` setting:

  - ``per-group`` (NCCL's behaviour): one queue per process group. PyTorch's
    ProcessGroupNCCL gives every group its own NCCL communicator and CUDA
    stream, so a tensor-parallel all-reduce does not wait for a
    data-parallel gradient all-reduce issued before it on another group;
    the two contend only for links, through the network model.
  - ``shared``: every collective of a device on one ``comm`` stream, in
    program order (a simpler model in which gradient sync issued during
    the backward delays the tensor-parallel collectives after it).

**A group is its set of ranks.** The program does not say which framework
group a collective belongs to, only its team; Megatron-LM and DeepSpeed
make one group per team of each parallel axis (the data-parallel gradient
all-reduce and ZeRO's gathers and reduce-scatters share the data-parallel
group), so the collectives of one team share one communicator and run one
after another, and two teams, even overlapping ones, run independently. A
framework that made two communicators over the same ranks is not modelled
(their collectives would queue on one stream here). This is also the unit
:func:`.solo.team_key` assumes: two collectives of one team never overlap.

A group's queue is named for the shape of its team, which is the same on
every device of a symmetry class (:mod:`.symmetry` copies a representative's
records to its peers): ``comm-<n>x<stride>`` for ``n`` ranks ``stride``
apart (``comm-8x1``: eight adjacent GPUs, a tensor-parallel group under the
default mesh order; ``comm-8x8``: a data-parallel group of eight across
servers), otherwise ``comm-`` and the ranks' offsets from the lowest
(``comm-0+1+3``). That name is the stream of the records (trace.json's
threads, the Gantt's communication band) and of a deadlock report.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from ..ir.comm import is_point_to_point
from ..ir.core import Op
from .trace import COMM_STREAM, P2P_STREAM

__all__ = ["COMM_STREAM_MODES", "DEFAULT_COMM_STREAMS", "check_comm_streams", "comm_queues",
           "group_stream", "record_stream"]

#: the ``comm_streams`` settings (see the module docstring)
COMM_STREAM_MODES: Tuple[str, ...] = ("per-group", "shared")
DEFAULT_COMM_STREAMS = "shared"


def check_comm_streams(value: object) -> str:
    """``comm_streams`` (``--comm-streams``): one of :data:`COMM_STREAM_MODES`."""
    if value not in COMM_STREAM_MODES:
        raise ConfigError(f"--comm-streams: must be 'per-group' or 'shared', got {value!r}")
    return str(value)


def group_stream(ranks: Iterable[int]) -> str:
    """The stream name of the group of ``ranks`` (see the module docstring)."""
    team = sorted(set(ranks))
    if len(team) < 2:
        return f"{COMM_STREAM}-1x1"
    step = team[1] - team[0]
    if all(b - a == step for a, b in zip(team, team[1:])):
        return f"{COMM_STREAM}-{len(team)}x{step}"
    return f"{COMM_STREAM}-" + "+".join(str(r - team[0]) for r in team)


def record_stream(op: Op, mode: str) -> str:
    """The stream of a communication op's records: ``p2p`` for a SendRecv
    (its queue's name says the peer; the records keep one stream for all),
    else its group's stream, or ``comm`` under ``shared``."""
    if is_point_to_point(op):
        return P2P_STREAM
    return group_stream(op.attrs["ranks"]) if mode == "per-group" else COMM_STREAM


def comm_queues(rank: int, kinds: np.ndarray, kind_ops: Sequence[Op], mode: str
                ) -> List[Tuple[str, Optional[List[int]]]]:
    """The queues of ``rank``'s communication ops, given the kind of each
    in program order (``kinds``; ``kind_ops[k]``, an op of kind ``k``: a
    kind has one team): ``(queue name, positions in kinds)``, positions None
    when one queue takes them all. Names are unique on the rank: a second
    group whose team has the shape of another's is named by its ranks."""
    by_team: Dict[frozenset, str] = {}  # a group's ranks -> its queue
    distinct = np.unique(kinds).tolist()
    names = []
    for kind in distinct:
        op = kind_ops[kind]
        ranks = op.attrs["ranks"]
        if is_point_to_point(op):
            src, dst = ranks
            name = f"{P2P_STREAM}-to-{dst}" if src == rank else f"{P2P_STREAM}-from-{src}"
        elif mode == "shared":
            name = COMM_STREAM
        else:
            team = frozenset(ranks)
            name = by_team.get(team)
            if name is None:
                name = group_stream(team)
                if name in by_team.values():
                    name = f"{COMM_STREAM}-" + ",".join(map(str, sorted(team)))
                by_team[team] = name
        names.append(name)
    if len(set(names)) <= 1:
        return [(names[0] if names else COMM_STREAM, None)]
    queue_of = dict(zip(distinct, names))
    queues: Dict[str, List[int]] = {}
    for k, kind in enumerate(kinds.tolist()):
        queues.setdefault(queue_of[kind], []).append(k)
    return list(queues.items())
