"""The placements of the entry function's unannotated inputs.

An input nobody annotated is free: it can arrive laid out as the program
likes best. Propagation's sweeps give it what its first placed reader asks
for, which may cost more elsewhere: in ``block(x) = x + mlp(tanh(x))`` with
a column/row-parallel ``mlp``, the residual add meets the row-parallel
``P(sum)`` result first and makes ``x`` ``P(sum)``; ``tanh`` then needs it
whole -- a reduce-scatter and an all-gather, before the all-reduce of the
result -- where a replicated ``x`` needs the all-reduce only.

The rule: each unannotated input of the entry function, in order, takes
the cheapest of the placement the sweeps give it and that placement with
some (down to all) of its sharded or partial mesh axes replicated instead.
A candidate's cost is that of the whole sharded program it leads to: the
planner's charge for every redistribute in it (bytes per device plus a
collective's latency, :func:`.costs.convert_charge`), a callee's once per
call. On a tie the sweeps' placement stays; an input once decided stays
so while the later ones are tried. Annotated inputs are never changed.
"""
from __future__ import annotations

from itertools import combinations
from typing import Callable, Dict, List, Optional, Sequence

from ...errors import DistsimError
from ...ir.core import Function, Module
from ...ir.mesh import DTensorType, Replicate
from ...ir.ops_call import callee_of, is_call
from .costs import convert_charge

REDISTRIBUTE = "redistribute"

#: builds the sharded module (entry function first) for the entry's input types
Build = Callable[[Sequence[Optional[DTensorType]]], Module]


def program_charge(f: Function, memo: Optional[Dict[int, float]] = None) -> float:
    """The planner's charge for every redistribute ``f`` runs, through its
    calls (a callee's once per call)."""
    memo = {} if memo is None else memo
    if id(f) in memo:
        return memo[id(f)]
    total = 0.0
    for op in f.ops:
        if op.op_type == REDISTRIBUTE:
            total += convert_charge(op.inputs[0].type, op.outputs[0].type)
        elif is_call(op):
            total += program_charge(callee_of(op), memo)
    memo[id(f)] = total
    return total


def relaxed(t: DTensorType) -> List[DTensorType]:
    """``t`` with each non-empty set of its non-replicated axes replicated,
    the fewest first (the last is all-replicated)."""
    axes = [i for i, p in enumerate(t.placements) if not isinstance(p, Replicate)]
    out = []
    for k in range(1, len(axes) + 1):
        for chosen in combinations(axes, k):
            out.append(t.with_placements([Replicate() if i in chosen else p
                                          for i, p in enumerate(t.placements)]))
    return out


def place_entry_inputs(given: Sequence[Optional[DTensorType]], build: Build) -> Module:
    """The sharded module whose entry's unannotated inputs (None in
    ``given``) follow the rule of this module. Errors of the sweeps'
    program are raised; a candidate that cannot be built is skipped."""
    fixed = list(given)
    best = build(fixed)
    best_charge = program_charge(best.main)
    for i, t in enumerate(given):
        if t is not None:
            continue
        for candidate in relaxed(best.main.inputs[i].type):
            trial = fixed[:i] + [candidate] + fixed[i + 1:]
            try:
                built = build(trial)
            except DistsimError:
                continue
            charge = program_charge(built.main)
            if charge < best_charge:
                fixed, best, best_charge = trial, built, charge
    return best
