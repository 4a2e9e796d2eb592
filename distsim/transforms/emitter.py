"""The emitter of a lowered step: appends ops with inferred result types
to a new local-view function, and writes down which ops are copies of one
another (:class:`~distsim.ir.build_log.BuildLog`) so that the simulator
reads the facts they share once per kind. In a reduced program (only
some ranks present) a collective keeps its whole team and lists the
present members."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Set

from ..ir.builder import NameScope
from ..ir.build_log import BuildLog
from ..ir.comm import CollectiveType, io_ranks
from ..ir.core import Function, Op, Value, normalize_attr
from ..ir.registry import infer_types, with_defaults
from ..ir.types import TensorType


class Emitter:
    """Appends ops with inferred types to a new local-view function."""

    def __init__(self, name: str, present: Optional[Set[int]] = None) -> None:
        self.function = Function(name)
        # which ops are copies of one another (the simulator reads the
        # facts they share once per kind)
        self.log = self.function.build_log = BuildLog(self.function)
        # kinds of op (BuildLog tokens) by (completed attributes and result
        # types, the meta entries a kind shares)
        self._kind_tokens: Dict[tuple, tuple] = {}
        self.present = present  # None: every rank is in the program
        self.names = NameScope()
        self.roles: Dict[str, str] = {}
        self.io: Dict[str, Dict[str, Any]] = {}
        self._memo: Dict[tuple, tuple] = {}
        # (kind, team, root) -> (present members, input and output positions
        # of present members, outputs): a reduced program's teams repeat
        self._team_plans: Dict[tuple, tuple] = {}

    def input(self, value_name: str, type: TensorType, role: str, **info: Any) -> Value:
        v = Value(self.names.fresh(value_name), type)
        self.function.inputs.append(v)
        self.roles[v.name] = role
        self.io[v.name] = dict(info, role=role)
        return v

    def op(self, op_type: str, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]],
           names: Sequence[str], meta: Optional[Dict[str, Any]] = None) -> List[Value]:
        # Repeats (the same op type and attributes on the same type objects,
        # e.g. each micro-batch's gradient accumulation) reuse the completed
        # attributes and result types. Type objects are keyed by identity: the
        # values of the function being built hold them for as long as the
        # emitter lives.
        try:
            key = (op_type, tuple([id(v.type) for v in inputs]),
                   tuple(attrs.items()) if attrs else ())
            hit = self._memo.get(key)
        except TypeError:  # an unhashable attribute (a list): no memo
            key, hit = None, None
        if hit is None:
            # normalized first (lists as tuples, as Op keeps them): hashable, so
            # the registry's shape-rule cache serves every repeat of the op
            norm = {k: normalize_attr(v) for k, v in with_defaults(op_type, attrs or {}).items()}
            hit = (norm, infer_types(op_type, [v.type for v in inputs], norm))
            if key is not None:
                self._memo[key] = hit
        kind = None
        if key is not None:   # the memo entry and the meta a kind shares
            m = meta or {}
            kind = (id(hit), m.get("category"), m.get("role"), m.get("phase"), m.get("detail"))
            kind = self._kind_tokens.setdefault(kind, kind)
        return self.emit(op_type, inputs, hit[0], hit[1], names, meta, kind)

    def emit(self, op_type: str, inputs: Sequence[Value], attrs: Dict[str, Any],
             types: Sequence[TensorType], names: Sequence[str],
             meta: Optional[Dict[str, Any]], kind: Any = None,
             subfunctions: tuple = ()) -> List[Value]:
        """Append an op whose attributes are complete and normalized and
        whose result types are known (holding ``subfunctions``: a fused
        kernel's function). ``attrs`` is kept, not copied: the
        ops emitted from one memo entry share it (attributes are never
        changed in place). ``kind``: its
        :class:`~distsim.ir.build_log.BuildLog` token (None: a kind of its
        own)."""
        if len(names) != len(types):
            names = [f"{names[0]}.{i}" for i in range(len(types))]
        # NameScope.fresh, its common case (a name not yet taken) inline
        scope = self.names
        taken = scope._taken
        outs = []
        for n, t in zip(names, types):
            if n in taken:
                n = scope.fresh(n)
            else:
                taken.add(n)
            outs.append(Value(n, t))
        op = Op.trusted(op_type, tuple(inputs), tuple(outs), attrs, subfunctions,
                        dict(meta) if meta else {})
        self.function.ops.append(op)
        self.log.add(op, kind)
        return outs

    def one(self, op_type: str, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]],
            name: str, meta: Optional[Dict[str, Any]] = None) -> Value:
        return self.op(op_type, inputs, attrs, [name], meta)[0]

    def collective(self, kind: CollectiveType, inputs: Sequence[Optional[Value]],
                   ranks: Sequence[int], names: Sequence[str],
                   meta: Optional[Dict[str, Any]] = None, **attrs: Any) -> List[Optional[Value]]:
        """Inputs and names follow the team's providing and receiving ranks
        (an absent member's name may be None);
        in a reduced program absent members' inputs are None, and so are
        their outputs."""
        # teams as tuples (what Op keeps anyway): hashable, so the emitter's
        # memo of attributes and result types serves every repeat
        team = tuple(ranks)
        if self.present is None:
            return self.op(kind.op_type, inputs, dict(attrs, ranks=team), names, meta)
        root = team[0] if kind is CollectiveType.SEND_RECV else attrs.get("root")
        plan = self._team_plans.get((kind, team, root))
        if plan is None:   # once per team: which members are present, where
            in_ranks, out_ranks = io_ranks(kind, team, root)
            plan = self._team_plans[(kind, team, root)] = (
                tuple(r for r in team if r in self.present),
                [i for i, r in enumerate(in_ranks) if r in self.present],
                [i for i, r in enumerate(out_ranks) if r in self.present], len(out_ranks),
                kind.op_type)
        here, in_at, out_at, n_out, op_type = plan
        result: List[Optional[Value]] = [None] * n_out
        if not here:
            return result
        # ``attrs`` is this call's own dict (keyword arguments): completed in place
        if len(here) < len(team):
            attrs["present"] = here
        attrs["ranks"] = team
        made = self.op(op_type, [inputs[i] for i in in_at], attrs,
                       [names[i] for i in out_at], meta)
        for i, v in zip(out_at, made):
            result[i] = v
        return result


class _BuilderShim:
    """The small FunctionBuilder surface :func:`adamw_update` and
    :func:`sgd_update` need."""

    def __init__(self, em) -> None:
        self.em = em

    def op(self, op_type, inputs, attrs=None, name=None, meta=None):
        names = [name] if isinstance(name, str) else list(name)
        outs = self.em.op(op_type, inputs, attrs, names, meta)
        return outs[0] if len(outs) == 1 else tuple(outs)


def em_builder(em) -> _BuilderShim:
    return _BuilderShim(em)
