"""Coarsening for :class:`~distsim.transforms.spmd.LowerSPMD`: runs of
compute ops as ``fused`` ops, and their results as bundles.

Each run of compute ops of a task (between collectives, sends and values
arriving by them, within one layer and phase) becomes one *segment*: a
device-free function that every micro-batch and rank running the run
shares (:mod:`distsim.ir.ops_fused`). Its time is the sum of the run's
ops, so step times are unchanged.

Results of one segment that exactly the same segments read are allocated
when it ends and freed when the last of those readers ends: they live
together. Such results travel as one *bundle* (:mod:`distsim.ir.ops_bundle`):
the producing segment ends with a ``pack``, each reading segment starts
with an ``unpack``. The memory curve and the step time are the same, with
far fewer values to name, index and track (a forward segment's saved
activations, which its backward segments read, are the bulk).

A micro-batch's forward and backward tasks of one chunk run in the same
gradient mode (:meth:`Coarsening._grad_mode`; the backward runs differ by
mode), so the forward segments that make a value and the backward ones
that read it agree on its bundle. A value read by a bare op (a collective,
a send, an unfused gradient op) or by another chunk stays a value of its
own.
"""
from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from ..ir.core import Function, Op, Value
from ..ir.ops_bundle import BOOKKEEPING_OPS, PACK, UNPACK, bundle_type, unpack_attrs
from ..ir.ops_fused import FUSED
from ..ir.types import TensorType

TaskKey = Tuple[str, int]   # (kind "F", "B" or "W", chunk)


def segment_key(op: Op) -> tuple:
    """Ops fuse only with neighbours of the same layer, phase and kind."""
    m = op.meta
    return (m.get("layer"), m.get("phase"), m.get("detail"), m.get("category"))


class Bundle:
    """Results of one segment that the same segments read, as one value
    (``value``: device-free, of their summed bytes)."""

    __slots__ = ("value", "parts")

    def __init__(self, parts: Sequence[Value]) -> None:
        self.parts: List[Value] = list(parts)
        self.value = Value(f"{parts[0].name}.bundle", bundle_type([p.type for p in parts]))


