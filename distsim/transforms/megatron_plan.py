"""The built-in ``megatron`` plan: Megatron-LM's tensor-parallel layout,
found in any forward program by its structure.

- *Linear pairs*: a linear layer (``matmul`` by a 2-D parameter) whose
  result reaches further linear layers only through ops that keep its
  features apart (biases, activations, gating products, attention's
  reshapes and products; no norm, no loss, not the program's result)
  starts a pair: it and every linear feeding those same layers are
  column-wise, the layers reached are row-wise. An MLP's consecutive
  layers pair up (0-1, 2-3, ...); a transformer block's query, key and
  value projections pair with its output projection, its first MLP
  projections (gate and up) with the second. A column-wise weight whose
  product is split after it (fused query, key and value; fused gate and
  up) is ``fused_colwise``: split block by block. A mixture of experts'
  stacked weights (``experts x in x out``, multiplying ``experts x slots x
  in``) pair as a dense MLP's do: every expert's FFN split over the ranks.
- *Embeddings*: a table whose rows are looked up by the data's ids
  (``embedding``, ``gather`` of rows; not positions), and that nothing else
  reads but a head multiplying by it (``x @ table^T``), is
  vocabulary-parallel; so is the output layer's own copy of it where
  pipeline stages untie the two (``meta["tied"]``).

- *Output layers*: a linear layer whose result is the logits of the loss
  (``cross_entropy``, through a bias or mask), its weight read by nothing
  else, is column-wise -- split over the vocabulary (an untied head), the
  loss then vocabulary-parallel (:mod:`.sharding.vocab_loss`).

Everything else is left to propagation (biases follow their layers; a
linear in no pair, such as an MLP's odd last layer, stays replicated).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set

from ..ir.core import Function, Op, Value
from .plans import Plan, PlanEntry
from .tensor_parallel import past_elementwise, product_split, stacked_weight

#: ops that mix a tensor's features or end the step: a pair stops before them
BLOCKING = frozenset({"layernorm", "rmsnorm", "mse_loss", "cross_entropy"})


def _escape(name: str) -> str:
    """``name`` as an fnmatch pattern that matches only itself."""
    return "".join(f"[{c}]" if c in "[]*?" else c for c in name)


class _Structure:
    def __init__(self, f: Function) -> None:
        self.f = f
        self.params = set(f.meta["params"])
        self.users = f.users()
        self.producer = f.producers()
        self.outputs = set(f.outputs)
        self.order = {id(o): i for i, o in enumerate(f.ops)}
        self.weight: Dict[int, Value] = {}
        for op in f.ops:
            w = self._linear_weight(op)
            if w is not None:
                self.weight[id(op)] = w

    def _linear_weight(self, op: Op) -> Optional[Value]:
        if op.op_type != "matmul" or len(op.inputs) != 2:
            return None
        x, w = op.inputs
        if w.name in self.params and stacked_weight(x, w) and x.name not in self.params \
                and w not in self.producer:
            return w
        return None

    def data_dependent(self) -> Set[Value]:
        """Values computed from the step's data (token ids, not positions)."""
        roles = self.f.meta.get("roles", {})
        found = {v for v in self.f.inputs if roles.get(v.name) == "data"}
        for op in self.f.ops:
            if any(v in found for v in op.inputs):
                found.update(op.outputs)
        return found

    def reached(self, op: Op) -> Optional[List[Op]]:
        """The linear layers ``op``'s result reaches through feature-keeping
        ops, in program order; None when it reaches a blocking op or the
        program's result first."""
        found: List[Op] = []
        seen: Set[int] = set()
        stack = list(op.outputs)
        visited: Set[Value] = set()
        while stack:
            v = stack.pop()
            if v in visited:
                continue
            visited.add(v)
            if v in self.outputs:
                return None
            for u in self.users.get(v, []):
                if id(u) in seen:
                    continue
                if id(u) in self.weight:
                    if u.inputs[1] is v:          # the value is a weight here: not a layer input
                        return None
                    seen.add(id(u))
                    found.append(u)
                    continue
                if u.op_type in BLOCKING:
                    return None
                seen.add(id(u))
                stack.extend(u.outputs)
        return sorted(found, key=lambda o: self.order[id(o)])

    def feeds_loss(self, op: Op) -> bool:
        """Whether ``op``'s result is the logits of a ``cross_entropy`` (through
        single-reader element-wise ops: a bias, a mask): an output layer."""
        u, v = past_elementwise(self.users, op.outputs[0])
        return u is not None and u.op_type == "cross_entropy" and u.inputs[0] is v \
            and v not in self.outputs

    def feeding(self, rows: List[Op]) -> Optional[List[Op]]:
        """The linear layers whose results reach the inputs of ``rows``
        through feature-keeping ops; None past a blocking op."""
        found: List[Op] = []
        seen: Set[int] = set()
        stack = [r.inputs[0] for r in rows]
        visited: Set[Value] = set()
        while stack:
            v = stack.pop()
            if v in visited:
                continue
            visited.add(v)
            p = self.producer.get(v)
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            if id(p) in self.weight:
                found.append(p)
                continue
            if p.op_type in BLOCKING:
                return None
            stack.extend(x for x in p.inputs if x.name not in self.params)
        return found


