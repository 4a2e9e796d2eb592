"""ZeRO-3's parameters: sharded over the data-parallel ranks and
all-gathered before each use, prefetched, by parameter or by layer (see
:mod:`.zero`'s docstring for the whole protocol). A mixin of
:class:`~distsim.transforms.zero.GradientSync`, which owns the state it
reads (``param_in``, ``gathered``, ``last_out``, ...)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..ir.comm import CollectiveType
from ..ir.core import Op, Value

if TYPE_CHECKING:  # pragma: no cover
    from .spmd import LowerSPMD


#: ZeRO-3: a gathered parameter takes its shape where it is first used,
#: in a reshape named ``{param}{USE_MARK}{micro-batch}_r{rank}``
#: (:meth:`ParamGathers.param_for_use`): the only op that waits for the gather
#: (by layer, the ``chunk_split`` of the layer's buffer, its results so named)
USE_MARK = "_use_m"


def used_param_name(op: Op) -> Optional[str]:
    """The parameter whose gathered value ``op`` shapes for its first use
    (ZeRO-3), or None for any other op."""
    if op.op_type != "reshape" or USE_MARK not in op.name:
        return None
    return op.name.split(USE_MARK)[0]


def unit_indices(numels: Sequence[int], dp: int) -> Tuple[int, ...]:
    """ZeRO-3 by layer: which of a layer's parameters (``numels``: their
    elements, in order) travel as one unit: those ``dp`` divides (their
    shards are equal, so the gathered buffer is a ``dp x m`` matrix whose
    column blocks are the parameters, as FSDP2 pads shards to equal size),
    when there are two or more; none without data parallelism. The
    lowering and the sweep estimator both ask this."""
    if dp <= 1:
        return ()
    members = tuple(i for i, n in enumerate(numels) if n % dp == 0)
    return members if len(members) > 1 else ()


class ParamGathers:
    """ZeRO-3's all-gathers (prefetched, gated) and the by-layer units of
    gathers and reduce-scatters, for :class:`~distsim.transforms.zero.GradientSync`."""

    L: "LowerSPMD"

    # -- ZeRO-3: all-gather before use, prefetched ---------------------------
    def enter_layer(self, stage: int, mb: int, kind: str, chunk: int, layer: int) -> None:
        """A task of ``stage`` starts ``layer``: issue the all-gathers of
        this layer (unless prefetched) and of the next ``prefetch`` layers
        of the task, before the layer's compute in program order."""
        if self.zero != 3:
            return
        order = self.L.task_layer_params.get((kind, chunk), [])
        layers = [entry[0] for entry in order]
        if layer not in layers:
            return
        i = layers.index(layer)
        task = (kind, mb, chunk, stage)
        if task != self._task:
            # the task's first layer: nothing of it has computed yet
            self._task = task
            self._received = self._task_inputs(stage, mb, kind, chunk)
        for ahead, params in order[i:i + 1 + self.S.prefetch]:
            todo = [p for p in params if (p, kind, mb, stage) not in self.gathered]
            if self.S.zero3_unit == "layer":
                together = [todo[i] for i in unit_indices([p.type.numel for p in todo],
                                                          self.S.dp)]
                if together:
                    self._gather_unit(together, stage, mb, kind, ahead)
                    todo = [p for p in todo if p not in together]
            for p in todo:
                self._gather(p, stage, mb, kind, ahead)
        self._received = {}

    def _gates(self, shard: Value, r: int, name: str, meta: Dict[str, Any]) -> Value:
        """``shard`` gated on the compute emitted so far on ``r`` and on the
        inputs the task has received from another stage (a prefetched
        gather starts no earlier)."""
        em = self.L.em
        token = self.last_out.get(r)
        if token is not None:
            # not before the compute that precedes this point ends
            shard = em.one("depend", [shard, token], None, f"{name}_gate_r{r}",
                           dict(meta, detail="zero3 prefetch gate"))
        for got in self._received.get(r, ()):
            # nor before the task has its inputs from another stage
            shard = em.one("depend", [shard, got], None, f"{name}_gate_r{r}",
                           dict(meta, detail="zero3 prefetch gate"))
        return shard

    def _dp_collective(self, kind: CollectiveType, stage: int, name: str,
                       local: Callable[[int], Optional[Value]], meta: Dict[str, Any],
                       **attrs: Any) -> Dict[int, Value]:
        """One ``kind`` collective over the dp ranks of each tensor-parallel
        rank of ``stage`` (``local(rank)``: its input, None where the rank
        is not simulated), results named ``{name}_r{rank}``; per rank, its
        result (its input unchanged with dp 1). The ZeRO gathers and
        reduce-scatters all go through here."""
        S, out = self.S, {}
        for t in self.L.tp_indices():
            ranks = [S.rank(d, stage, t) for d in range(S.dp)]
            ins = [local(r) for r in ranks]
            if S.dp > 1:
                ins = self.L.em.collective(kind, ins, ranks, [f"{name}_r{r}" for r in ranks],
                                           meta, **attrs)
            out.update({r: x for r, x in zip(ranks, ins) if x is not None})
        return out

    def _gather_unit(self, params: Sequence[Value], stage: int, mb: int, kind: str,
                     layer: Any) -> None:
        """All-gather a layer's parameters in one collective (FSDP's unit):
        each rank concatenates its shards (FSDP2's copy-in), the ranks
        all-gather the buffer, and the first use of any of them splits it
        into the parameters (the copy-out, :meth:`param_for_use`)."""
        em = self.L.em
        meta = {"stage": stage, "microbatch": mb, "category": "weights", "layer": layer}
        unit = f"{params[0].name}_unit{len(params)}"
        for p in params:
            self.gathered.add((p, kind, mb, stage))

        def packed(r: int) -> Optional[Value]:
            if not self.L.present(r):
                return None
            buf = em.one("concat", [self.param_in[(p, r)] for p in params], {"axis": 0},
                         f"{unit}_in_m{mb}_r{r}", dict(meta, detail="zero3 copy-in"))
            return self._gates(buf, r, unit, meta)
        full = self._dp_collective(CollectiveType.ALL_GATHER, stage, f"{unit}_full_m{mb}",
                                   packed, dict(meta, role="zero_gather"), dim=0)
        for r, x in full.items():
            env = self.L.menv.setdefault((r, mb), {})
            for p in params:
                env[("zero3_unit", p, kind)] = (x, params)

    def _task_inputs(self, stage: int, mb: int, kind: str, chunk: int) -> Dict[int, List[Value]]:
        """Per rank of ``stage``, the values the task ``(kind, mb, chunk)``
        receives from another stage (from tasks of its kind: a forward's
        activations, a backward's gradients), already received in program
        order."""
        L = self.L
        key = (kind, chunk, stage)
        crossing = self._crossing_in.get(key)
        if crossing is None:
            seen: set = set()
            crossing = []
            producer, task_of = L.producer_of, L.task_of_op
            for op in L.task_ops.get((kind, chunk), []):
                for v in op.inputs:
                    if v in seen or v not in L.crossing:
                        continue
                    seen.add(v)
                    src_kind, src_chunk = task_of[id(producer[v])]
                    if src_kind == kind and L.stage_of_chunk(src_chunk) != stage:
                        crossing.append(v)
            self._crossing_in[key] = crossing
        out: Dict[int, List[Value]] = {}
        if crossing:
            for _, _, r in L.group(stage):
                env = L.menv.get((r, mb), {})
                got = [env[v] for v in crossing if v in env]
                if got:
                    out[r] = got
        return out

    def _gather(self, p: Value, stage: int, mb: int, kind: str, layer: Any) -> None:
        """All-gather the shards of ``p`` over the dp ranks of every tensor-
        parallel rank of ``stage``, gated on the compute emitted so far."""
        self.gathered.add((p, kind, mb, stage))
        meta = {"stage": stage, "microbatch": mb, "category": "weights", "layer": layer}
        full = self._dp_collective(
            CollectiveType.ALL_GATHER, stage, f"{p.name}_full_m{mb}",
            lambda r: self._gates(self.param_in[(p, r)], r, p.name, meta)
            if self.L.present(r) else None, dict(meta, role="zero_gather"), dim=0)
        for r, x in full.items():
            self.L.menv.setdefault((r, mb), {})[("zero3_flat", p, kind)] = x

    def param_for_use(self, p: Value, rank: int, d: int, t: int, stage: int, mb: int,
                      layer: Any) -> Value:
        if self.zero != 3:
            return self.param_in[(p, rank)]
        kind = self.L.current_kind
        key = ("zero3", p, kind)
        env = self.L.menv.setdefault((rank, mb), {})
        if key in env:
            return env[key]
        if ("zero3_unit", p, kind) in env:
            self._copy_out(env[("zero3_unit", p, kind)], env, kind, rank, stage, mb)
            return env[key]
        if ("zero3_flat", p, kind) not in env:  # not prefetched: gathered now
            self._gather(p, stage, mb, kind, layer)
        # the gathered parameter takes its shape where it is first used, so
        # that no compute op waits for a prefetched gather before its layer
        local = self.L.em.one("reshape", [env[("zero3_flat", p, kind)]],
                              {"shape": list(p.type.shape)}, f"{p.name}{USE_MARK}{mb}_r{rank}",
                              {"stage": stage, "microbatch": mb, "category": "weights"})
        env[key] = local
        return local

    def _copy_out(self, unit: Tuple[Value, Sequence[Value]], env: Dict[Any, Any],
                  kind: str, rank: int, stage: int, mb: int) -> None:
        """Split a layer's gathered buffer (the dp ranks' concatenated
        shards) into its parameters, at the first use of any of them:
        FSDP2's copy-out, the op the layer's compute waits on."""
        buf, params = unit
        meta = {"stage": stage, "microbatch": mb, "category": "weights",
                "detail": "zero3 copy-out"}
        pieces = self.L.em.op("chunk_split", [buf],
                              {"rows": self.S.dp, "shapes": [list(p.type.shape) for p in params]},
                              [f"{p.name}{USE_MARK}{mb}_r{rank}" for p in params], dict(meta))
        for p, piece in zip(params, pieces):
            env[("zero3", p, kind)] = piece
            del env[("zero3_unit", p, kind)]

    def _grad_units(self) -> Dict[Value, Tuple[Value, ...]]:
        """ZeRO 2/3 with ``zero3_unit: layer``: per parameter, the
        parameters whose gradients the same layer of the same backward task
        makes (reduce-scattered together); a parameter alone is in none."""
        if self._units is not None:
            return self._units
        self._units = {}
        if self.zero != 3 or self.S.zero3_unit != "layer":
            return self._units
        L = self.L
        by_layer: Dict[Tuple[Any, Any], List[Value]] = {}
        for (kind, chunk), ops in L.task_ops.items():
            for op in ops:
                layer = op.meta.get("layer")
                if not isinstance(layer, int):
                    continue
                for o in op.outputs:
                    p = L.grad_of.get(o)
                    if p is not None:
                        made = by_layer.setdefault((chunk, layer), [])
                        if p not in made:
                            made.append(p)
        for made in by_layer.values():
            unit = tuple(made[i] for i in unit_indices([p.type.numel for p in made], self.S.dp))
            for p in unit:
                self._units[p] = unit
        return self._units

    def _reduce_scatter_unit(self, unit: Sequence[Value], stage: int, mb: int,
                             fresh: Mapping[Value, Mapping[int, Value]]) -> Dict[int, Value]:
        """Average one micro-batch's gradients of a layer's parameters over
        the dp ranks in one reduce-scatter: the gradients concatenated row
        by row (``chunk_cat``: row ``d`` holds each one's ``d``-th shard,
        FSDP2's copy-in) and reduce-scattered; per rank, the result (the
        unit's shards, split by :meth:`_settle_units`)."""
        em = self.L.em
        meta = {"stage": stage, "microbatch": mb, "role": "grad_sync", "category": "gradients"}
        name = f"{unit[0].name}_gunit{len(unit)}"
        return self._dp_collective(
            CollectiveType.REDUCE_SCATTER, stage, f"{name}_shard",
            lambda r: em.one("chunk_cat", [fresh[p][r] for p in unit], {"rows": self.S.dp},
                             f"{name}_in_r{r}", dict(meta, detail="zero3 copy-in"))
            if r in fresh[unit[0]] else None, dict(meta), dim=0, reduce_op="avg")

    def _settle_units(self, stage: int) -> None:
        """The units of ``stage`` reduce-scattered and not settled yet: each
        result split into its parameters' shards, which go into their
        buffers (:meth:`_settle`). Emitted at the stage's next unit (or the
        step's end), not right after the reduce-scatter: the compute
        stream would wait for it there, where FSDP2 waits for a unit's
        reduce-scatter at the next unit's post-backward."""
        for unit, mb, outs in self._unsettled.pop(stage, []):
            widths = [p.type.numel // self.S.dp for p in unit]
            shards: Dict[Value, Dict[int, Value]] = {p: {} for p in unit}
            for r, o in outs.items():
                pieces = self.L.em.op("split", [o], {"axis": 0, "sizes": widths},
                                      [f"{p.name}_gshard_r{r}" for p in unit],
                                      {"stage": stage, "microbatch": mb, "role": "grad_sync",
                                       "category": "gradients"})
                for p, piece in zip(unit, pieces):
                    shards[p][r] = piece
            for p in unit:
                self._settle(p, stage, mb, shards[p])
