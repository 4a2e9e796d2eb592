"""The host's launch queue: kernels start no earlier than the host issued them.

The ``launch`` setting says how the host issues them:

* ``async`` (CUDA's default): kernel launches return at once, and the
  host runs ahead of the device (below).
* ``blocking``: every launch returns only when its kernel has finished,
  as under ``CUDA_LAUNCH_BLOCKING=1`` (CUDA C++ Programming Guide,
  *Asynchronous Concurrent Execution*, "Concurrent Execution between
  Host and Device": setting it "globally disable[s] asynchronicity of
  kernel launches"). See *Blocking launches* below.

**Async.** A device's host issues its compute kernels in program order, one every
``H = host_launch_s`` from time 0 (the j-th is issued at ``j H``), and
runs ahead of the device: a kernel waits for its launch only when the
device gets to it first. Behind a long kernel the host's launches are
hidden; behind kernels shorter than H the device waits for the host,
and the overhead shows (as in PyTorch's eager mode). ``H = 0`` (the
default) issues every kernel at once and adds nothing.

The simulator's compute streams keep their ops' times as prefix sums ``P``
of their durations from each block's start ``s``. With the queue, op ``i``
of a block beginning at position ``b`` ends at

    end_i = P[i+1] + max(s - P[b], lead[i]),
    lead[i] = max over ops j <= i of  c_j H + a_j - P[j]

where ``c_j`` counts the kernels before op j on the stream and ``a_j`` is
op j's own lead (:meth:`~distsim.cost.model.CostModel.host_lead`: H for one
kernel; a fused segment's lag over its kernels). The maximum may run over
the whole stream, not only the block: an earlier op's launch bound is
already met by the ops that ran after it, so it never binds later. An
op's first kernel starts at ``P[i] + max(s - P[b], lead[i-1], (c_i + 1) H
- P[i])``.

**Blocking launches.** The host issues one launch, waits for it to finish,
then issues the next, in the program's order on the device: a compute
op's kernels, a collective, or a group of consecutive point-to-point
transfers (a SendRecv run with nothing between them on the device is one
launch, as NCCL fuses the sends and receives of one ``ncclGroupStart`` /
``ncclGroupEnd`` into one kernel, which is how Megatron-LM's
``batch_isend_irecv`` issues a pipeline's transfers). So

* the device's streams never overlap each other: a collective starts no
  earlier than the compute op before it ended (and than every member
  reached it, as always), and the compute op after it starts no earlier
  than the collective ended, whether or not it reads its result;
* each launch pays the host's ``H`` in series: an op of ``k`` kernels takes
  ``k H`` longer (its first kernel starts H after the previous launch
  ended) and a communication launch reaches its collective H after the
  previous launch ended.

**Stream order.** When the host issues a collective, PyTorch's
ProcessGroupNCCL makes the NCCL stream wait on an event recorded on the
current (compute) stream (``syncStreams``, for collectives and
point-to-point transfers alike): the collective's kernel starts only once
every compute kernel issued before it on the device has finished, not
merely its inputs' producers. The ``comm_order`` setting says whether
the simulator holds collectives to that:

* ``inputs``: a communication op starts when its queue is
  free, its inputs are ready and every member has reached it; it may
  overlap compute ops issued before it in program order.
* ``stream`` (the default): besides, no earlier than the end of the compute op issued
  last before it on its device (each rank's own). Compute ops after it
  still wait only for what they read, as PyTorch's do (the collective's
  ``work.wait()`` joins the streams where its result is used). Where a
  framework overlaps a collective with compute, it is the compute issued
  *after* it: so Megatron-LM issues its tensor-parallel all-reduce before
  the weight-gradient GEMM (``tp_overlap``,
  :mod:`distsim.transforms.tp_order`). Blocking launches imply it.

A pipeline transfer is a team of its sender and its receiver, so it waits
for the compute both issued before it. That is what the pipeline engines
do: Megatron-LM's 1F1B and PyTorch's ``Schedule1F1B`` post a stage's
receive with its sends (one ``batch_isend_irecv``) right after the stage's
previous task, so a receiver still running its previous task holds the
transfer up (``tests/sim/test_pipeline_transfers.py``).

The fast estimator (:mod:`distsim.estimate`) models both orders.

**Pipeline transfers.** The ``p2p`` setting says how the training engine
issues its point-to-point transfers (SendRecv), as each engine's code does:

* ``async`` (the default): consecutive transfers of a device are one group,
  issued at once (one ``batch_isend_irecv``, one NCCL group: one launch
  under blocking launches, the two ways of a pair side by side), and the
  host goes on: compute issued after a send runs while the send is in
  flight; a compute op waits only for the receives it reads. Megatron-core
  with ``overlap_p2p_comm`` (``pipeline_parallel/p2p_communication.py``:
  ``_communicate(wait_on_reqs=False)`` issues each transfer with
  ``_p2p_ops``, a send to one neighbour beside a receive from the other,
  keeps the requests to wait on where the received tensor is used, and
  does not synchronise).
* ``synchronous``: grouped as ``async``, but after each group the host
  waits for it: what the device issues next (its next compute op, and any
  collective or transfer after the group) starts no earlier than the end
  of every transfer of the group, sends included. Megatron-LM's
  ``p2p_communication._communicate`` of 2021-2022 calls ``req.wait()`` on each request of its
  ``batch_isend_irecv`` and then ``torch.cuda.synchronize()`` ("To protect
  against race condition when using batch_isend_irecv()"), as does
  Megatron-core with ``batch_p2p_comm`` and ``batch_p2p_sync`` (its
  defaults).
* ``separate``: every transfer is its own call, as DeepSpeed's pipeline
  engine issues them (``runtime/pipe/p2p.py``: ``send`` and ``recv`` call
  ``dist.send`` / ``dist.recv`` one at a time, in the order of its
  ``TrainSchedule``), each a group of its own: one launch each under
  blocking launches, and, since ``dist.send`` / ``dist.recv`` wait for
  their work (``work.wait()`` makes the compute stream wait for the NCCL
  stream, and ProcessGroupNCCL makes the next call's stream wait for the
  compute stream), what the device issues after one waits for it, as
  under ``synchronous``: a device's transfers run one after another, the
  two ways of a 1F1B exchange too.

The wait is the device's: the host's launch queue (``host_launch_s``) is
not restarted after it, so a synchronised group does not add the host's
launch time of the next kernel (0 by default).

The simulator keeps its streams and queues; this module adds the order as
dependencies on *launch tokens*, numbers past the program's values whose
ready time is a launch's end (:func:`serialise_launches`, which also
adds stream order alone, the compute ops' tokens only): a collective's
token is ready when it ends, a compute op's when it ends; each
communication op reads the token(s) of the launch before it on its rank,
and a compute op after a communication launch starts a block that reads
its token(s); under ``p2p: synchronous`` or ``separate`` the transfers
have tokens too, and every op issued after a group of them reads theirs. ``H`` is
added to the compute ops' durations (:func:`blocking_durations`) and to
the communication ops' arrivals.
"""
from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..cost.model import CostModel
from ..ir.comm import is_point_to_point
from ..run_options import check_choice