class Segment:
    """A run of fusable ops of one task, as a device-free function whose
    inputs are the values it reads from outside and whose outputs are the
    values read after it.

    With ``accumulate=True`` each gradient the run produces is added into
    its parameter's gradient buffer inside the segment (as GradientSync
    would right after it), in place of the bare gradient. The buffers of
    the run's parameters (``acc_params``) travel as one bundle: an extra
    input (``acc_in``, unpacked at the start) and an extra output
    (``acc_out``, the new buffers packed at the end). GradientSync keeps
    that bundle as an in-place update of the buffers, so it holds no bytes
    of its own; one value per segment and micro-batch instead of two per
    gradient (with ``Coarsening.bundle_buffers`` off, ``acc_each``: one
    buffer in and one out per gradient).

    :meth:`bundle` then replaces results that travel together by their
    bundle, in the outputs of the segment making them and in the inputs of
    the segments reading them."""

    def __init__(self, name: str, ops: List[Op], lower: Any, accumulate: bool = False) -> None:
        inside = {id(op) for op in ops}
        produced = {v for op in ops for v in op.outputs}
        self.grads = [v for op in ops for v in op.outputs if v in lower.grad_of]
        self.accumulate = accumulate and bool(self.grads)
        self.inputs: List[Value] = []
        for op in ops:
            for v in op.inputs:
                if v not in produced and v not in self.inputs:
                    self.inputs.append(v)

        def read_outside(v: Value) -> bool:
            return (v in lower.step_outputs or v in lower.crossing
                    or any(id(c) not in inside for c in lower.consumers.get(v, ())))

        def leaves(v: Value) -> bool:
            if v in lower.grad_of and self.accumulate:
                # added into its buffer inside: the buffer's new value leaves
                # (the step's output is the sum), the bare gradient only if
                # an op outside reads it
                return any(id(c) not in inside for c in lower.consumers.get(v, ()))
            return read_outside(v) or v in lower.grad_of

        # the forward's identity (spmd.copy) makes no value: its result is
        # its operand (as LowerSPMD maps it unfused), so it is no output;
        # a reader outside takes the operand's value (``same``: result ->
        # the value it is), which leaves the segment if made inside
        roots: Dict[Value, Value] = {}
        for op in ops:
            if op.op_type == "spmd.copy":
                roots[op.outputs[0]] = roots.get(op.inputs[0], op.inputs[0])
        self.same = [(v, u) for v, u in roots.items() if leaves(v)]
        kept = {u for _, u in self.same if u in produced}
        self.outputs = [v for op in ops for v in op.outputs
                        if v not in roots and (leaves(v) or v in kept)]
        #: the parameters whose buffers the run adds into (in the bundle's order)
        self.acc_params: List[Value] = [lower.grad_of[g] for g in self.grads
                                        ] if self.accumulate else []
        # each buffer in its own dtype (fp32 under ``fp32_grads``: the
        # gradient is cast to it before the add, as GradientSync does)
        buffers: List[TensorType] = [
            TensorType(g.type.shape, lower.sync.buffer_dtype(lower.grad_of[g]), None)
            for g in self.grads] if self.accumulate else []
        # the buffers as inputs and outputs: one bundle each, or one value
        # per gradient (``bundle_buffers`` off)
        self.acc_in: Optional[Value] = None
        self.acc_out: Optional[Value] = None
        self.acc_each: Dict[Value, Tuple[Value, Value]] = {}   # gradient -> (in, out)
        # a bundle costs a pack, one value per accumulating micro-batch and
        # an unpack of every buffer: bundled where that is fewer values
        # than one per buffer and accumulating micro-batch (M - 2 of them)
        self.bundled = (self.accumulate and lower.bundle_buffers
                        and (len(self.grads) - 1) * (lower.microbatches - 3) > 2)
        if self.bundled:
            if len(set(self.acc_params)) != len(self.acc_params):
                raise AssertionError(f"segment {name}: two gradients of one parameter")
            self.acc_in = Value(f"{name}.acc", bundle_type(buffers))
            self.acc_out = Value(f"{name}.acc_new", self.acc_in.type)
            self.inputs.append(self.acc_in)
            self.outputs.append(self.acc_out)
        elif self.accumulate:
            self.acc_each = {g: (Value(f"{g.name}.acc", t), Value(f"{g.name}.acc_new", t))
                             for g, t in zip(self.grads, buffers)}
            self.inputs += [a for a, _ in self.acc_each.values()]
            self.outputs += [b for _, b in self.acc_each.values()]
        self.layer = ops[-1].meta.get("layer")
        self.meta = dict(ops[0].meta)
        self._local: Dict[Value, Value] = {}
        local = self._localize

        self.function = Function(name, [local(v) for v in self.inputs])
        fn_ops = self.function.ops
        # each gradient's buffer before and after the run
        if self.bundled:
            old_buf = {g: Value(f"{g.name}.acc", t) for g, t in zip(self.grads, buffers)}
            new_buf = {g: Value(f"{g.name}.acc_new", t) for g, t in zip(self.grads, buffers)}
            fn_ops.append(Op(UNPACK, [local(self.acc_in)], list(old_buf.values()),
                             unpack_attrs(buffers)))
        else:
            old_buf = {g: local(a) for g, (a, _) in self.acc_each.items()}
            new_buf = {g: local(b) for g, (_, b) in self.acc_each.items()}
        acc_meta = {"phase": "backward", "category": "gradients"}
        for op in ops:
            if op.op_type == "spmd.copy":  # the identity in the forward pass
                self._local[op.outputs[0]] = local(op.inputs[0])
                continue
            # a gradient's op counts its result as gradients, as LowerSPMD
            # emits it unfused (the memory of the op inside, segment_bodies)
            meta = (dict(op.meta, category="gradients")
                    if any(o in lower.grad_of for o in op.outputs) else op.meta)
            fn_ops.append(Op(op.op_type, [local(v) for v in op.inputs],
                             [local(v) for v in op.outputs], op.attrs, op.subfunctions,
                             meta=meta))
            for g in op.outputs:
                if g in old_buf:
                    add_meta = dict(acc_meta, layer=op.meta.get("layer"))
                    fresh = local(g)
                    if fresh.type.dtype != old_buf[g].type.dtype:
                        cast = Value(f"{g.name}.gcast", old_buf[g].type)
                        fn_ops.append(Op("cast", [fresh], [cast],
                                         {"dtype": cast.type.dtype.value}, meta=add_meta))
                        fresh = cast
                    fn_ops.append(Op("add", [old_buf[g], fresh], [new_buf[g]], meta=add_meta))
        if self.bundled:
            fn_ops.append(Op(PACK, list(new_buf.values()), [local(self.acc_out)]))
        #: a buffer input -> its parameter (``bundle_buffers`` off)
        self.param_of_input = {a: p for p, (a, _) in zip(self.acc_params, self.acc_each.values())}
        self.function.outputs = [local(v) for v in self.outputs]
        #: every copy's attributes and sub-functions: one dict and one tuple
        #: that the copies share (attributes are never changed in place);
        #: ``ops`` counts the run's ops (and accumulations), not bookkeeping
        self.attrs = {"segment": name,
                      "ops": sum(op.op_type not in BOOKKEEPING_OPS for op in fn_ops)}
        self.subfunctions = (self.function,)

    def _localize(self, v: Value) -> Value:
        """The segment function's own (device-free) value for ``v``."""
        mine = self._local.get(v)
        if mine is None:
            mine = self._local[v] = Value(v.name, TensorType(v.type.shape, v.type.dtype, None))
        return mine

    def bundle(self, made: Sequence[Bundle], read: Dict[Value, Bundle]) -> None:
        """Output each bundle of ``made`` (whose parts are outputs) in place
        of its parts, packed at the end; take each bundle of ``read`` (part
        -> its bundle) in place of its parts, unpacked at the start."""
        fn = self.function
        local = self._localize
        if read:
            self.inputs, taken = _parts_bundled(self.inputs, read)
            fn.inputs = [local(v) for v in self.inputs]
            fn.ops[:0] = [Op(UNPACK, [local(b.value)], [local(p) for p in b.parts],
                             unpack_attrs([local(p).type for p in b.parts])) for b in taken]
        if made:
            self.outputs, given = _parts_bundled(self.outputs,
                                                 {p: b for b in made for p in b.parts})
            fn.outputs = [local(v) for v in self.outputs]
            fn.ops += [Op(PACK, [local(p) for p in b.parts], [local(b.value)]) for b in given]


