"""The op records of a run as columns (:class:`~.trace.OpColumns`), made
with numpy from what the simulator already holds.

A large run has hundreds of thousands of op records; making one tuple per
record, reading every op's name and detail from its Op object and sorting
them all would take a good part of a run's time, although most callers
only ask for the summary. Here the numeric fields become arrays (the compute
ops' times, ranks, flops and bytes are arrays already; a collective's
members, times and bytes are repeated with ``np.repeat``), and names, op
types and details stay behind a label number: label ``k`` is compute op
``k`` of the program index, label ``n_compute + j`` the ``j``-th collective
to finish. They are read from the Op objects only when the records are made
(``Trace.ops``). The records' order, (start, rank, stream, end), is the
columns' ``time_ordered`` rule, sorted when asked for.
"""
from __future__ import annotations

from itertools import chain
from operator import attrgetter, methodcaller
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..ir.core import Op
from ..ir.ops_fused import FUSED
from .comm_queues import DEFAULT_COMM_STREAMS, record_stream
from .program_columns import spans
from .program_index import _FIRST, _META, _NAME, _OP_TYPE, _OUTPUTS, ProgramIndex
from .trace import COMM_STREAM, COMPUTE_STREAM, P2P_STREAM, Labels, OpColumns, OpLabels

__all__ = ["CATEGORIES", "STREAMS", "expand_to_followers", "op_columns"]

#: stream codes: sorted names, so that codes sort as the names do
STREAMS: Tuple[str, ...] = tuple(sorted((COMM_STREAM, COMPUTE_STREAM, P2P_STREAM)))
#: category codes
CATEGORIES: Tuple[str, ...] = ("compute", "communication")

_DETAIL = methodcaller("get", "detail", "")
_START, _END, _MEMBERS = attrgetter("start_s"), attrgetter("end_s"), attrgetter("members")


def _label_lists(compute: List[Op], collectives: List[Op], used: List[str]) -> Labels:
    """Names, op types and details: the compute ops', then the finished
    collectives' (their detail: the algorithm that ran)."""
    outputs = list(map(_OUTPUTS, compute))
    # an op's display name is its first result's (Op.name), read here
    # without a Python call per op
    names = (list(map(_NAME, map(_FIRST, outputs))) if all(outputs)
             else list(map(_NAME, compute)))
    op_types = list(map(_OP_TYPE, compute))
    details = list(map(_DETAIL, map(_META, compute)))
    if FUSED in op_types:
        # a fused kernel (distsim.transforms.fusion): its op type is its
        # parts, e.g. scale+mask+softmax (the chrome trace names the slice so)
        for i, t in enumerate(op_types):
            if t == FUSED:
                kernel = compute[i].attrs.get("kernel")
                if kernel:
                    op_types[i] = kernel
    names += map(_NAME, collectives)
    op_types += map(_OP_TYPE, collectives)
    details += used
    return names, op_types, details


def _comm_streams(ops: List[Op], mode: str) -> Tuple[Tuple[str, ...], np.ndarray]:
    """The record streams (sorted names, the compute stream's among them)
    and the stream code of each communication op's records
    (:func:`.comm_queues.record_stream`: ``p2p`` for a SendRecv, else its
    group's stream, or ``comm`` under ``shared``), worked out once per team."""
    by_team: Dict[Tuple[str, tuple], str] = {}
    names = []
    for op in ops:
        key = (op.op_type, tuple(op.attrs["ranks"]))
        name = by_team.get(key)
        if name is None:
            name = by_team[key] = record_stream(op, mode)
        names.append(name)
    streams = tuple(sorted(set(names).union(STREAMS)))
    code = {name: i for i, name in enumerate(streams)}
    return streams, np.fromiter(map(code.__getitem__, names), np.int64, len(ops))


def op_columns(ix: ProgramIndex, start_s: np.ndarray, end_s: np.ndarray,
               finished: Sequence, comm_streams: str = DEFAULT_COMM_STREAMS) -> OpColumns:
    """Every op record of a run: a record per simulated compute op (its
    times ``start_s`` / ``end_s``), then one per member of each collective
    in ``finished`` (in the order they finished; each has ``op``,
    ``members``, ``start_s``, ``end_s``, ``sent``, rank -> bytes put on the
    network, and ``used``, the algorithm that ran); ``comm_streams``, the
    simulation's setting (:mod:`.comm_queues`)."""
    nc, k = len(ix.compute), len(finished)
    team = list(map(_MEMBERS, finished))
    counts = np.fromiter(map(len, team), np.int64, k)
    total = int(counts.sum())
    sent: Dict[Tuple[int, tuple], tuple] = {}   # (sent table, team) -> bytes of each member

    def bytes_of(coll) -> tuple:
        key = (id(coll.sent), coll.members)
        row = sent.get(key)
        if row is None:
            row = sent[key] = tuple(map(coll.sent.__getitem__, coll.members))
        return row

    comm_ops = [c.op for c in finished]
    used = [c.used for c in finished]
    compute = ix.compute
    streams, comm_codes = _comm_streams(comm_ops, comm_streams)
    labels = OpLabels(resolve=lambda: _label_lists(compute, comm_ops, used))
    return OpColumns(
        rank=np.concatenate([ix.compute_rank, np.fromiter(chain.from_iterable(team),
                                                          np.int64, total)]),
        stream=np.concatenate([np.full(nc, streams.index(COMPUTE_STREAM), np.int64),
                               np.repeat(comm_codes, counts)]),
        category=np.repeat(np.array([0, 1]), [nc, total]),
        start_s=np.concatenate([start_s, np.repeat(np.fromiter(map(_START, finished), float, k),
                                                   counts)]),
        end_s=np.concatenate([end_s, np.repeat(np.fromiter(map(_END, finished), float, k),
                                               counts)]),
        flops=np.concatenate([ix.compute_flops, np.zeros(total)]),
        bytes=np.concatenate([ix.compute_bytes, np.fromiter(
            chain.from_iterable(map(bytes_of, finished)), float, total)]),
        label=np.concatenate([np.arange(nc, dtype=np.int64),
                              np.repeat(np.arange(nc, nc + k, dtype=np.int64), counts)]),
        streams=streams, categories=CATEGORIES, labels=labels, time_ordered=True)


def expand_to_followers(columns: OpColumns, members: Dict[int, Tuple[int, ...]]) -> OpColumns:
    """Symmetry reduction: ``members`` maps each representative to every
    rank it stands for (itself first). The records of ranks that are not
    representatives go; each representative's records are copied to the
    ranks that follow it. The copies come after the kept records, grouped
    by the record they copy, so sorting by the records' order gives what
    sorting the kept records and then all of them did."""
    rank = columns.rank
    followers = [m for group in members.values() for m in group[1:]]
    size = 1 + max([int(rank.max()) if len(rank) else -1] + followers + list(members))
    simulated = np.ones(size, bool)
    simulated[followers] = False
    kept = np.flatnonzero(simulated[rank])
    kept_rank = rank[kept]
    n_followers = np.zeros(size, np.int64)
    first = np.zeros(size, np.int64)          # where a representative's followers start in flat
    flat: List[int] = []
    for head, group in members.items():
        n_followers[head] = len(group) - 1
        first[head] = len(flat)
        flat.extend(group[1:])
    counts = n_followers[kept_rank]
    source = np.repeat(kept, counts)
    copy_rank = np.asarray(flat, dtype=np.int64)[spans(first[kept_rank], counts)]
    return columns.take(np.concatenate([kept, source]),
                        rank=np.concatenate([kept_rank, copy_rank]))
