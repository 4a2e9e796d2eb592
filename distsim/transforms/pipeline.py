"""Pipeline parallelism: stage partitioning and schedules.

Layers are split into ``pp * v`` chunks (``v`` virtual stages per pipeline
rank, 1 except for the interleaved schedule); chunk ``c`` runs on pipeline
rank ``c % pp``. The embedding goes with the first chunk, the final norm,
output layer and loss with the last. :func:`partition_layers` splits the
layers evenly; :func:`partition_balanced` minimises the most expensive
chunk given each layer's cost (the embedding's counted in the first chunk,
the head's in the last), as Narayanan et al. balance uneven stages.

A schedule is, for each pipeline rank, the order of its tasks ``(kind,
microbatch, chunk)`` with kind ``F`` (forward), ``B`` (backward, with its
recomputation) or ``W`` (the weight-gradient part of a backward, for the
schedules in :data:`SPLIT_BACKWARD`, whose ``B`` then holds only the
input-gradient part): the program order of that rank's compute stream.

- ``gpipe``: every forward, then every backward;
- ``1f1b`` (PipeDream-flush): ``pp - rank - 1`` warm-up forwards, then one
  forward / one backward, then the remaining backwards;
- ``interleaved`` (Megatron-LM's interleaved 1F1B): as 1F1B over ``v``
  chunks per rank, micro-batches in groups of ``pp``;
- ``zb-h1`` (Qi et al., "Zero Bubble Pipeline Parallelism", ZB-H1): the
  backward split into ``B`` (input gradients, what the previous stage
  waits for) and ``W`` (weight gradients); 1F1B's warm-up forwards, then
  forward / input-backward pairs, rank ``r`` running the weight-gradient
  part of micro-batch ``k - r`` after the input-backward of ``k``, the
  rest at the end. At most ``pp`` micro-batches are in flight (forward
  run, weight gradients not yet) on any rank: 1F1B's peak, that of its
  first rank.

With equal stages and no communication the idle fraction of a step is
``(pp - 1) / (m + pp - 1)`` for GPipe and 1F1B (``m`` micro-batches), and
the bubble (``(pp - 1)`` stage-times of forward + backward, ``T_F + T_B +
T_W``) shrinks by ``v`` with interleaving. ZB-H1 cuts it to ``(pp - 1)
(T_F + T_B - T_W)`` when ``T_W <= T_F`` (the weight gradients fill the
rest).
"""
from __future__ import annotations

import heapq
from itertools import accumulate
from typing import Any, Callable, Dict, List, Sequence, Tuple

from ..errors import ConfigError
from .pipeline_exchanges import merge_exchanges, transfer_calls

Task = Tuple[str, int, int]  # (kind "F"/"B"/"W", microbatch, global chunk id)


