"""Where to resolve a conflict: the cheapest point along the producer chain.

When an op needs an input in other placements than it has, the change can
be made right there (a ``redistribute`` of the input), or earlier: the
input's producer can run in other placements, fed by a change of *its*
inputs, and so on up the chain. Example (mesh of 4)::

    %b = broadcast_to(%x) {shape = [1024, 8]}   # x: f32[8]<[S(0)]>, b: S(1)
    %y = add(%b, %w)                            # w: f32[1024,8]<[S(0)]>

Changing ``%b`` from S(1) to S(0) at the add is an all-to-all of 32 KB
(6144 B per device); gathering the 32-byte ``%x`` before the broadcast is
24 B per device, after which ``%b`` is replicated and taking its S(0) piece
is a local slice.

:class:`ConflictResolver` costs each point with :func:`.costs.convert_cost`
(the planner's bytes per device) and realises the cheapest. A producer may
be re-placed only when it is a plain op with one result that nothing else
reads and that carries no annotation (``movable``), so the change cannot
affect another reader. The search goes up to :data:`MAX_DEPTH` producers
back and tries the :data:`MAX_CANDIDATES` cheapest valid strategy
combinations of each producer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ...ir.builder import NameScope
from ...ir.core import Function, Op, Value
from ...ir.mesh import DTensorType
from .costs import convert_cost

MAX_DEPTH = 3
MAX_CANDIDATES = 4
REDISTRIBUTE = "redistribute"


@dataclass
class Plan:
    """How to get ``want`` from a value: ``cost`` bytes per device; with
    ``move`` set, the producer ``op`` is re-placed to ``(input types,
    output type)`` after converting its inputs by ``inputs`` (one plan
    each), and the result then converted to ``want``."""

    cost: float
    want: DTensorType
    move: Optional[Tuple[Op, List[DTensorType], DTensorType, List["Plan"]]] = None


# ranks an op's candidate (input types, output types) from known input and output types
Candidates = Callable[[Op, List[DTensorType], DTensorType],
                      List[Tuple[List[DTensorType], List[DTensorType]]]]


class ConflictResolver:
    """Plans and realises placement changes in a function being built.

    ``movable`` maps a value to its producer when the producer may be
    re-placed; ``candidates(op, input types, wanted output type)`` lists the
    producer's valid strategy combinations, cheapest first."""

    def __init__(self, function: Function, names: NameScope, movable: Dict[Value, Op],
                 candidates: Candidates) -> None:
        self.function = function
        self.names = names
        self.movable = movable
        self.candidates = candidates
        self._memo: Dict[Tuple[int, DTensorType, int], Plan] = {}

    # -- planning ----------------------------------------------------------
    def plan(self, v: Value, want: DTensorType, depth: int = MAX_DEPTH) -> Plan:
        key = (id(v), want, depth)
        hit = self._memo.get(key)
        if hit is not None and hit.want == want:
            return hit
        best = Plan(convert_cost(v.type, want), want)
        producer = self.movable.get(v)
        if depth > 0 and best.cost > 0 and producer is not None:
            ins = [u.type for u in producer.inputs]
            for types_in, types_out in self.candidates(producer, ins, want)[:MAX_CANDIDATES]:
                subs = [self.plan(u, t, depth - 1) for u, t in zip(producer.inputs, types_in)]
                cost = sum(p.cost for p in subs) + convert_cost(types_out[0], want)
                if cost < best.cost:
                    best = Plan(cost, want, (producer, list(types_in), types_out[0], subs))
        self._memo[key] = best
        return best

    # -- realising ---------------------------------------------------------
    def realise(self, v: Value, plan: Plan, hint: str, meta: Optional[dict] = None,
                before: Optional[Op] = None) -> Value:
        """``v`` as ``plan.want``: re-place producers as planned, then a
        ``redistribute`` (with ``meta``: whose op it is made for) where the
        type still differs, inserted before ``before`` (appended when None)."""
        if plan.move is not None:
            op, types_in, type_out, subs = plan.move
            op.inputs = tuple(self.realise(u, p, u.name, meta, before=op)
                              for u, p in zip(op.inputs, subs))
            op.outputs[0].type = type_out
            self.movable.pop(v, None)  # re-placed once; its only reader is being built
            self._memo.clear()
        if plan.want == v.type:
            return v
        out = Value(self.names.fresh(hint + "_rd"), plan.want)
        rd = Op(REDISTRIBUTE, [v], [out], meta=meta)
        if before is None:
            self.function.ops.append(rd)
        else:
            index = next(i for i, o in enumerate(self.function.ops) if o is before)
            self.function.ops.insert(index, rd)
        return out
