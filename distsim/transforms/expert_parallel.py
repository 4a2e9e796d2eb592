"""Expert parallelism as a transform of the one-rank template forward:
each rank of an expert-parallel group of ``ep`` ranks holds ``experts /
ep`` of a mixture of experts' experts, and the tokens travel to them and
back by all-to-all (GShard's and Megatron-LM's layout).

``ExpertParallel(ep)(forward)`` rewrites every MoE layer of a forward
step (after tensor parallelism, before autodiff):

- the experts' stacked weights (every parameter the ops between a
  ``moe_dispatch`` and its ``moe_combine`` read, ``experts x ...``) become
  this rank's ``experts / ep`` of them: rank ``e`` of the group holds
  experts ``e x experts / ep`` to ``(e + 1) x experts / ep - 1``;
- after the dispatch (``experts x slots x hidden``, this rank's tokens
  in every expert's slots) an ``spmd.alltoall`` sends each rank the slots
  of its experts: ``experts / ep x (ep x slots) x hidden``, the senders'
  slots side by side in rank order; the experts run on those;
- before the combine the inverse all-to-all sends each rank's expert
  outputs back to the ranks whose tokens they are.

The router, the routing and the combine stay on every rank's own tokens
(the routing is recomputed from the probabilities by each op), so the
step computes what the one-device step does; autodiff makes the
backward's all-to-alls (the gradient of one is the other). The template's
``meta["expert_params"]`` names the sharded parameters (their global
shapes stay in ``param_global_shapes``), ``meta["ep"]`` the degree.

Under sequence parallelism (:func:`route_sequence_shards`, before tensor
parallelism places the forward) each tensor-parallel rank routes its own
sequence shard, as Megatron-LM's MoE layer does (its ``alltoall``
dispatcher, expert tensor parallel size = tensor parallel size, the
default): router and dispatch on the shard, the all-to-all over the
expert-parallel group, the slots of the ``tp`` ranks all-gathered for the
experts' FFNs (split over tp as a dense MLP is, column- then row-wise),
their partial outputs reduce-scattered back to each rank's slots, the
inverse all-to-all, the combine on the shard. The tensor-parallel
all-gather and reduce-scatter come from the sharding layer (the slots
split along dim 1, :mod:`.sharding.rules_moe`); this pass puts the
all-to-alls between them and the dispatch and combine.

Under context parallelism the forward is a cp rank's already (its two
chunks of every sequence, :func:`distsim.models.gpt.gpt_forward`'s
``cp``): each rank routes those tokens at their capacity, and with ``sp``
this pass's tensor-parallel routing shards them again; the lowering cuts
the expert-parallel groups from the ``dp x cp`` ranks
(:class:`~.strategy.Strategy`).

The all-gather dispatcher (``meta["dispatcher"] = "allgather"`` on the
``moe_dispatch``: Megatron-core's ``allgather`` token dispatcher) moves
tokens instead of slots: each rank all-gathers (``spmd.allgather``, group
``ep``) its group's tokens and probabilities, routes them, each rank's at its
own capacity (``groups``), into its own experts' slots only (the ops'
``first_expert``, per ep rank in ``meta["ep_rank_attrs"]``, and
``local_experts``), and after the combine's partial sums an
``spmd.reducescatter`` hands each rank its tokens' outputs.

A dropless dispatch (``meta["expert_tokens"]`` on the ``moe_dispatch``,
each expert's tokens under the routing balance: :mod:`distsim.models.moe`)
keeps its padded shapes; this pass marks the ops of its experts (the
all-to-alls and tensor-parallel gathers among them) and its dispatch and
combine with ``meta["occupancy"]``, the share of their rows that hold the
busiest rank's tokens (:func:`dropless_occupancy`),
at every ``ep``, 1 included.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Set, Tuple

from ..errors import ConfigError
from ..ir.core import Function, Op, Value
from ..ir.registry import infer_types
from ..ir.verifier import verify

#: the ``detail`` of the forward's all-to-alls (their gradients inherit it)
DISPATCH_DETAIL = "expert dispatch"
COMBINE_DETAIL = "expert combine"


def expert_region(f: Function, dispatch: Op) -> List[Op]:
    """The ops between ``dispatch`` and the ``moe_combine`` reading what
    they make: those that depend on the dispatch's slots and that the
    combine's expert outputs depend on (the experts' FFNs)."""
    after: Set[Value] = {dispatch.outputs[0]}
    reach: List[Op] = []
    combine = None
    for op in f.ops:
        if any(v in after for v in op.inputs):
            if op.op_type == "moe_combine":
                combine = op
                break
            reach.append(op)
            after.update(op.outputs)
    if combine is None:
        raise ConfigError(f"--ep: the dispatch %{dispatch.outputs[0].name} reaches no "
                          "moe_combine")
    needed: Set[Value] = {combine.inputs[0]}
    region: List[Op] = []
    for op in reversed(reach):
        if any(v in needed for v in op.outputs):
            region.append(op)
            needed.update(op.inputs)
    return region[::-1]


def route_sequence_shards(forward: Function, tp: int, model: str = "the model") -> Function:
    """``forward`` with every MoE layer's tokens routed in ``tp`` groups
    along the sequence (``groups``, :mod:`distsim.ir.ops_moe`), each with
    its share of the slots: what ``tp`` ranks holding a sequence shard each
    route on their own. The capacity becomes ``tp`` times a group's, the
    capacity of ``1 / tp`` of the tokens (the slots' count is linear in the
    tokens before it is rounded up: ``ceil(capacity / tp)``). Tokens
    flattened for the routing (a ``reshape`` of ``mb x seq x hidden`` to
    ``tokens x hidden``) are routed in their own shape instead, the router
    too, so that a sequence shard of them is a shard of the routing's
    inputs (the combine's result has that shape then: its reshape back
    goes)."""
    producer = forward.producers()
    env: Dict[Value, Value] = {}
    flat_tokens: List[Value] = []
    for op in forward.ops:
        if op.op_type == "moe_dispatch":
            flat = op.inputs[0]
            r = producer.get(flat)
            if r is not None and r.op_type == "reshape" and r.inputs[0].type.rank > 2 \
                    and r.inputs[0].type.shape[-1] == flat.type.shape[-1]:
                env[flat] = r.inputs[0]
                flat_tokens.append(flat)
    ops: List[Op] = []
    for op in forward.ops:
        attrs = op.attrs
        if op.op_type in ("moe_dispatch", "moe_combine"):
            tokens = env.get(op.inputs[1], op.inputs[1]).type.shape[-2]
            if tokens % tp:
                raise ConfigError(f"--sp: --tp {tp} does not divide the {tokens} tokens routed "
                                  f"by %{op.outputs[0].name} of model '{model}'")
            capacity = tp * -(-int(op.attrs["capacity"]) // tp)
            attrs = dict(op.attrs, groups=tp, capacity=capacity)
        ins = [env.get(v, v) for v in op.inputs]
        if attrs is op.attrs and ins == list(op.inputs):
            ops.append(op)
            continue
        if op.op_type == "reshape" and ins[0].type.shape == op.outputs[0].type.shape:
            env[op.outputs[0]] = ins[0]     # the combine's result back in shape: a no-op now
            continue
        types = infer_types(op.op_type, [v.type for v in ins], attrs)
        outs = [v if t == v.type else Value(v.name, t) for v, t in zip(op.outputs, types)]
        env.update(zip(op.outputs, outs))
        ops.append(Op(op.op_type, ins, outs, attrs, op.subfunctions, op.meta))
    outputs = [env.get(v, v) for v in forward.outputs]
    read = {v for op in ops for v in op.inputs} | set(outputs)
    unread = {id(producer[v]) for v in flat_tokens if v not in read}   # the flattening
    out = Function(forward.name, list(forward.inputs),
                   [op for op in ops if id(op) not in unread], outputs)
    out.meta = dict(forward.meta)
    return verify(out)


class ExpertParallel:
    """The pass (see the module docstring); ``model`` names the model in
    messages."""

    def __init__(self, ep: int, model: str = "the model") -> None:
        self.ep = ep
        self.model = model

    def __call__(self, forward: Function) -> Function:
        return mark_dropless(self._place(forward), self.ep)

    def _place(self, forward: Function) -> Function:
        if self.ep == 1:
            return forward
        ep = self.ep
        dispatches = [op for op in forward.ops if op.op_type == "moe_dispatch"]
        if not dispatches:
            raise ConfigError(f"--ep {ep}: model '{self.model}' has no mixture-of-experts "
                              "layer (a dense model has no experts to share out)")
        params = set(forward.meta["params"])
        # a parameter read on sequence shards through its tensor-parallel copy
        copies = {op.outputs[0]: op for op in forward.ops
                  if op.op_type == "spmd.copy" and op.inputs[0].name in params}
        in_region: Dict[int, Op] = {}
        expert_params: Dict[str, Value] = {}
        for d in dispatches:
            experts = d.outputs[0].type.shape[0]
            if experts % ep:
                raise ConfigError(f"--ep {ep} does not divide the {experts} experts of model "
                                  f"'{self.model}'")
            region = expert_region(forward, d)
            for op in region:
                in_region[id(op)] = op
                for v in op.inputs:
                    if v in copies:
                        in_region[id(copies[v])] = copies[v]
                        v = copies[v].inputs[0]
                    if v.name in params:
                        if v.type.shape[0] != experts:
                            raise ConfigError(f"--ep: parameter %{v.name} read by the experts "
                                              f"of %{d.outputs[0].name} is not stacked over "
                                              f"its {experts} experts")
                        expert_params[v.name] = v
        env: Dict[Value, Value] = {}
        for v in expert_params.values():
            env[v] = Value(v.name, v.type.with_shape((v.type.shape[0] // ep,)
                                                     + tuple(v.type.shape[1:])))
        gathered = {id(d): d for d in dispatches if d.meta.get("dispatcher") == "allgather"}
        shared: Dict[Value, Value] = {}     # tokens and probabilities, all-gathered
        ops: List[Op] = []
        for op in forward.ops:
            ins = [env.get(v, v) for v in op.inputs]
            if op.op_type in ("moe_dispatch", "moe_combine") and \
                    id(self._dispatch_of(op, dispatches)) in gathered:
                self._gathered(ops, op, ins, env, shared)
                continue
            if op.op_type == "moe_combine":
                ins[0] = self._alltoall(ops, ins[0], 1, 0, f"{ins[0].name}_back",
                                        dict(op.meta, detail=COMBINE_DETAIL))
            if id(op) in in_region:
                types = infer_types(op.op_type, [v.type for v in ins], op.attrs)
                outs = [Value(v.name, t) for v, t in zip(op.outputs, types)]
                env.update(zip(op.outputs, outs))
                ops.append(Op(op.op_type, ins, outs, op.attrs, op.subfunctions, op.meta))
                continue
            ops.append(op if ins == list(op.inputs) else
                       Op(op.op_type, ins, op.outputs, op.attrs, op.subfunctions, op.meta))
            if op.op_type == "moe_dispatch":
                slots = op.outputs[0]
                env[slots] = self._alltoall(ops, slots, 0, 1, f"{slots.name}_ep",
                                            dict(op.meta, detail=DISPATCH_DETAIL))
        out = Function(forward.name, [env.get(v, v) for v in forward.inputs], ops,
                       [env.get(v, v) for v in forward.outputs])
        out.meta = dict(forward.meta, ep=ep, expert_params=sorted(expert_params))
        return verify(out)

    @staticmethod
    def _dispatch_of(op: Op, dispatches: List[Op]) -> Op:
        """The dispatch that routes for ``op`` (itself, or the dispatch
        reading the combine's probabilities)."""
        if op.op_type == "moe_dispatch":
            return op
        return next((d for d in dispatches if d.inputs[1] is op.inputs[1]), op)

    def _gathered(self, ops: List[Op], op: Op, ins: List[Value], env: Dict[Value, Value],
                  shared: Dict[Value, Value]) -> None:
        """Append to ``ops`` ``op`` (a dispatch or combine) as the
        all-gather dispatcher's: every rank's tokens and probabilities
        gathered (once per routing) along the dim the routing groups
        split, each rank's routed at its own capacity (``groups``: each
        rank's groups in rank order, their slots side by side as the
        all-to-all places them) into this rank's experts' slots
        (``first_expert``, a rank attribute, and ``local_experts``); the
        combine's partial sums reduce-scattered back to their tokens.
        ``env`` maps the dispatch's slots to this rank's, ``shared`` each
        gathered value to its gather."""
        ep, probs = self.ep, op.inputs[1]
        local = probs.type.shape[-1] // ep
        attrs = dict(op.attrs, capacity=ep * int(op.attrs["capacity"]),
                     groups=ep * int(op.attrs.get("groups", 1)), first_expert=0,
                     local_experts=local)
        meta = dict(op.meta, ep_rank_attrs={"first_expert": [r * local for r in range(ep)]})
        reads = ins if op.op_type == "moe_dispatch" else ins[1:]
        for v in reads:
            if v not in shared:
                shared[v] = self._allgather(ops, v, dict(op.meta, detail=DISPATCH_DETAIL))
        gins = [shared.get(v, v) for v in ins[:len(ins) - len(reads)]] + \
            [shared[v] for v in reads]
        (t,) = infer_types(op.op_type, [v.type for v in gins], attrs)
        out = op.outputs[0]
        if op.op_type == "moe_dispatch":
            env[out] = Value(out.name, t)
            ops.append(Op(op.op_type, gins, [env[out]], attrs, op.subfunctions, meta))
            return
        partial = Value(f"{out.name}_partial", t)
        ops.append(Op(op.op_type, gins, [partial], attrs, op.subfunctions, meta))
        attrs = {"group": "ep", "size": ep, "dim": probs.type.rank - 2}
        ops.append(Op("spmd.reducescatter", [partial], [out], attrs,
                      meta=dict(op.meta, detail=COMBINE_DETAIL)))

    def _allgather(self, ops: List[Op], x: Value, meta: Dict[str, object]) -> Value:
        """Append to ``ops`` the all-gather of ``x`` over the expert-parallel
        group along its last leading dim (the tokens', their routing groups'
        :mod:`distsim.ir.ops_moe`); its result (``x``'s name, ``_ep``)."""
        attrs = {"group": "ep", "size": self.ep, "dim": x.type.rank - 2}
        out = Value(f"{x.name}_ep", infer_types("spmd.allgather", [x.type], attrs)[0])
        ops.append(Op("spmd.allgather", [x], [out], attrs, meta=meta))
        return out

    def _alltoall(self, ops: List[Op], x: Value, split: int, concat: int, name: str,
                  meta: Dict[str, object]) -> Value:
        """Append to ``ops`` the all-to-all of ``x`` over the expert-parallel
        group (``split`` cut into ``ep`` pieces, received along ``concat``);
        its result, named ``name``."""
        attrs = {"group": "ep", "size": self.ep, "split_dim": split, "concat_dim": concat}
        out = Value(name, infer_types("spmd.alltoall", [x.type], attrs)[0])
        ops.append(Op("spmd.alltoall", [x], [out], attrs, meta=meta))
        return out


def mark_dropless(f: Function, ep: int) -> Function:
    """``f`` with each dropless dispatch's ops marked with their
    ``meta["occupancy"]`` over an expert-parallel group of ``ep`` (module
    docstring); ``f`` itself when it has none."""
    marks: Dict[int, float] = {}
    for d in f.ops:
        counts = d.meta.get("expert_tokens") if d.op_type == "moe_dispatch" else None
        if counts is None:
            continue
        experts, routed = dropless_occupancy(counts, int(d.attrs["capacity"]), ep)
        marks[id(d)] = routed
        for op in expert_region(f, d):
            marks[id(op)] = experts
        for op in f.ops:
            if op.op_type == "moe_combine" and op.inputs[1] is d.inputs[1]:
                marks[id(op)] = routed
    if not marks:
        return f
    ops = [Op(op.op_type, op.inputs, op.outputs, op.attrs, op.subfunctions,
              dict(op.meta, occupancy=marks[id(op)])) if id(op) in marks else op
           for op in f.ops]
    out = Function(f.name, list(f.inputs), ops, list(f.outputs))
    out.meta = dict(f.meta)
    return out


def dropless_occupancy(counts: Sequence[float], capacity: int, ep: int) -> Tuple[float, float]:
    """(occupancy of the experts' ops, of the dispatch and combine) for an
    expert-parallel group of ``ep``, given each expert's ``counts`` of
    tokens and ``capacity`` slots per expert: rank ``r`` holds experts ``r
    x experts / ep`` on, and the busiest rank's experts fill ``max_r sum
    counts`` of their ``experts / ep x capacity`` slots; the dispatch fills
    ``sum counts`` of ``experts x capacity``."""
    local = len(counts) // ep
    busiest = max(sum(counts[r * local:(r + 1) * local]) for r in range(ep))
    return busiest / (local * capacity), sum(counts) / (len(counts) * capacity)
