"""The memory side of the estimator's per-layer profiles
(:mod:`.profile`): from the template's memory curve on rank 0, each
block's transient excess (forward, backward, the backward of ZeRO 2/3 with a
reduce-scatter per micro-batch) and each parameter's optimizer transient,
above what the estimate counts on its own (weights, optimizer state,
gradient buffers, saved activations).
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir.comm import is_communication
from ..ir.core import Function, Op, Value
from ..ir.occupancy import held_bytes
from ..transforms.zero3 import used_param_name
from .gathered import gather_curve, timed_makers
from .blocks import EMB, HEAD, LAST_MB, LAYER, Block, LayerProfile, Param


def memory_excess(blocks: Dict[str, Block], groups, times, trace, program: Function,
                   params: Dict[str, List[Param]], rank0: List[Op],
                   final_only: Dict[int, str],
                   weight: Optional[Dict[str, Block]] = None,
                   synced: Tuple[Dict[int, str], Dict[int, str]] = ({}, {})) -> Tuple[int, int]:
    """Fill each block's ``f_excess`` / ``b_excess`` from rank 0's memory
    curve: the peak inside the block's time window minus what is known to
    be live then (weights and optimizer state, gradient buffers after the
    first backward, saved activations of the blocks before it), and each
    parameter's update memory (:func:`_optimizer_memory`). The step's data
    (each micro-batch's token ids and labels, inputs live from the step's
    start until the embedding's or the loss's backward reads them) are
    taken off the curve: the estimate counts them per micro-batch. Returns
    a micro-batch's bytes of them read by the embedding and by the head.
    ``weight``: a split backward's weight-gradient parts
    (:attr:`.blocks.LayerProfile.weight`): what each holds from its B task
    to its W task (its ``saved_bytes``) is known to be live too, and each
    part's excess is measured on its W task's window (its ``b_excess``,
    ``b0_excess``). ``synced``: the gradients each block's last and first
    backward hand to their sync (:attr:`.blocks.Block.b_after`,
    ``b0_after``)."""
    roles = program.meta.get("roles", {})
    zero3 = program.meta.get("strategy", {}).get("zero") == 3
    static = sum(v.type.size_bytes for v in program.inputs if v.type.device == 0
                 and roles.get(v.name) in ("param", "master", "optimizer"))
    # gradient buffers: resident inputs (role grad_buffer), or, in a program
    # without them, the first micro-batch's gradients, kept to the update
    grads = sum(v.type.size_bytes for v in program.inputs if v.type.device == 0
                and roles.get(v.name) == (
                    "grad_buffer" if "grad_buffer" in roles.values() else "param"))
    samples, data_emb, data_head = _without_data(
        sorted((s.time_s, s.live_bytes) for s in trace.memory if s.rank == 0),
        program, roles, rank0, times)
    samples, early = _regathered_at_use(samples, groups, times, program, rank0)
    stamps = [t for t, _ in samples]

    def peak(t0: float, t1: float) -> float:
        """The most live bytes from ``t0`` to ``t1``, not the samples at
        ``t1`` itself: at the instant a block's last op ends the next op
        allocates its results (the optimizer's fp32 copy of a gradient,
        right after the backward's last all-reduce), and those are not the
        block's."""
        lo = bisect_left(stamps, t0)
        hi = bisect_left(stamps, t1)
        values = [b for _, b in samples[lo:hi]]
        if lo > 0:
            values.append(samples[lo - 1][1])
        return float(max(values)) if values else 0.0

    def peak_after(t0: float, t1: float) -> float:
        """How long after ``t0`` :func:`peak` is first reached."""
        lo = bisect_left(stamps, t0)
        hi = bisect_left(stamps, t1)
        best, at = (samples[lo - 1][1], t0) if lo > 0 else (-math.inf, t0)
        for t, live in samples[lo:hi]:
            if live > best:
                best, at = live, t
        return at - t0

    def window(key) -> Tuple[float, float]:
        # (not a backward's context-parallel transfers before its compute:
        # :func:`_regathered_at_use`)
        ops = [o for o in groups.get(key, []) if id(o) not in early]
        return (min(times[o.name][0] for o in ops), max(times[o.name][1] for o in ops))

    allocated: Optional[Dict[float, int]] = None     # rank 0's allocations by time, once
    forward_made: Optional[set] = None               # the forward's values, once
    # ZeRO-3: what makes each value (a gathered parameter's gate)
    producer = {id(v): op for op in rank0 for v in op.outputs} if zero3 else {}
    makers = timed_makers(producer, times)
    f_order = [EMB, "layer0", LAYER, HEAD]
    saved = {EMB: blocks[EMB].saved_bytes, "layer0": blocks[LAYER].saved_bytes,
             LAYER: blocks[LAYER].saved_bytes, HEAD: blocks[HEAD].saved_bytes}
    # a split backward: what each block's W holds once its B has run
    held = {n: weight[n if n != "layer0" else LAYER].saved_bytes if weight else 0
            for n in f_order}
    for i, name in enumerate(f_order):
        if name not in blocks:
            continue
        # (the blocks after it ran their B first: their W's bytes are live)
        before = sum(saved[n] for n in f_order[:i]) + sum(held[n] for n in f_order[i + 1:])
        if weight and ("W", 0, name) in groups:
            # its W: the W parts not run yet (its own, those before it)
            upto = sum(held[n] for n in f_order[:i + 1])
            w = weight[name]
            w.b_excess = max(0.0, peak(*window(("W", LAST_MB, name))) - static - grads - upto)
            w.b0_excess = max(0.0, peak(*window(("W", 0, name))) - static - grads - upto)
            if allocated is None:
                allocated = _allocations(rank0, times, program)
            # ZeRO 2 reduce-scattering each micro-batch: at each gradient
            # its W makes, it and its flat copy (as a B's)
            _scatter_terms(w, groups[("W", 0, name)], times, samples, stamps, allocated,
                           final_only, {p.name: i for i, p in enumerate(params.get(name, []))},
                           static + grads + upto)
        f_before = sum(saved[n] for n in f_order[:i])
        if ("F", 0, name) in groups:
            # ZeRO-3: the program's first block gathers with nothing before it
            # to gate on (no gate, the gathered value alone), every later
            # task's first block gates its gathers (the gate as well): the
            # embedding's second forward is the one the other tasks repeat
            key = ("F", 1, name) if (name == EMB and zero3 and ("F", 1, name) in groups) \
                else ("F", 0, name)
            blocks[name].f_excess = max(0.0, peak(*window(key)) - static - grads - f_before)
            blocks[name].f_peak_s = peak_after(*window(key))
            blocks[name].f_reads = _read_excess(groups[key], times, peak,
                                                static + grads + f_before)
            if zero3:
                blocks[name].f_curve = gather_curve(
                    groups[key], times, samples, stamps, static + grads + f_before,
                    blocks[name].f_gather, params, producer, makers=makers)
        if ("B", LAST_MB, name) in groups:
            blocks[name].b_excess = max(0.0, peak(*window(("B", LAST_MB, name))) - static
                                        - grads - before - saved[name])
            blocks[name].b_peak_s = peak_after(*window(("B", LAST_MB, name)))
            blocks[name].b_tail = _tail(groups[("B", LAST_MB, name)], times, peak,
                                        static + grads + before + saved[name])
            blocks[name].b_after = _after_gradients(
                groups[("B", LAST_MB, name)], times, samples, stamps,
                static + grads + before + saved[name], synced[0], params.get(name, []))
            if zero3:
                blocks[name].b_curve_later = gather_curve(
                    groups[("B", LAST_MB, name)], times, samples, stamps,
                    static + grads + before + saved[name], blocks[name].b_gather, params,
                    producer, makers=makers)
        if ("B", 0, name) in groups:
            base = static + grads + before + saved[name]
            blocks[name].b0_excess = max(0.0, peak(*window(("B", 0, name))) - base)
            blocks[name].b0_peak_s = peak_after(*window(("B", 0, name)))
            blocks[name].b0_tail = _tail(groups[("B", 0, name)], times, peak, base)
            blocks[name].b0_after = _after_gradients(groups[("B", 0, name)], times, samples,
                                                     stamps, base, synced[1],
                                                     params.get(name, []))
            if forward_made is None:
                forward_made = {id(v) for v in program.inputs}
                forward_made.update(id(v) for op in program.ops if "phase" not in op.meta
                                    for v in op.outputs)
            blocks[name].b_early = _early(groups[("B", 0, name)], forward_made)
            blocks[name].b_reads = _read_excess(groups[("B", 0, name)], times, peak, base)
            index = {p.name: i for i, p in enumerate(params.get(name, []))}
            if allocated is None:
                allocated = _allocations(rank0, times, program)
            _scatter_terms(blocks[name], groups[("B", 0, name)], times, samples, stamps,
                           allocated, final_only, index, base)
            blocks[name].bs_excess = max([blocks[name].b0_excess,
                                          *blocks[name].bs_grads.values()])
            blocks[name].b_held = _held_gradient(groups[("B", 0, name)], final_only, index)
            if zero3:
                blocks[name].b_curve = gather_curve(
                    groups[("B", 0, name)], times, samples, stamps, base, blocks[name].b_gather,
                    params, producer, _grad_points(groups[("B", 0, name)], times, samples,
                                                   stamps, allocated, final_only, index),
                    _grad_ops(groups[("B", 0, name)], times, samples, stamps, allocated,
                              final_only, index), makers=makers)
    _optimizer_memory(params, rank0, times, samples, static + grads)
    return data_emb, data_head


def _without_data(samples: List[Tuple[float, int]], program: Function, roles, rank0: List[Op],
                  times) -> Tuple[List[Tuple[float, int]], int, int]:
    """Rank 0's memory samples less its data inputs (role ``data``: live
    from the start until their last reader ends), and the bytes of the
    first micro-batch's read by the embedding and by the head."""
    data = {id(v): v for v in program.inputs
            if v.type.device == 0 and roles.get(v.name) == "data"}
    if not data:
        return samples, 0, 0
    free: Dict[int, float] = {}
    reader: Dict[int, Op] = {}
    for op in rank0:
        for v in op.inputs:
            if id(v) in data and op.name in times:
                free[id(v)] = max(free.get(id(v), 0.0), times[op.name][1])
                reader.setdefault(id(v), op)
    ends = sorted((free.get(k, 0.0), v.type.size_bytes) for k, v in data.items())
    held = sum(n for _, n in ends)
    out: List[Tuple[float, int]] = []
    i = 0
    for t, live in samples:
        while i < len(ends) and ends[i][0] <= t:
            held -= ends[i][1]
            i += 1
        out.append((t, live - held))
    emb = head = 0
    for k, v in data.items():
        op = reader.get(k)
        if op is None or op.meta.get("microbatch") != 0:
            continue
        layer = op.meta.get("layer")
        if isinstance(layer, int) and layer < 0:
            emb += v.type.size_bytes
        else:
            head += v.type.size_bytes
    return out, emb, head


def _regathered_at_use(samples: List[Tuple[float, int]], groups, times, program: Function,
                       rank0: List[Op]) -> Tuple[List[Tuple[float, int]], set]:
    """Rank 0's memory samples with the keys and values a backward block
    gathers again over the context-parallel group (its leading ``cp``
    all-gathers, reading only what the forward made) gathered where the
    block's compute starts: the template's communication stream runs them
    as soon as the forward made their inputs, where a step's stream holds
    the gradient sync of the blocks before first (the lowering issues it
    before them). Their results are allocated there, and the local keys
    and values they last read are freed there. Returns the samples and the
    ids of a backward block's leading context-parallel transfers that run
    before its compute (those all-gathers, and a ring's first steps, which
    run that early in a step too, on their pairs' queues): not the
    block's, for its time window."""
    made = {id(v) for v in program.inputs}
    made.update(id(v) for op in program.ops if "phase" not in op.meta for v in op.outputs)
    last_read: Dict[int, float] = {}
    for op in rank0:
        if op.name in times:
            for v in op.inputs:
                last_read[id(v)] = max(last_read.get(id(v), 0.0), times[op.name][1])
    #: (from, to, bytes): bytes taken off the samples from ``from`` to ``to``
    #: (negative: put back)
    moves: List[Tuple[float, float, int]] = []
    early = set()
    for (kind, _, _), ops in groups.items():
        starts = [times[o.name][0] for o in ops if not is_communication(o)]
        if kind != "B" or not starts:
            continue
        for op in ops:
            if not is_communication(op):
                break
            t0, t1, _ = times[op.name]
            role = op.meta.get("role")
            if role in ("cp", "cp_ring") and t0 < min(starts):
                early.add(id(op))
            if role == "cp" and t0 < min(starts) and all(id(v) in made for v in op.inputs):
                moves.append((t0, min(starts), sum(v.type.size_bytes for v in op.outputs
                                                   if v.type.device == 0)))
                moves.append((t1, min(starts), -sum(v.type.size_bytes for v in op.inputs
                                                    if last_read.get(id(v)) == t1)))
    if not moves:
        return samples, early
    stamps = [t for t, _ in samples]
    out = []
    for t in sorted(set(stamps) | {t for move in moves for t in move[:2]}):
        live = samples[max(0, bisect_right(stamps, t) - 1)][1]
        out.append((t, live - sum(n for t0, t1, n in moves if t0 <= t < t1)))
    return out, early


def _read_excess(ops: List[Op], times, peak, base: float) -> Dict[str, float]:
    """ZeRO-3: per parameter a block first reads, the bytes above ``base``
    while the reshape of its gathered value runs (that reshape's result
    included): where ZeRO-3 by layer splits the whole unit out of its
    gathered buffer instead (:func:`.units.copy_out_bytes`)."""
    out: Dict[str, float] = {}
    for op in ops:
        name = used_param_name(op)
        if name is not None and name not in out:
            out[name] = peak(times[op.name][0], times[op.name][1]) - base
    return out


def _allocations(rank0: List[Op], times, program: Function) -> Dict[float, int]:
    """The bytes rank 0 allocates at each op start time (its ops' results
    that do not update a value in place)."""
    in_place = set(program.meta.get("updates", {}).values())
    starts: Dict[float, int] = {}
    for op in rank0:
        if op.name not in times:
            continue
        t0 = times[op.name][0]
        for k, v in enumerate(op.outputs):
            if v.name not in in_place and v.type.device == 0:
                starts[t0] = starts.get(t0, 0) + held_bytes(op, k)
    return starts


def _gradient_ops(ops: List[Op], times, samples: List[Tuple[float, int]],
                  stamps: List[float], final_only: Dict[int, str]):
    """Per op of ``ops`` that makes final gradients (``final_only``), in
    order: (their parameters' names, their bytes, the op's start and end
    on the template's timeline, the most live bytes while it runs, and the
    live bytes sampled at its end, or those while it runs where no sample
    falls there)."""
    for op in ops:
        names = [final_only[id(v)] for v in op.outputs if id(v) in final_only]
        if not names:
            continue
        made = sum(held_bytes(op, k) for k, v in enumerate(op.outputs) if id(v) in final_only)
        t0, t1, _ = times[op.name]
        lo, hi = bisect_left(stamps, t0), bisect_left(stamps, t1)
        during = max((b for _, b in samples[lo:hi]), default=samples[lo - 1][1] if lo else 0)
        after = samples[hi][1] if hi < len(samples) and stamps[hi] == t1 else during
        yield names, made, t0, t1, during, after


def _scatter_terms(blk: Block, ops: List[Op], times, samples: List[Tuple[float, int]],
                   stamps: List[float], starts: Dict[float, int], final_only: Dict[int, str],
                   index: Dict[str, int], base: float) -> None:
    """Fill a block's (or a split backward's W part's) ``bs_grads``,
    ``bs_ops`` and ``bs_made`` above ``base`` from its first micro-batch's
    ``ops`` (:func:`_scatter_excess`; ``index``: a parameter's position in
    the block by name)."""
    at, made = _scatter_excess(ops, times, samples, stamps, starts, final_only)
    blk.bs_grads = {index[p]: live - base for p, live in at.items() if p in index}
    blk.bs_ops = {}
    for names, during, _, nbytes in made:
        for p in names:
            if p in index:
                i = index[p]
                blk.bs_ops[i] = max(blk.bs_ops.get(i, -math.inf), during - base + nbytes)
    blk.bs_made = [(tuple(index[p] for p in names if p in index),
                    during - base, after - base, nbytes) for names, during, after, nbytes in made]


def _scatter_excess(ops: List[Op], times, samples: List[Tuple[float, int]],
                    stamps: List[float], starts: Dict[float, int],
                    final_only: Dict[int, str]
                    ) -> Tuple[Dict[str, float], List[Tuple[List[str], float, float, int]]]:
    """The most live bytes (rank 0) that a block's backward reaches with ZeRO
    2/3 reducing-scattering each micro-batch's gradients, from the
    template's first backward (``ops``, program order), where each final
    gradient (``final_only``) is written into its whole buffer in place. In
    the lowered program the buffer is a 1/dp shard, so the gradient is a
    value of its own while the op making it runs (its bytes added to that
    op's window), then is flattened into a copy of the same size right
    after it (both live: the live bytes once that op has ended and freed
    its inputs, before the next op allocates, plus twice the gradient);
    the copy lives on until its reduce-scatter (counted elsewhere).
    Per parameter name, the most of the two; and per op making final
    gradients, in order, (their names, the live bytes while it runs and
    once it has ended, the gradients' bytes), from which ZeRO-3 by layer
    (its gradients held to the block's end) is worked out at estimate
    time (:func:`.point.unit_excess`). ``starts``: every allocation of
    rank 0 by time (:func:`_allocations`); those at an op's end (the next
    op's, of this block or the next task's) are not counted as live after
    it. ``stamps``: the samples' times."""
    best: Dict[str, float] = {}
    made_at: List[Tuple[List[str], float, float, int]] = []
    for names, made, _, t1, during, after in _gradient_ops(ops, times, samples, stamps,
                                                           final_only):
        for name in names:
            best[name] = max(best.get(name, -math.inf), during + made,
                             after - starts.get(t1, 0) + 2 * made)
        made_at.append((names, float(during), float(after - starts.get(t1, 0)), made))
    return best, made_at


def _grad_points(ops: List[Op], times, samples: List[Tuple[float, int]],
                 stamps: List[float], starts: Dict[float, int], final_only: Dict[int, str],
                 index: Dict[str, int]) -> List[Tuple[int, float, float, bool]]:
    """The candidates :func:`_scatter_excess` takes per gradient, in time
    (for :class:`.gathered.GatherCurve`): (the parameter's index in the
    block, the op's start, the live bytes while it runs plus the
    gradients it makes) and (its index, the op's end, the live bytes then,
    less the next op's allocations, plus twice the gradients: each and its
    flat copy; where the op ends, marked)."""
    out: List[Tuple[int, float, float, bool]] = []
    for names, made, t0, t1, during, after in _gradient_ops(ops, times, samples, stamps,
                                                            final_only):
        for name in names:
            if name in index:
                out.append((index[name], t0, float(during + made), False))
                out.append((index[name], t1, float(after - starts.get(t1, 0) + 2 * made), True))
    return out


def _tail(ops: List[Op], times, peak, base: float) -> Optional[float]:
    """The most bytes above ``base`` in a block's window (``ops``) once its
    last collective has ended (``peak``: the window's most live bytes,
    :func:`memory_excess`'s), or None: no collective, or none ends before
    the block does."""
    comm = [times[o.name][1] for o in ops if is_communication(o) and o.name in times]
    if not comm:
        return None
    end = max(times[o.name][1] for o in ops if o.name in times)
    free = max(comm)
    return max(0.0, peak(free, end) - base) if free < end else None


def _after_gradients(ops: List[Op], times, samples: List[Tuple[float, int]],
                     stamps: List[float], base: float, finals: Dict[int, str],
                     params: List[Param]) -> Dict[int, float]:
    """Per parameter of a block (its index in ``params``) whose gradient
    one of the block's ``ops`` hands to its sync (``finals``): the most
    bytes above ``base`` sampled from that op's end (its inputs freed) to
    the block's end. A bucket the sync flushes there lives through it."""
    index = {p.name: i for i, p in enumerate(params)}
    end = max(times[o.name][1] for o in ops)
    out: Dict[int, float] = {}
    for op in ops:
        t1 = times[op.name][1]
        for v in op.outputs:
            i = index.get(finals.get(id(v), ""))
            if i is not None:
                live = samples[bisect_left(stamps, t1):bisect_left(stamps, end)]
                out[i] = max(0.0, max((b for _, b in live), default=base) - base)
    return out


def block_collective(op: Op) -> bool:
    """Whether ``op`` is a collective of a block's own, which the block's
    times hold: tensor-parallel (no role), expert parallelism's all-to-all
    (role ``expert_parallel``), context parallelism's all-gathers and
    all-to-alls (role ``cp``); not a ZeRO-3 gather, the data-parallel
    sync, a pipeline transfer or a ring attention step (``cp_ring``: a
    send/receive on its pair's own queue)."""
    return is_communication(op) and op.meta.get("role") in (None, "expert_parallel", "cp")


def _early(ops: List[Op], forward_made: set) -> int:
    """The bytes rank 0 gets from a block's leading tensor-parallel
    collectives (``ops``: its backward, in program order) that read only
    what the forward made: the communication stream takes them as soon
    as it is free, the block's compute not yet started."""
    total = 0
    for op in ops:
        # (a backward's re-gathers of keys and values are counted where its
        # compute starts: :func:`_regathered_at_use`)
        if not block_collective(op) or op.meta.get("role") == "cp":
            continue
        if any(id(v) not in forward_made for v in op.inputs):
            break
        total += sum(held_bytes(op, k) for k, v in enumerate(op.outputs)
                     if v.type.device == 0)
    return total


def _held_gradient(ops: List[Op], final_only: Dict[int, str], index: Dict[str, int]
                   ) -> Optional[int]:
    """The index of the parameter whose final gradient is the first result
    of the last backward op of a block (``ops``: its backward), or None.
    LowerSPMD gates ZeRO-3's next gathers on the first result of the last
    op it emitted (:meth:`~distsim.transforms.zero3.ParamGathers.note_layer_output`):
    ending a task, such a gradient lives until the next task's gathers."""
    model = [op for op in ops if isinstance(op.meta.get("layer"), int)
             and op.meta.get("phase") == "backward" and op.outputs]
    if not model:
        return None
    name = final_only.get(id(model[-1].outputs[0]))
    return index.get(name) if name is not None else None


def _grad_ops(ops: List[Op], times, samples: List[Tuple[float, int]], stamps: List[float],
              starts: Dict[float, int], final_only: Dict[int, str], index: Dict[str, int]
              ) -> List[Tuple[Tuple[int, ...], float, float, float, float]]:
    """The ops of a block's backward (``ops``) that make final gradients,
    in order, as :func:`_scatter_excess` measures them, in template time:
    (the indices of their parameters, the op's start, the most live bytes
    while it runs, its end, the live bytes then less the next op's
    allocations), for :attr:`.gathered.GatherCurve.made`."""
    out = []
    for names, _, t0, t1, during, after in _gradient_ops(ops, times, samples, stamps,
                                                         final_only):
        out.append((tuple(index[p] for p in names if p in index), t0, float(during), t1,
                    float(after - starts.get(t1, 0))))
    return out


def _optimizer_memory(params: Dict[str, List[Param]], rank0: List[Op], times,
                      samples: List[Tuple[float, int]], base: float) -> None:
    """Fill each parameter's ``opt_with`` / ``opt_after`` / ``opt_flat``
    from rank 0's memory curve (``samples``: (time, live bytes), sorted)
    over the window of its update ops (``{p}_r0...``, which run one after
    another on the compute stream: the sample at a time is the live bytes
    after its frees and allocations, the most at that time), less
    ``base`` (weights, optimizer state, gradient buffers). The flat copy
    of the gradient (``{p}_gflat_r0``, ZeRO >= 1) is live until its last
    reader ends: its bytes are taken off the samples before then, as the
    ZeRO shard that replaces it differs in size (see
    :func:`.memory.optimizer_excess`)."""
    by_name = {p.name: p for ps in params.values() for p in ps}
    update: Dict[str, List[Op]] = {}
    flat: Dict[str, Value] = {}
    for op, p, role in optimizer_ops(params, rank0):
        if role == "flat":
            flat[p.name] = op.outputs[0]
        elif role == "update":
            update.setdefault(p.name, []).append(op)
    flat_of = {id(v): name for name, v in flat.items()}
    flat_free: Dict[str, float] = {}
    for op in rank0:
        for v in op.inputs:
            name = flat_of.get(id(v))
            if name is not None:
                flat_free[name] = max(flat_free.get(name, 0.0), times[op.name][1])
    stamps = [t for t, _ in samples]
    for name, ops in update.items():
        p = by_name[name]
        t0 = min(times[o.name][0] for o in ops)
        t1 = max(times[o.name][1] for o in ops)
        nbytes = flat[name].type.size_bytes if name in flat else 0
        freed = flat_free.get(name, -1.0)
        with_, after = -math.inf, -math.inf
        for t, live in samples[bisect_left(stamps, t0):bisect_left(stamps, t1)]:
            if t < freed:
                with_ = max(with_, live - base - nbytes)
            else:
                after = max(after, live - base)
        p.opt_flat = nbytes
        p.opt_with = max(0.0, with_) if nbytes else 0.0
        p.opt_after = max(0.0, after, with_ if not nbytes else 0.0)


def prefetched_bytes(prof: LayerProfile, order: Sequence[Tuple[str, Optional[int]]], kind: str,
                     prefetch: int) -> List[float]:
    """ZeRO-3: per block of a forward / backward task (``order``: its
    blocks in task order, ``kind`` "F" or "B"), the bytes of the
    parameters gathered ahead for the next ``prefetch`` blocks of the task
    (the parameters each block reads first, at their whole tensor-parallel
    size): LowerSPMD issues their all-gathers when the block starts, and
    each result lives until its block reads it. The template runs without
    prefetch (its blocks hold only their own gathered parameters), and the
    blocks ahead are the chunk's, not the template's. Whole from the
    block's start is an upper bound: the gathers run one after another,
    and at the block's peak the last may not have started. Zeros when
    ``prefetch`` is 0 (pass 0 without ZeRO-3)."""
    if prefetch <= 0:
        return [0.0] * len(order)
    by_name: Dict[str, float] = {}      # a layer's blocks all have the same
    for name, _ in order:
        if name not in by_name:
            blk = prof.blocks[name]
            by_name[name] = float(sum(
                prof.params[owner][i].numel * prof.params[owner][i].dtype.itemsize
                for owner, i in (blk.f_gather if kind == "F" else blk.b_gather)))
    own = [by_name[name] for name, _ in order]
    return [sum(own[k + 1:k + 1 + prefetch]) for k in range(len(order))]


_OPTIMIZER_ROLES = (("_gflat_r0", "flat"), ("_new_r0", "new"), ("_r0", "update"))


def optimizer_role(op_name: str, order: Dict[str, int]) -> Optional[Tuple[str, str]]:
    """(parameter, role: flat / new / update) of a template optimizer op
    named ``op_name``, or None; ``order`` numbers the parameter names. The
    first parameter in that order whose name the op's starts with, followed
    by a role's suffix (at most one role follows a given name)."""
    best: Optional[Tuple[int, str, str]] = None
    at = op_name.find("_", 1)
    while at != -1:
        rank = order.get(op_name[:at])
        if rank is not None and (best is None or rank < best[0]):
            for suffix, role in _OPTIMIZER_ROLES:
                if op_name.startswith(suffix, at):
                    best = (rank, op_name[:at], role)
                    break
        at = op_name.find("_", at + 1)
    return None if best is None else (best[1], best[2])


def optimizer_ops(params: Dict[str, List[Param]], rank0: List[Op]
                  ) -> List[Tuple[Op, Param, str]]:
    """Rank 0's optimizer ops of the template (not its collectives) with
    their parameter and role (:func:`optimizer_role`), in program order."""
    by_name = {p.name: p for ps in params.values() for p in ps}
    order = {name: i for i, name in enumerate(by_name)}
    out = []
    for op in rank0:
        if op.meta.get("phase") != "optimizer" or is_communication(op):
            continue
        hit = optimizer_role(op.name, order)
        if hit is not None:
            out.append((op, by_name[hit[0]], hit[1]))
    return out


def fill_optimizer_ops(params: Dict[str, List[Param]], rank0: List[Op], times) -> None:
    """Each parameter's optimizer times on rank 0 of the template
    (:func:`optimizer_ops`): flattening its gradient, its update ops, the
    reshape of the new parameter."""
    for op, p, role in optimizer_ops(params, rank0):
        t0, t1, flops = times[op.name]
        if role == "flat":
            p.opt_pre += t1 - t0
        elif role == "new":
            p.opt_post += t1 - t0
        else:
            p.opt_update.append((t1 - t0, flops))