#: the ``launch`` settings (see the module docstring)
LAUNCH_MODES: Tuple[str, ...] = ("async", "blocking")
DEFAULT_LAUNCH = "async"
#: the ``comm_order`` settings (module docstring, *Stream order*)
COMM_ORDERS: Tuple[str, ...] = ("inputs", "stream")
DEFAULT_COMM_ORDER = "stream"
#: the ``p2p`` settings (module docstring, *Pipeline transfers*)
P2P_MODES: Tuple[str, ...] = ("async", "synchronous", "separate")
DEFAULT_P2P = "async"


def check_launch(value: Any) -> str:
    """``launch`` (``--launch``): one of :data:`LAUNCH_MODES`."""
    return check_choice("--launch", value, LAUNCH_MODES)


def check_comm_order(value: Any) -> str:
    """``comm_order`` (``--comm-order``): one of :data:`COMM_ORDERS`."""
    return check_choice("--comm-order", value, COMM_ORDERS)


def check_p2p(value: Any) -> str:
    """``p2p`` (``--p2p``): one of :data:`P2P_MODES`."""
    return check_choice("--p2p", value, P2P_MODES)

#: (lead per op, first-launch bound per op), both as lists of floats
Leads = Tuple[List[float], List[float]]


def stream_leads(ops: list, stream_ops: List[int], prefix: List[float],
                 cost: CostModel) -> Optional[Leads]:
    """``(lead, first)`` of one compute stream (module docstring), or None
    when the device issues its kernels at once (``host_launch_s`` 0).
    ``ops``: the program's compute Op objects; ``stream_ops`` the stream's
    indices into them; ``prefix`` its durations' prefix sums."""
    h = cost.device.host_launch_s
    if h <= 0 or not stream_ops:
        return None
    n = len(stream_ops)
    kernels = np.empty(n, np.int64)
    own = np.empty(n)
    for q, k in enumerate(stream_ops):
        kernels[q], own[q] = cost.host_lead(ops[k])
    before = np.concatenate(([0], np.cumsum(kernels)[:-1]))
    p = np.asarray(prefix[:-1], dtype=float)
    with np.errstate(invalid="ignore"):
        lead = np.maximum.accumulate(before * h + own - p)
    first = np.where(kernels > 0, (before + 1) * h - p, -np.inf)
    return lead.tolist(), first.tolist()