def _parts_bundled(values: Sequence[Value], bundle_of: Dict[Value, Bundle]
                   ) -> Tuple[List[Value], List[Bundle]]:
    """``values`` with each bundle's value where its first part was and its
    other parts left out; and the bundles, in that order."""
    out: List[Value] = []
    bundles: List[Bundle] = []
    for v in values:
        b = bundle_of.get(v)
        if b is None:
            out.append(v)
        elif b not in bundles:
            bundles.append(b)
            out.append(b.value)
    return out, bundles


Item = Union[Op, List[Op]]   # a bare op, or a run to fuse


class Coarsening:
    """LowerSPMD's coarsening, as a mixin: it reads the pass's analysis of
    the step (``task_ops``, ``consumers``, ``grad_of``, ``crossing``, ...)
    and emits with its emitter."""

    #: bundle results that live together (off: every result a value of its
    #: own, as the exactness tests compare)
    bundle_results = True
    #: carry an accumulating segment's gradient buffers as one bundle
    #: (:mod:`.buffer_bundles`; off: one value per buffer, as the exactness
    #: tests compare)
    bundle_buffers = True

    def _init_coarsening(self) -> None:
        self._segment_cache: Dict[Tuple[TaskKey, str], List[Any]] = {}
        self._run_cache: Dict[Tuple[TaskKey, str], Tuple[List[Item], Dict[int, int]]] = {}
        #: (task, mode) -> part -> its bundle, for the bundles that task makes
        self._bundles: Dict[Tuple[TaskKey, str], Dict[Value, Bundle]] = {}
        self._task_grad_params: Dict[TaskKey, List[Value]] = {}
        # per (segment, rank): each output's name stem, rank suffix and type
        self._segment_types: Dict[Tuple[int, int], List[Tuple[str, str, TensorType]]] = {}

    def _fusable(self, op: Op, fuse_grads: bool = False) -> bool:
        return ((not op.op_type.startswith("spmd.") or op.op_type == "spmd.copy")
                and not any(k in op.meta for k in ("rank_attrs", "cp_rank_attrs",
                                                   "ep_rank_attrs"))
                and (not op.subfunctions or bool(op.attrs.get("kernel")))
                and (fuse_grads or not any(o in self.grad_of for o in op.outputs)))

    def _arrives(self, v: Value, chunk: int) -> bool:
        """Whether ``v`` reaches a task of ``chunk`` through communication."""
        if v in self.spmd_outputs:
            return True
        if v in self.value_chunk:
            return self.value_chunk[v] != chunk
        return v in self.param_chunk and self.strategy.zero == 3

    def _grad_params(self, key: TaskKey) -> List[Value]:
        params = self._task_grad_params.get(key)
        if params is None:
            params = self._task_grad_params[key] = [
                self.grad_of[o] for op in self.task_ops.get(key, []) for o in op.outputs
                if o in self.grad_of]
        return params

    def _plain_only(self, chunk: int) -> bool:
        """Whether every task of ``chunk`` runs in ``"plain"`` mode (see
        :meth:`_grad_mode`): no gradients, one micro-batch, or ZeRO 2/3
        reduce-scattering every micro-batch's."""
        return ((not self._grad_params(("B", chunk)) and not self._grad_params(("W", chunk)))
                or self.microbatches == 1 or self.sync.scatter_each)

    def _grad_mode(self, key: TaskKey, mb: int) -> str:
        """How the instance of a task for micro-batch ``mb`` fuses the
        gradients it produces.

        The gradients of a micro-batch other than the last are read only by
        the next micro-batch's accumulation, later on the same compute
        stream, so fusing them (``"first"``: the bare gradient becomes the
        buffer; ``"accumulate"``: added into it inside the segment) changes
        no time. The last micro-batch's (``"plain"``) feed the data-parallel
        sync and stay unfused, so that communication starts when it would;
        so do all of them when ZeRO 2/3 reduce-scatters every micro-batch.

        A forward task runs in the mode of its micro-batch's backward task,
        which reads its results: the two agree on which results travel
        together (see :meth:`_plan_bundles`)."""
        if self._plain_only(key[1]):
            return "plain"
        mode = "first" if mb == 0 else "accumulate" if mb + 1 < self.microbatches else "plain"
        params = self._grad_params(key)
        if params and self.sync.count.get(params[0], 0) != mb:
            raise AssertionError(f"LowerSPMD: task {key} of micro-batch {mb} after "
                                 f"{self.sync.count.get(params[0], 0)} micro-batches' gradients")
        return mode

    def _runs(self, key: TaskKey, mode: str) -> Tuple[List[Item], Dict[int, int]]:
        """The task's ops with each fusable run as a list, and the item
        holding each op of a run (by op identity); once per task and mode."""
        cached = self._run_cache.get((key, mode))
        if cached is not None:
            return cached
        items: List[Item] = []
        run: List[Op] = []
        fuse_grads = mode != "plain"

        def close() -> None:
            if len(run) == 1 and not (fuse_grads and any(o in self.grad_of
                                                         for o in run[0].outputs)):
                items.append(run[0])
            elif run:
                items.append(list(run))
            run.clear()

        for op in self.task_ops.get(key, []):
            if not self._fusable(op, fuse_grads):
                close()
                items.append(op)
                continue
            # a value arriving by communication starts a new run, so that the
            # ops before it are not held back waiting for it
            if run and (segment_key(run[-1]) != segment_key(op) or
                        any(self._arrives(v, key[1]) for v in op.inputs)):
                close()
            run.append(op)
            # a value leaving for another stage or a collective ends the run,
            # so that communication starts when it would without fusing
            if any(o in self.crossing or o in self.spmd_inputs for o in op.outputs):
                close()
        close()
        item_of = {id(op): i for i, item in enumerate(items) if isinstance(item, list)
                   for op in item}
        found = self._run_cache[(key, mode)] = (items, item_of)
        return found

    def _readers(self, v: Value, chunk: int, mode: str) -> Optional[FrozenSet[tuple]]:
        """The segments that read ``v`` (made by a task of ``chunk`` in
        ``mode``, read by the tasks of its micro-batch, which run in the same
        mode); None when a bare op or another chunk reads it."""
        found = set()
        for reader in self.consumers.get(v, ()):
            task = self.task_of_op[id(reader)]
            if task[1] != chunk:
                return None
            item = self._runs(task, mode)[1].get(id(reader))
            if item is None:
                return None
            found.add((task, item))
        return frozenset(found) if found else None

    def _plan_bundles(self, key: TaskKey, mode: str, segments: List[Segment]) -> None:
        """Group each segment's results by the segments that read them."""
        made: Dict[Value, Bundle] = {}
        self._bundles[(key, mode)] = made
        if not self.bundle_results:
            return
        for seg in segments:
            groups: Dict[FrozenSet[tuple], List[Value]] = {}
            for v in seg.outputs:
                # gradients and step outputs are looked up one by one after
                # the segment; a buffer's new value (acc_out) has no template
                # readers; a value another chunk reads gets None from _readers
                if v in self.grad_of or v in self.step_outputs or v not in self.consumers:
                    continue
                if any(c.op_type == "spmd.copy" for c in self.consumers[v]):
                    continue   # read as itself after the segment (Segment.same)
                readers = self._readers(v, key[1], mode)
                if readers is not None:
                    groups.setdefault(readers, []).append(v)
            for parts in groups.values():
                if len(parts) > 1:
                    b = Bundle(parts)
                    made.update((p, b) for p in parts)

    def _bundles_read(self, seg: Segment, key: TaskKey, mode: str) -> Dict[Value, Bundle]:
        """The bundles whose parts ``seg`` reads (part -> bundle)."""
        read: Dict[Value, Bundle] = {}
        for v in seg.inputs:
            producer = self.producer_of.get(v)
            if producer is None:
                continue
            task = self.task_of_op[id(producer)]
            if task[1] != key[1]:
                continue    # from another chunk: never bundled (see _readers)
            if task != key:    # made by the micro-batch's other task: planned first
                self._segments(task, mode)
            b = self._bundles[(task, mode)].get(v)
            if b is not None:
                read[v] = b
        return read

    def _segments(self, key: TaskKey, mode: str = "plain") -> List[Any]:
        """The task's ops with each fusable run replaced by a Segment, its
        results bundled (once per task and gradient mode, shared by the
        micro-batches and ranks)."""
        cached = self._segment_cache.get((key, mode))
        if cached is not None:
            return cached
        items: List[Any] = []
        for item in self._runs(key, mode)[0]:
            if isinstance(item, list):
                item = Segment(f"{key[0]}{key[1]}.seg{len(items)}{mode[0]}", item, self,
                               accumulate=mode == "accumulate")
            items.append(item)
        self._segment_cache[(key, mode)] = items
        segments = [s for s in items if isinstance(s, Segment)]
        self._plan_bundles(key, mode, segments)
        made = self._bundles[(key, mode)]
        for seg in segments:
            mine = {b.value: b for v in seg.outputs for b in [made.get(v)] if b is not None}
            seg.bundle(list(mine.values()), self._bundles_read(seg, key, mode))
        return items

    def _emit_segment(self, seg: Segment, stage: int, mb: int, base: Dict[str, Any]) -> None:
        # Hot (once per segment, micro-batch and rank): the output names'
        # fixed parts and the result types are worked out once per segment
        # and rank; a name is checked against the taken ones inline.
        em = self.em
        seg_meta = seg.meta
        attrs, subs = seg.attrs, seg.subfunctions
        sync = self.sync
        # below ZeRO 3 a rank's parameter is its input (as get finds it)
        params = None if self.strategy.zero == 3 else self.gathers.param_in
        param_chunk = self.param_chunk
        names = em.names
        taken = names._taken
        fresh = names.fresh
        ops = em.function.ops
        add_kind = em.log.add
        trusted = Op.trusted
        mb_part = f"_m{mb}" if self.microbatches > 1 else ""
        for d, t, r in self.placement.group(stage):
            env = self.menv.get((r, mb))
            if env is None:
                env = self.menv[(r, mb)] = {}
            ins = []
            for v in seg.inputs:
                x = env.get(v)
                if x is None:
                    if v is seg.acc_in:
                        x = sync.bundles.current(seg, r, stage, mb)
                    elif v in seg.param_of_input:
                        x = sync.acc[(seg.param_of_input[v], r)]
                    elif params is not None and v in param_chunk:
                        x = params[(v, r)]
                    else:
                        x = self.get(v, r, d, t, mb, stage, seg.layer)
                ins.append(x)
            plan = self._segment_types.get((id(seg), r))
            if plan is None:
                plan = self._segment_types[(id(seg), r)] = [
                    (v.name, f"_r{r}", TensorType(v.type.shape, v.type.dtype, r))
                    for v in seg.outputs]
            outs = []
            for stem, rank_part, ty in plan:
                name = stem + mb_part + rank_part      # as local_name
                if name in taken:
                    name = fresh(name)
                else:
                    taken.add(name)
                outs.append(Value(name, ty))
            ops.append(trusted(FUSED, tuple(ins), tuple(outs), attrs, subs, {**seg_meta, **base}))
            add_kind(ops[-1], seg)   # a segment's copies are one kind of op
            for v, o in zip(seg.outputs, outs):
                env[v] = o
            if seg.same:
                given = dict(zip(seg.inputs, ins))
                for v, u in seg.same:
                    env[v] = env[u] if u in env else given[u]
            if outs:
                self.gathers.note_layer_output(r, outs[0])
        if seg.accumulate:
            sync.accumulated(stage, mb, seg)
        elif seg.grads:
            sync.after_backward(stage, mb, seg.grads)