def partition_layers(layers: int, chunks: int) -> List[Tuple[int, int]]:
    """Even split of ``layers`` into ``chunks`` contiguous ranges
    ``[start, end)``; the first ``layers % chunks`` ranges get one more."""
    if chunks > layers:
        raise ConfigError(f"{chunks} pipeline stages (pp x virtual stages) but only "
                          f"{layers} layers")
    base, extra = divmod(layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        end = start + base + (1 if c < extra else 0)
        out.append((start, end))
        start = end
    return out


def partition_balanced(layer_costs: Sequence[float], chunks: int, first: float = 0.0,
                       last: float = 0.0) -> List[Tuple[int, int]]:
    """Contiguous ranges ``[start, end)`` of the layers, one per chunk,
    each with at least one layer, minimising the largest chunk cost, where
    a chunk costs the sum of its layers' ``layer_costs`` plus ``first``
    (the embedding) for chunk 0 and ``last`` (the final norm, output layer
    and loss) for the last chunk.

    Exact dynamic programme over the prefix sums: ``best[k][j]`` is the
    smallest achievable maximum for the first ``j`` layers in ``k``
    chunks; the split point is found by bisection (``best[k-1][i]`` grows
    with ``i`` while the last chunk's cost shrinks), so it costs
    O(chunks x layers x log layers); ties between the two candidate split
    points go to the earlier one (deterministic)."""
    n = len(layer_costs)
    if chunks > n:
        raise ConfigError(f"{chunks} pipeline stages (pp x virtual stages) but only "
                          f"{n} layers")
    costs = [float(c) for c in layer_costs]
    if any(c < 0 or c != c for c in costs + [first, last]):
        raise ConfigError("partition: layer costs must be non-negative numbers")
    prefix = [0.0] + list(accumulate(costs))
    inf = float("inf")
    # best[k][j]: k chunks over the first j layers (chunk 0 carries `first`)
    best = [[inf] * (n + 1) for _ in range(chunks + 1)]
    split = [[0] * (n + 1) for _ in range(chunks + 1)]
    for j in range(1, n + 1):
        best[1][j] = first + prefix[j]
    for k in range(2, chunks + 1):
        for j in range(k, n + 1):
            extra = last if (k == chunks and j == n) else 0.0
            # i in [k-1, j-1]: the last chunk is layers [i, j)
            lo, hi = k - 1, j - 1

            def tail(i: int) -> float:
                return prefix[j] - prefix[i] + extra
            # best[k-1][i] grows with i and tail(i) shrinks: bisect for the
            # first i where best[k-1][i] >= tail(i); the optimum is it or i - 1
            a, b = lo, hi + 1
            while a < b:
                mid = (a + b) // 2
                if best[k - 1][mid] >= tail(mid):
                    b = mid
                else:
                    a = mid + 1
            options = [i for i in (a - 1, a) if lo <= i <= hi]
            i_best = min(options, key=lambda i: (max(best[k - 1][i], tail(i)), i))
            best[k][j] = max(best[k - 1][i_best], tail(i_best))
            split[k][j] = i_best
    if chunks == 1:
        return [(0, n)]
    bounds, j = [n], n
    for k in range(chunks, 1, -1):
        j = split[k][j]
        bounds.append(j)
    bounds.append(0)
    bounds.reverse()
    return [(bounds[c], bounds[c + 1]) for c in range(chunks)]


def chunk_of_layer(layer: int, ranges: Sequence[Tuple[int, int]]) -> int:
    if layer < ranges[0][0]:
        return 0
    for c, (start, end) in enumerate(ranges):
        if start <= layer < end:
            return c
    return len(ranges) - 1


def check_schedule(schedule: str, pp: int, microbatches: int, v: int) -> None:
    if schedule in SPLIT_BACKWARD and v > 1:
        raise ConfigError(f"--schedule {schedule}: one model chunk per pipeline rank only "
                          f"(not {v} virtual stages)")
    if schedule == "interleaved" and microbatches % pp:
        raise ConfigError(f"--schedule interleaved: the {microbatches} micro-batches are not a "
                          f"multiple of the {pp} pipeline stages")
    if schedule not in SCHEDULES:
        raise ConfigError(f"--schedule: unknown schedule {schedule!r} "
                          f"(known: {', '.join(SCHEDULES)})")


def gpipe(pp: int, m: int, v: int, rank: int) -> List[Task]:
    return [("F", i, rank) for i in range(m)] + [("B", i, rank) for i in range(m)]


def one_f_one_b(pp: int, m: int, v: int, rank: int) -> List[Task]:
    warmup = min(pp - rank - 1, m)
    tasks: List[Task] = [("F", i, rank) for i in range(warmup)]
    for i in range(m - warmup):
        tasks.append(("F", warmup + i, rank))
        tasks.append(("B", i, rank))
    tasks += [("B", i, rank) for i in range(m - warmup, m)]
    return tasks


def interleaved(pp: int, m: int, v: int, rank: int) -> List[Task]:
    total = m * v
    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)

    def task(kind: str, k: int) -> Task:
        group = k % (pp * v)
        local_chunk = group // pp
        if kind == "B":
            local_chunk = v - 1 - local_chunk
        microbatch = (k // (pp * v)) * pp + k % pp
        return (kind, microbatch, local_chunk * pp + rank)

    tasks = [task("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        tasks.append(task("F", warmup + i))
        tasks.append(task("B", i))
    tasks += [task("B", k) for k in range(total - warmup, total)]
    return tasks


def zb_h1(pp: int, m: int, v: int, rank: int) -> List[Task]:
    """ZB-H1: 1F1B's warm-up forwards, then forward / input-backward pairs,
    the weight gradients of micro-batch ``k - rank`` after the
    input-backward of ``k`` (rank 0 runs each right after its
    input-backward, the last rank defers the most), the rest at the end."""
    warmup = min(pp - rank - 1, m)
    tasks: List[Task] = [("F", i, rank) for i in range(warmup)]
    weights = 0
    for k in range(m):
        if warmup + k < m:
            tasks.append(("F", warmup + k, rank))
        tasks.append(("B", k, rank))
        if k >= rank:
            tasks.append(("W", k - rank, rank))
            weights += 1
    tasks += [("W", i, rank) for i in range(weights, m)]
    return tasks


SCHEDULES: Dict[str, Callable[[int, int, int, int], List[Task]]] = {
    "gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1}

#: The schedules whose backward is split into input-gradient (``B``) and
#: weight-gradient (``W``) tasks.
SPLIT_BACKWARD = frozenset({"zb-h1"})


def schedule_tasks(schedule: str, pp: int, m: int, v: int) -> List[List[Task]]:
    """Each pipeline rank's task order."""
    check_schedule(schedule, pp, m, v)
    return [SCHEDULES[schedule](pp, m, v, r) for r in range(pp)]


def task_dependencies(kind: str, mb: int, c: int, chunks: int) -> List[Tuple[str, int, int]]:
    """The tasks a pipeline task waits for: a forward the previous chunk's
    forward of its micro-batch; a backward its own forward and the next
    chunk's backward; a weight-gradient task its own input-backward."""
    deps: List[Tuple[str, int, int]] = []
    if kind == "F" and c > 0:
        deps.append(("F", mb, c - 1))
    if kind == "W":
        deps.append(("B", mb, c))
    if kind == "B":
        deps.append(("F", mb, c))
        if c < chunks - 1:
            deps.append(("B", mb, c + 1))
    return deps


def merge_tasks(per_rank: List[List[Task]], chunks: int,
                cost: Callable[[Task], float] = lambda t: 2.0 if t[0] == "B" else 1.0
                ) -> List[Tuple[int, Task, float, float]]:
    """One global order of every rank's tasks that respects each rank's
    order and the data dependencies (F of chunk c after F of chunk c-1, B
    of chunk c after B of chunk c+1, W after the B of its micro-batch and
    chunk), by list scheduling on estimated task
    costs, so that the program order is close to the order in time: the
    rank whose next task can start earliest goes next, ties to the lowest
    rank. Returns ``(rank, task, estimated start, estimated end)``.

    A rank's next task has a fixed earliest start once its dependencies
    are done (it changes only when the rank runs it), so the ranks ready
    to go wait in a heap and a rank waiting for a dependency is offered
    again when that task is done: O(tasks log ranks), not a scan of every
    rank per task (a 16-stage pipeline of 192 micro-batches has 6144)."""
    pos = [0] * len(per_rank)
    free = [0.0] * len(per_rank)
    done: Dict[Task, float] = {}
    waiting: Dict[Task, List[int]] = {}
    heap: List[Tuple[float, int]] = []
    out: List[Tuple[int, Task, float, float]] = []
    finished, push, pop = done.get, heapq.heappush, heapq.heappop
    last_chunk = chunks - 1

    def offer(r: int) -> None:
        # task_dependencies, inlined (a sweep merges millions of tasks): a
        # rank waits on the first of them not done yet
        tasks, i = per_rank[r], pos[r]
        if i == len(tasks):
            return
        kind, mb, c = tasks[i]
        start = free[r]
        if kind != "B":
            # a forward waits for the previous chunk's, a W for its own B
            if c > 0 or kind == "W":
                d = ("F", mb, c - 1) if kind == "F" else ("B", mb, c)
                end = finished(d)
                if end is None:
                    waiting.setdefault(d, []).append(r)
                    return
                if end > start:
                    start = end
        else:
            d = ("F", mb, c)
            end = finished(d)
            if end is None:
                waiting.setdefault(d, []).append(r)
                return
            if end > start:
                start = end
            if c < last_chunk:
                d = ("B", mb, c + 1)
                end = finished(d)
                if end is None:
                    waiting.setdefault(d, []).append(r)
                    return
                if end > start:
                    start = end
        push(heap, (start, r))

    for r in range(len(per_rank)):
        offer(r)
    while heap:
        start, r = pop(heap)
        task = per_rank[r][pos[r]]
        pos[r] += 1
        free[r] = done[task] = end = start + cost(task)
        out.append((r, task, start, end))
        offer(r)
        for w in waiting.pop(task, ()):
            offer(w)
    if any(pos[r] < len(tasks) for r, tasks in enumerate(per_rank)):
        raise ConfigError("pipeline schedule deadlocks (a task waits for one that never runs)")
    return out


#: a program order: ``(rank, task, estimated start, estimated end)`` per
#: task, and per position (one more at the end) the tasks whose outputs are
#: sent just before the task there
Program = Tuple[List[Tuple[int, Task, float, float]], List[Tuple[Task, ...]]]


def program_order(schedule: str, pp: int, m: int, v: int,
                  cost: Callable[[Task], float]) -> Program:
    """The program order of a schedule's tasks and of the sends of their
    outputs, which the lowering emits and the fast tier walks.

    The interleaved schedule places its transfers where Megatron-LM's
    interleaved schedule issues them, grouped as it groups them
    (:mod:`.pipeline_exchanges`). The others list-schedule the tasks
    (:func:`merge_tasks`) and send a finished task's outputs once the
    schedule's clock (the estimated start of the task being emitted)
    passes the task's estimated end (:class:`PendingSends`)."""
    per_rank = schedule_tasks(schedule, pp, m, v)
    if schedule == "interleaved":
        calls, received = transfer_calls(pp, v, per_rank)
        return merge_exchanges(per_rank, calls, received, cost)
    order = merge_tasks(per_rank, pp * v, cost)
    pending = PendingSends()
    sends: List[Tuple[Task, ...]] = []
    for _, task, start, end in order:
        sends.append(tuple(pending.due(start)))
        pending.add(end, task)
    sends.append(tuple(pending.rest()))
    return order, sends


class PendingSends:
    """The tasks whose outputs wait to be sent to the next pipeline stage,
    in the program order of :func:`merge_tasks`: a finished task's sends
    are emitted once the schedule's clock (the estimated start of the task
    being emitted) passes the task's estimated end, in the order of those
    ends, ties in the order the tasks were emitted (each communication
    queue takes its ops in program order)."""

    __slots__ = ("heap", "count")

    def __init__(self) -> None:
        self.heap: List[Tuple[float, int, Any]] = []
        self.count = 0

    def add(self, end: float, task: Any) -> None:
        """``task`` (whatever the caller sends by) was emitted, estimated to end at ``end``."""
        self.count += 1
        heapq.heappush(self.heap, (end, self.count, task))

    def due(self, clock: float) -> Sequence[Any]:
        """The tasks whose sends are due at ``clock``, in order (taken out;
        most calls find none: an empty tuple then, nothing made)."""
        heap = self.heap
        if not heap or heap[0][0] > clock:
            return ()
        out = []
        while heap and heap[0][0] <= clock:
            out.append(heapq.heappop(heap)[2])
        return out

    def rest(self) -> Sequence[Any]:
        """Every task still waiting, in order (at the end of the program)."""
        return self.due(float("inf"))
