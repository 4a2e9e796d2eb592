"""Where Megatron-LM's interleaved schedule exchanges tensors between stages.

Megatron-LM's ``forward_backward_pipelining_with_interleaving``
(``megatron/schedules.py``, 2021-2022) issues each rank's transfers in
calls of ``p2p_communication._communicate``: one ``batch_isend_irecv``
group per call, at fixed points of the rank's task order (``k`` counts
the rank's forwards and backwards over its chunks, ``W`` warm-up
forwards, ``R`` steady pairs):

- before the first forward, ``recv_forward`` (its input; not on rank 0);
- after warm-up forward ``k``, ``send_forward_recv_forward``: its output
  to the next stage, the next forward's input from the previous one; the
  last warm-up call (``send_forward_backward_recv_forward_backward``) also
  receives the first backward's output gradient;
- in the steady state, after forward ``W + k`` *and* backward ``k``, one
  ``send_forward_backward_recv_forward_backward``: the forward's output to
  the next stage and the backward's input gradient to the previous one,
  receiving the next forward's input and the next backward's output
  gradient;
- after cool-down backward ``k``, ``send_backward_recv_backward``.

Ranks are a ring (the last rank's forward output of a chunk goes to rank 0's
next chunk); which calls receive follows Megatron's ``recv_prev`` /
``recv_next`` flags, and NCCL pairs the ``n``-th send from one rank to its
neighbour with the neighbour's ``n``-th receive from it. A transfer
therefore sits at its sender's call and at its receiver's, and the
program order must hold both: :func:`merge_exchanges` orders the ranks'
tasks so that each call's transfers come right after the task before it
on both ranks, and before either rank's next task.
"""
from __future__ import annotations

import heapq
from typing import Callable, Dict, List, Sequence, Tuple

from ..errors import ConfigError

Task = Tuple[str, int, int]
#: a call: how many of the rank's tasks come before it, and the tasks
#: whose outputs it sends (forward activations, backward input gradients)
#: with how many forward inputs and backward gradients it receives
Call = Tuple[int, List[Task], int, int]


def megatron_calls(pp: int, v: int, rank: int, tasks: Sequence[Task]) -> List[Call]:
    """Rank ``rank``'s calls over its interleaved task order ``tasks``
    (:func:`~.pipeline.interleaved`): ``(position, sent, receives forward,
    receives backward)`` with Megatron-LM's flags (module docstring)."""
    total = sum(1 for t in tasks if t[0] == "F")
    warmup = 0
    while warmup < len(tasks) and tasks[warmup][0] == "F":
        warmup += 1
    if warmup < total:          # the first steady forward runs before its backward
        warmup -= 1
    steady = total - warmup
    first, last = rank == 0, rank == pp - 1

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * v)) // pp
        return c if forward else v - 1 - c

    def forward(k: int) -> Task:
        return tasks[k] if k < warmup else tasks[warmup + 2 * (k - warmup)]

    def backward(k: int) -> Task:
        return tasks[warmup + 2 * k + 1] if k < steady else tasks[warmup + steady + k]

    def sends_f(k: int) -> List[Task]:
        return [] if last and chunk(k, True) == v - 1 else [forward(k)]

    def sends_b(k: int) -> List[Task]:
        return [] if first and chunk(k, False) == 0 else [backward(k)]

    calls: List[Call] = [(0, [], int(not first), 0)]
    for k in range(warmup):
        recv_prev = not (first and chunk(k + 1, True) == 0) and k != total - 1
        recv_next = k == warmup - 1 and not last
        calls.append((k + 1, sends_f(k), int(recv_prev), int(recv_next)))
    for k in range(steady):
        fk = warmup + k
        if first:
            recv_prev = chunk(fk - (pp - 1), True) != v - 1
        else:
            recv_prev = True
        recv_prev = recv_prev and k != steady - 1
        recv_next = not last or chunk(k - (pp - 1), False) != 0
        calls.append((warmup + 2 * k + 2, sends_f(fk) + sends_b(k), int(recv_prev),
                      int(recv_next)))
    for k in range(steady, total):
        recv_next = not (last and chunk(k + 1, False) == v - 1) and k != total - 1
        calls.append((warmup + steady + k + 1, sends_b(k), 0, int(recv_next)))
    return calls