def leads_by_rank(ix, prefixes: Dict[int, List[float]], cost: CostModel
                  ) -> Dict[int, Optional[Leads]]:
    """:func:`stream_leads` of every simulated compute stream of ``ix``."""
    return {rank: stream_leads(ix.compute, stream.ops, prefixes[rank], cost)
            for rank, stream in ix.compute_streams.items()}


def op_times(prefix: np.ndarray, base: np.ndarray, s0: np.ndarray,
             leads: Optional[Leads], waits: Optional[np.ndarray] = None
             ) -> Tuple[np.ndarray, np.ndarray]:
    """(start, end) of each op of a stream: ``s0`` and ``base`` are its
    block's start and first prefix, per op; ``waits``, under blocking
    launches, the host's launch time in front of each op's first kernel
    (:func:`blocking_durations`, whose durations ``prefix`` sums)."""
    if leads is None:
        start = s0 + (prefix[:-1] - base)
        return (start if waits is None else start + waits), s0 + (prefix[1:] - base)
    lead = np.asarray(leads[0])
    off = s0 - base
    end = prefix[1:] + np.maximum(off, lead)
    earlier = np.concatenate(([-np.inf], lead[:-1]))
    start = prefix[:-1] + np.maximum(np.maximum(off, earlier), np.asarray(leads[1]))
    return start, end


def blocking_durations(ops: list, stream_ops: List[int], durations: List[float],
                       cost: CostModel) -> Tuple[List[float], Optional[np.ndarray]]:
    """A compute stream's durations under blocking launches, each op's
    ``k H`` of host launches added (module docstring), and the host's time
    in front of each op's first kernel (H, or 0 for an op that launches
    nothing); the durations as given and None when ``H`` is 0."""
    h = cost.device.host_launch_s
    if h <= 0 or not stream_ops:
        return durations, None
    kernels = np.fromiter((cost.host_lead(ops[k])[0] for k in stream_ops), np.int64,
                          len(stream_ops))
    return (np.asarray(durations) + kernels * h).tolist(), np.where(kernels > 0, h, 0.0)