def _lookup(op: Op) -> bool:
    """An embedding lookup: ``embedding``, or ``gather`` of rows."""
    return op.op_type == "embedding" or (op.op_type == "gather"
                                         and int(op.attrs.get("axis", 0)) == 0)


def _head(op: Op, table: Value) -> bool:
    """A head multiplying by the (tied) table's rows: ``x @ table^T``."""
    return (op.op_type == "matmul" and op.inputs[1] is table and op.inputs[0] is not table
            and bool(op.attrs.get("trans_b")))


def megatron_plan(f: Function) -> Plan:
    """The ``megatron`` plan of forward program ``f`` (see the module
    docstring): exact parameter names, in program order."""
    s = _Structure(f)
    styles: Dict[str, str] = {}
    data = s.data_dependent()
    for op in f.ops:
        table = op.inputs[0] if op.inputs else None
        if table is not None and table.name in s.params and _lookup(op) \
                and op.inputs[1] in data \
                and all(_lookup(u) or _head(u, table) for u in s.users[table]):
            styles.setdefault(table.name, "vocab")
    # the output layer's own copy of a tied table (pipeline stages untie
    # them, ``meta["tied"]``: copy -> table): split as the table is, so that
    # the two gradients summed between the stages have the same shards
    by_name = {v.name: v for v in f.inputs}
    for copy, table in (f.meta.get("tied") or {}).items():
        v = by_name.get(copy)
        if v is not None and styles.get(table) == "vocab" and s.users.get(v) \
                and all(_head(u, v) for u in s.users[v]):
            styles[copy] = "vocab"
    for op in f.ops:
        w = s.weight.get(id(op))
        if w is None or w.name in styles:
            continue
        if s.feeds_loss(op) and len(s.users[w]) == 1:
            styles[w.name] = "colwise"
            continue
        rows = s.reached(op)
        if not rows:
            continue
        cols = s.feeding(rows)
        if not cols or op not in cols:
            continue
        names = [s.weight[id(o)].name for o in cols + rows]
        if len(set(names)) != len(names) or any(n in styles for n in names):
            continue
        for c in cols:
            fused = product_split(f, s.users, c) is not None
            styles[s.weight[id(c)].name] = "fused_colwise" if fused else "colwise"
        for r in rows:
            styles[s.weight[id(r)].name] = "rowwise"
    order = [p for p in f.meta["params"] if p in styles]
    entries = tuple(PlanEntry(_escape(p), styles[p], f"plan megatron: %{p} ({styles[p]})")
                    for p in order)
    return Plan("megatron", entries, (), "megatron")