def transfer_calls(pp: int, v: int, per_rank: List[List[Task]]
                   ) -> Tuple[List[List[Call]], Dict[Task, Tuple[int, int]]]:
    """Every rank's calls and, for each transfer (by its sending task), the
    receiver's ``(rank, call index)``: the ``n``-th send from a rank to a
    neighbour is the neighbour's ``n``-th receive from it (NCCL's order)."""
    calls = [megatron_calls(pp, v, r, tasks) for r, tasks in enumerate(per_rank)]
    received: Dict[Task, Tuple[int, int]] = {}
    for r in range(pp):
        for kind, dst, flag in (("F", (r + 1) % pp, 2), ("B", (r - 1) % pp, 3)):
            sent = [t for call in calls[r] for t in call[1] if t[0] == kind]
            recvs = [i for i, call in enumerate(calls[dst]) for _ in range(call[flag])]
            if len(sent) != len(recvs):
                raise ConfigError(f"interleaved schedule: rank {r} sends {len(sent)} "
                                  f"{kind} tensors, rank {dst} receives {len(recvs)}")
            for t, i in zip(sent, recvs):
                received[t] = (dst, i)
    return calls, received


def merge_exchanges(per_rank: List[List[Task]], calls: List[List[Call]],
                    received: Dict[Task, Tuple[int, int]],
                    cost: Callable[[Task], float]
                    ) -> Tuple[List[Tuple[int, Task, float, float]], List[Tuple[Task, ...]]]:
    """One global order of the ranks' tasks (``(rank, task, estimated
    start, estimated end)``, list scheduling as
    :func:`~.pipeline.merge_tasks`) in which a rank's call waits for every
    transfer in it, a transfer being placed once both its sender and its
    receiver have reached their calls; and, per position of the order
    (one more at the end), the tasks whose outputs are sent just before
    it. A task Megatron sends nothing for is flushed right after it (it
    has nothing to send)."""
    pp = len(per_rank)
    pos, free, nxt = [0] * pp, [0.0] * pp, [0] * pp
    sender: Dict[Task, Tuple[int, int]] = {}
    members: Dict[Tuple[int, int], List[Task]] = {}
    for r in range(pp):
        for i, (_, sent, _, _) in enumerate(calls[r]):
            members.setdefault((r, i), []).extend(sent)
            for t in sent:
                sender[t] = (r, i)
                members.setdefault(received[t], []).append(t)
    # per transfer: when its first end arrived (absent: not yet; placed: popped)
    first_at: Dict[Task, float] = {}
    # per call: its transfers not placed yet, and when the last one was
    unplaced = {key: len(ts) for key, ts in members.items()}
    ready_at: Dict[Tuple[int, int], float] = {}
    entered = set()
    done: Dict[Task, float] = {}
    order: List[Tuple[int, Task, float, float]] = []
    sends: List[List[Task]] = [[]]
    heap: List[Tuple[float, int]] = []
    woken: List[int] = list(range(pp))

    def arrive(r: int) -> None:
        """Rank ``r`` goes through its calls at its position, as far as
        their partners let it, then offers its next task."""
        while nxt[r] < len(calls[r]) and calls[r][nxt[r]][0] == pos[r]:
            key = (r, nxt[r])
            if key not in entered:
                entered.add(key)
                for t in members.get(key, ()):
                    if t not in first_at:
                        first_at[t] = free[r]
                        continue
                    sends[-1].append(t)          # both ends are there: placed here
                    at = max(first_at[t], free[r])
                    for end in (sender[t], received[t]):
                        unplaced[end] -= 1
                        ready_at[end] = max(ready_at.get(end, 0.0), at)
                        if not unplaced[end] and end[0] != r:
                            woken.append(end[0])
            if unplaced.get(key, 0):
                return                          # waits for its partners
            free[r] = max(free[r], ready_at.get(key, 0.0))
            nxt[r] += 1
        if pos[r] < len(per_rank[r]):
            task = per_rank[r][pos[r]]
            start = free[r]
            if task[0] == "B":                  # after its own forward (same rank)
                start = max(start, done[("F", task[1], task[2])])
            heapq.heappush(heap, (start, r))

    while woken or heap:
        while woken:
            arrive(woken.pop(0))
        if not heap:
            break
        start, r = heapq.heappop(heap)
        task = per_rank[r][pos[r]]
        pos[r] += 1
        free[r] = done[task] = end = start + cost(task)
        order.append((r, task, start, end))
        sends.append([])
        if task not in sender:
            sends[-1].append(task)
        woken.append(r)
    if any(pos[r] < len(ts) for r, ts in enumerate(per_rank)):
        raise ConfigError("interleaved schedule: the ranks' exchanges deadlock")
    return order, [tuple(s) for s in sends]