def serialise_launches(ix, cost: CostModel, blocking: bool = True, stream: bool = True,
                       p2p: str = DEFAULT_P2P
                       ) -> Tuple[int, int, Dict[int, Optional[np.ndarray]]]:
    """Order every simulated rank's launches of ``ix`` (a
    :class:`~.program_index.ProgramIndex`) with launch tokens added to its
    compute streams' blocks and exports and to its ranks' ``comm_inputs``.

    ``blocking``: one after another (module docstring, *Blocking launches*),
    the host's launches added to the compute streams' durations
    (:func:`blocking_durations`). Otherwise, with ``stream``, *stream order*
    (module docstring): each communication op reads the end of the compute
    op issued last before it on its rank. ``p2p`` (module docstring,
    *Pipeline transfers*): ``separate`` makes each transfer a group of its
    own; ``synchronous`` and ``separate`` make every op issued after a
    group read the tokens of its transfers. Returns the number of the first token
    (collective ``c``'s is that plus ``c`` under ``blocking`` or a ``p2p``
    that waits; the compute ops' come after the collectives'), one past the
    last, and each compute stream's waits (None everywhere without
    ``blocking``)."""
    waits: Dict[int, Optional[np.ndarray]] = {}
    for rank, compute in ix.compute_streams.items():
        if blocking:
            compute.durations, waits[rank] = blocking_durations(ix.compute, compute.ops,
                                                                compute.durations, cost)
        else:
            waits[rank] = None
    first = len(ix.values)
    joins = p2p != "async"                  # compute waits for the transfers before it
    grouping = p2p != "separate"            # consecutive transfers are one launch
    p2p_kind = np.fromiter(map(is_point_to_point, ix.collective_kinds), bool,
                           len(ix.collective_kinds))
    p2p_of = p2p_kind[ix.collective_kind].tolist() if len(ix.collective_kind) else []
    ordered = blocking or stream
    tokens = iter(range(first + (len(ix.collectives) if blocking or joins else 0), 1 << 62))
    for rank, colls in ix.comm_streams.items():
        compute = ix.compute_streams.get(rank)
        ops = np.asarray(compute.ops if compute is not None else [], np.int64)
        cs = np.asarray(colls, np.int64)
        pos = np.concatenate([ix.compute_position[ops], ix.collective_position[cs]])
        order = np.argsort(pos, kind="stable")
        item = np.concatenate([np.arange(len(ops)), cs])[order].tolist()
        comm = np.concatenate([np.zeros(len(ops), bool), np.ones(len(cs), bool)])[order]
        near = np.flatnonzero(comm | np.r_[False, comm[:-1]]).tolist()
        comm = comm.tolist()
        inputs = ix.comm_inputs[rank]
        reads: Dict[int, Tuple[int, ...]] = {}
        exports: List[Tuple[int, int]] = []
        k = -1                      # position in the rank's comm stream
        unit: List[int] = []        # blocking: the tokens of the last communication launch
        grouped = False             # the last launch is a group of point-to-point transfers
        run: List[int] = []         # the tokens of the transfers of the group being issued
        synced: Tuple[int, ...] = ()    # ... of the last group the host waited for
        before: Tuple[int, ...] = ()
        for i in near:
            x = item[i]
            if not comm[i]:         # a compute op after a communication launch
                if run:             # after a group of transfers: it waits for them
                    synced, run = tuple(run), []
                if blocking:
                    reads[x] = tuple(unit)
                elif synced:
                    reads[x] = synced
                continue
            k += 1
            if i and not comm[i - 1]:   # after a compute op: its end
                if ordered:
                    exports.append((item[i - 1], next(tokens)))
                    before, unit, grouped = (exports[-1][1],), [], p2p_of[x]
            elif blocking and not (grouped and grouping and p2p_of[x]):
                # after a communication launch
                before, unit, grouped = tuple(unit), [], p2p_of[x]
            if blocking:
                unit.append(first + x)
            if joins:
                if run and not (grouping and p2p_of[x]):    # the group before it ended
                    synced, run = tuple(run), []
                if p2p_of[x]:
                    run.append(first + x)
                if synced:
                    inputs[k] = inputs[k] + synced
            if before:
                inputs[k] = inputs[k] + before
        if compute is not None:
            starts = dict(compute.block_starts)
            for q, toks in reads.items():
                starts[q] = starts.get(q, ()) + toks
            compute.block_starts = sorted(starts.items())
            compute.exports = sorted(chain(compute.exports, exports), key=itemgetter(0))
    return first, next(tokens), waits
