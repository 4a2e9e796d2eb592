"""Tensor (and sequence) parallelism as a transform: a one-device forward
step and a plan in, the SPMD template of one tensor-parallel rank out.

``TensorParallel(plan, tp, sp)(forward)``:

1. the plan's styles (:mod:`.plans`) become placements on a mesh of one
   axis of ``tp`` devices: the parameters the plan names (a column-wise
   weight ``S(out)``, a row-wise one ``S(in)``, a vocabulary-parallel
   table ``S(0)``), and the few activations a style fixes, as PyTorch's
   ``parallelize_module`` styles do (a fused column-wise weight is split
   block by block, :class:`~distsim.ir.mesh.BlockShard`, the blocks being
   the sizes of the ``split`` of its product): a column-wise layer's input is
   replicated, a row-wise layer's (or a vocabulary-parallel embedding's)
   partial result is summed -- replicated, or with ``sp`` split along the
   sequence (the dim before the features), which puts the norms and
   dropouts between the layers on sequence shards. Data, constants and
   the loss are replicated;
2. the sharding layer propagates them (:func:`~.sharding.propagate`): every
   other value gets the placement its ops' rules derive (a parameter the
   plan leaves out too when it is read with a planned layer's product, a
   bias; otherwise it is replicated), and ``redistribute`` ops appear where
   placements change. Row lookups written as ``gather`` become
   ``embedding`` ops first, whose rule knows vocabulary shards; a
   ``cross_entropy`` of the product of an output layer split over the
   vocabulary is written as Megatron's vocabulary-parallel loss
   (:mod:`.sharding.vocab_loss`); at ``tp`` 1 with ``megatron_loss`` a
   float32 one is written so too, on one rank with no collectives;
3. :mod:`.spmd_template` writes the program of one rank: local shapes,
   SPMD collectives, per-rank attributes, ``spmd.copy`` where gradients
   are shares.

The template's ``meta`` is the forward's plus what
:class:`~distsim.transforms.spmd.LowerSPMD` and
:mod:`~distsim.transforms.zero_numbers` read: ``param_shards`` (``name ->
(dim, blocks)``: rank ``r`` holds the ``r``-th of ``tp`` equal parts of
each block of ``dim``), ``param_global_shapes``, ``tp``, ``sp``, ``plan`` and ``loss``
(the replicated loss). A plan that cannot be honoured is a ConfigError
naming the plan entry or the op.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from ..errors import ConfigError
from ..ir.builder import clone_function
from ..ir.core import Function, Module, Op, Value
from ..ir.mesh import BlockShard, DeviceMesh, DTensorType, Partial, Placement, Replicate, Shard
from ..ir.registry import is_registered, lookup
from ..ir.types import TensorType
from ..ir.verifier import verify
from .expert_parallel import route_sequence_shards
from .plans import Plan, PlanEntry
from .sharding import propagate, verify_sharded
from .sharding.vocab_loss import (float32_losses, vocab_parallel_cross_entropy,
                                  vocab_sharded_losses)
from .spmd_template import spmd_template

AXIS = "tp"


class TensorParallel:
    """The pass (see the module docstring). ``model`` names the model in
    messages."""

    def __init__(self, plan: Plan, tp: int, sp: bool = False, model: str = "the model",
                 megatron_loss: bool = False) -> None:
        self.plan = plan
        self.tp = tp
        self.sp = sp
        self.model = model
        #: at one rank, a float32 loss as Megatron's vocabulary-parallel
        #: steps (:func:`.sharding.vocab_loss.float32_losses`), with no
        #: collectives: where the framework simulated is Megatron-LM
        self.megatron_loss = megatron_loss

    def __call__(self, forward: Function) -> Function:
        params = list(forward.meta["params"])
        styles = self.plan.styles(params, f"model '{self.model}'" if self.model else "the model")
        inputs = {v.name: v for v in reversed(forward.inputs)}     # (the first of a name)
        shapes = {p: (inputs[p] if p in inputs else forward.value_by_name(p)).type.shape
                  for p in params}
        if self.tp == 1:      # nothing to split, but a style that does not fit is refused
            style_placements(forward, styles, 1, False)
            template, _ = clone_function(forward)
            if self.megatron_loss:
                for op in float32_losses(template):
                    vocab_parallel_cross_entropy(template, op)
            shards: Dict[str, Tuple[int, Tuple[int, ...]]] = {}
        else:
            if self.sp:      # each rank routes its sequence shard (Megatron-LM's MoE layer)
                forward = route_sequence_shards(forward, self.tp, self.model)
            placed = place(forward, styles, self.tp, self.sp)
            main = placed.main
            template, _ = spmd_template(main, params, device=_device(forward))
            template.meta = {k: (dict(v) if isinstance(v, dict) else v)
                             for k, v in forward.meta.items()}
            loss = forward.meta.get("loss")
            if loss is not None:
                index = [v.name for v in forward.outputs].index(loss)
                template.meta["loss"] = template.outputs[index].name
            consts = template.meta.get("consts") or {}
            for v in template.inputs:
                if consts.get(v.name, {}).get("kind") == "vocab_pad":
                    consts[v.name] = dict(consts[v.name], shard=v.type.shape[0])
            shards = {}
            for v in main.inputs:
                pl = v.type.placements[0]
                if v.name in shapes and isinstance(pl, Shard):
                    shards[v.name] = (pl.dim, pl.blocks if isinstance(pl, BlockShard)
                                      else (shapes[v.name][pl.dim],))
        template.meta.update(param_shards=shards, param_global_shapes=shapes, tp=self.tp,
                             sp=bool(self.sp and self.tp > 1), plan=self.plan.name)
        return verify(template)


def _device(f: Function) -> Optional[int]:
    devices = f.devices()
    return devices[0] if devices else None


# -- styles -> placements ---------------------------------------------------------
def _matmul_dims(op: Op, v: Value) -> Tuple[Optional[int], Optional[int]]:
    """(output-feature dim, input-feature dim) of weight ``v`` in matmul
    ``op`` (None, None where ``v`` is not its right operand: a matrix, or
    a stack of matrices, one per leading index of the left operand -- a
    mixture of experts' weights)."""
    if op.op_type != "matmul" or len(op.inputs) != 2 or op.inputs[1] is not v \
            or op.inputs[0] is v or not stacked_weight(op.inputs[0], v):
        return None, None
    lead = v.type.rank - 2
    if op.attrs.get("trans_b"):
        return lead, lead + 1
    return lead + 1, lead


def stacked_weight(x: Value, w: Value) -> bool:
    """Whether ``w`` multiplies ``x`` as a linear layer's weight: a matrix,
    or a stack of them over ``x``'s leading dim (experts' weights)."""
    return w.type.rank == 2 or (w.type.rank == 3 and x.type.rank == 3
                                and x.type.shape[0] == w.type.shape[0])


def _sequence(v: Value, tp: int, entry: PlanEntry) -> Placement:
    """The sequence shard of an activation (the dim before the features)."""
    if v.type.rank < 2:
        raise ConfigError(f"{entry.where}: --sp: %{v.name} has no sequence dim to split")
    dim = v.type.rank - 2
    if v.type.shape[dim] % tp:
        raise ConfigError(f"{entry.where}: --sp: --tp {tp} does not divide dim {dim} of "
                          f"%{v.name} (size {v.type.shape[dim]}), the sequence it splits")
    return Shard(dim)


def past_elementwise(users, v: Value) -> Tuple[Optional[Op], Value]:
    """The reader of ``v`` past single-reader, shape-keeping element-wise ops
    (a bias, a mask), and the value it reads; (None, ...) where ``v`` or a
    value on the way has no reader or several."""
    while True:
        readers = users.get(v, [])
        if len(readers) != 1:
            return None, v
        u = readers[0]
        if not (is_registered(u.op_type) and lookup(u.op_type).elementwise) \
                or len(u.outputs) != 1 or u.outputs[0].type.shape != v.type.shape:
            return u, v
        v = u.outputs[0]


def product_split(f: Function, users, op: Op) -> Optional[Op]:
    """The ``split`` of ``op``'s result along its last dim, reached through
    single-reader element-wise ops (a bias); None when there is none."""
    u, v = past_elementwise(users, op.outputs[0])
    if u is None or u.op_type != "split" or u.inputs[0] is not v \
            or int(u.attrs["axis"]) % v.type.rank != v.type.rank - 1:
        return None
    return u


def _past_positions(f: Function, users, v: Value) -> Value:
    """The lookup ``v`` plus what is added to it that does not depend on the
    data (a learned position table): with sequence parallelism the partial
    lookups and a share of the table are summed and reduce-scattered
    together, and the table stays whole (Megatron's, and the GPT builder's,
    layout)."""
    data = {x for x in f.inputs if f.meta.get("roles", {}).get(x.name) == "data"}
    for op in f.ops:
        if any(x in data for x in op.inputs):
            data.update(op.outputs)
    while True:
        readers = users.get(v, [])
        if len(readers) != 1 or readers[0].op_type != "add":
            return v
        add = readers[0]
        other = [x for x in add.inputs if x is not v]
        if len(other) != 1 or other[0] in data or add.outputs[0].type.shape != v.type.shape:
            return v
        v = add.outputs[0]


def _fused_blocks(f: Function, users, op: Op, tp: int, entry: PlanEntry) -> Tuple[int, ...]:
    """The blocks of the fused weight ``op`` multiplies by: the sizes of
    the split of its product; ConfigError naming ``entry`` when there is no
    such split or ``tp`` does not divide a block."""
    split = product_split(f, users, op)
    if split is None:
        raise ConfigError(f"{entry.where}: fused_colwise needs the product %{op.outputs[0].name} "
                          "split into its blocks along the features (a split op after it, "
                          "through a bias at most)")
    blocks = tuple(int(s) for s in split.attrs["sizes"])
    if any(b % tp for b in blocks):
        raise ConfigError(f"{entry.where}: --tp {tp} does not divide every block {list(blocks)} "
                          f"of %{op.inputs[1].name} (as %{split.name} = split cuts its product), "
                          "which fused_colwise splits")
    return blocks


def style_placements(f: Function, styles: Dict[str, PlanEntry], tp: int, sp: bool
                     ) -> Dict[Value, Placement]:
    """The placements ``styles`` fix in ``f`` (see the module docstring);
    ConfigError naming the entry when a style does not fit its parameter."""
    users = f.users()
    by_name = {v.name: v for v in f.inputs}
    fixed: Dict[Value, Placement] = {}
    inputs_replicated: List[Value] = []
    for name, entry in styles.items():
        v = by_name[name]
        readers = users.get(v, [])
        if entry.style == "replicate":
            fixed[v] = Replicate()
            continue
        dims = set()
        blocks: Set[Tuple[int, ...]] = set()
        for op in readers:
            out_dim, in_dim = _matmul_dims(op, v)
            if entry.style == "vocab" and op.op_type in ("embedding", "gather") \
                    and op.inputs[0] is v and int(op.attrs.get("axis", 0)) == 0:
                dims.add(0)
                if sp:
                    summed = _past_positions(f, users, op.outputs[0])
                    fixed.setdefault(summed, _sequence(summed, tp, entry))
                else:
                    fixed.setdefault(op.outputs[0], Replicate())
            elif out_dim is not None and entry.style in ("colwise", "fused_colwise", "vocab"):
                dims.add(out_dim)
                inputs_replicated.append(op.inputs[0])
                if entry.style == "fused_colwise":
                    blocks.add(_fused_blocks(f, users, op, tp, entry))
            elif in_dim is not None and entry.style == "rowwise":
                dims.add(in_dim)
                summed = op.outputs[0]
                fixed.setdefault(summed, _sequence(summed, tp, entry) if sp else Replicate())
            else:
                what = {"colwise": "a matmul's weight", "rowwise": "a matmul's weight",
                        "fused_colwise": "a matmul's weight",
                        "vocab": "an embedding table (or a head multiplying by it)"}
                raise ConfigError(f"{entry.where}: {entry.style} needs %{name} to be "
                                  f"{what[entry.style]}, but op %{op.name} = {op.op_type} reads "
                                  "it")
        if not readers:
            raise ConfigError(f"{entry.where}: %{name} is read by no op")
        if len(dims) > 1:
            raise ConfigError(f"{entry.where}: %{name} is read as a weight along different "
                              f"dims ({sorted(dims)}); it can be split along one")
        dim = dims.pop()
        size = v.type.shape[dim]
        if len(blocks) > 1:
            raise ConfigError(f"{entry.where}: the products of %{name} are split into "
                              f"different blocks ({sorted(blocks)})")
        if blocks:
            fixed[v] = BlockShard(dim, blocks.pop())
            continue
        if size % tp:
            raise ConfigError(f"{entry.where}: --tp {tp} does not divide dim {dim} of %{name} "
                              f"(size {size}), which {entry.style} splits")
        fixed[v] = Shard(dim)
    for x in inputs_replicated:    # a column-wise layer's input: whole on every rank
        # (but for tokens a MoE layer routes too, a shared expert's input:
        # the routing keeps its placement, the layer's readers gather it)
        if x.name not in styles and not any(u.op_type == "moe_dispatch" for u in users[x]):
            fixed[x] = Replicate()
    return fixed


def column_biases(f: Function, fixed: Dict[Value, Placement], params: Set[str]
                  ) -> Dict[Value, Placement]:
    """The biases added to a column-wise layer's product (a 1-D parameter
    the ``add`` reads beside it), split as the product's features (block by
    block under a fused weight), as PyTorch's ``ColwiseParallel`` splits
    the bias with the weight. The placement propagation derives too;
    fixed here so that the propagation does not try each replicated
    (:mod:`.sharding.entry_inputs` rebuilds the whole program per trial:
    a time growing with the square of the layers)."""
    users = f.users()
    found: Dict[Value, Placement] = {}
    for op in f.ops:
        if op.op_type != "matmul" or len(op.inputs) != 2:
            continue
        w, y = op.inputs[1], op.outputs[0]
        pl = fixed.get(w)
        out_dim, _ = _matmul_dims(op, w)
        if out_dim is None or not isinstance(pl, Shard) or pl.dim != out_dim:
            continue
        for u in users.get(y, []):
            b = u.inputs[-1]
            # a bias of the features, or of each stacked layer's (experts x 1 x features)
            stacked = b.type.rank == 3 and b.type.shape == (w.type.shape[0], 1, y.type.shape[-1])
            if u.op_type == "add" and len(u.inputs) == 2 and u.inputs[0] is y \
                    and b.name in params and b not in fixed \
                    and (stacked or b.type.shape == (y.type.shape[-1],)):
                dim = b.type.rank - 1
                found[b] = (BlockShard(dim, pl.blocks) if isinstance(pl, BlockShard)
                            else Shard(dim))
    return found


def attached_params(f: Function, split: Set[Value]) -> Set[Value]:
    """The parameters read together with the direct product of a ``split``
    weight (a bias added to a planned layer's result): they take the
    placement propagation derives from it."""
    producer = f.producers()
    products = {v for op in f.ops if any(x in split for x in op.inputs) for v in op.outputs}
    found: Set[Value] = set()
    for op in f.ops:
        if any(v in products for v in op.inputs):
            found.update(v for v in op.inputs if v not in producer)
    return found


def lookups_as_embeddings(f: Function, tables: Set[str]) -> None:
    """Row lookups of the vocabulary-parallel ``tables`` written as
    ``gather`` (an import's) become ``embedding`` ops, in place: the same
    rows, and the op whose sharding rule looks up ids in a shard of the
    rows (a gather has no such rule)."""
    for i, op in enumerate(f.ops):
        if op.op_type == "gather" and int(op.attrs.get("axis", 0)) == 0 \
                and op.inputs[0].name in tables and op.inputs[0].type.rank == 2 \
                and not op.inputs[1].type.dtype.is_float:
            f.ops[i] = Op("embedding", op.inputs, op.outputs, {"offset": 0}, op.subfunctions,
                          op.meta)


def place(forward: Function, styles: Dict[str, PlanEntry], tp: int, sp: bool) -> Module:
    """The forward on a mesh of ``tp`` devices, propagated from the placements
    the styles fix (plus replicated data, constants and loss). A parameter
    propagation leaves partial is replicated instead (a parameter is stored
    whole or split, never as terms)."""
    f, _ = clone_function(forward)
    for v in f.values():
        v.type = TensorType(v.type.shape, v.type.dtype)
    lookups_as_embeddings(f, {p for p, e in styles.items() if e.style == "vocab"})
    mesh = DeviceMesh(AXIS, (tp,), (AXIS,))
    fixed = style_placements(f, styles, tp, sp)
    params = set(forward.meta["params"])
    attached = attached_params(f, {v for v, pl in fixed.items()
                                   if v.name in params and not isinstance(pl, Replicate)})
    fixed.update(column_biases(f, fixed, params))
    for name, spec in (forward.meta.get("consts") or {}).items():
        if spec.get("kind") == "vocab_pad":
            # the padded vocabulary's mask lies as the vocabulary does: each
            # rank holds its shard's entries (``shard`` per rank, see __call__)
            v = f.value_by_name(name)
            if v.type.shape[0] % tp:
                raise ConfigError(f"tensor parallelism: --tp {tp} does not divide the "
                                  f"{v.type.shape[0]} entries of the vocabulary mask %{name}")
            fixed[v] = Shard(0)
    for v in f.inputs:
        if v not in fixed and (v.name not in params or v not in attached):
            # data and constants: every rank reads the whole batch; a parameter
            # the plan leaves out, away from its layers: whole on every rank
            fixed[v] = Replicate()
    loss = forward.meta.get("loss")
    if loss is not None:
        fixed.setdefault(f.value_by_name(loss), Replicate())
    for op in vocab_sharded_losses(f, fixed):
        # logits split over the vocabulary: Megatron's loss on the shards
        for v in vocab_parallel_cross_entropy(f, op):
            fixed[v] = Replicate()
    for _ in range(len(params) + 1):
        for v, pl in fixed.items():
            v.type = DTensorType(v.type.shape, v.type.dtype, mesh, [pl])
        placed = verify_sharded(propagate(Module({f.name: f}, {mesh.name: mesh}), f.name),
                                propagated=True)
        partial = [v for v, p in zip(f.inputs, placed.main.inputs)
                   if v.name in params and isinstance(p.type.placements[0], Partial)]
        if not partial:
            return placed
        for v in partial:
            fixed[v] = Replicate()
    raise ConfigError("tensor parallelism: propagation keeps placing parameters as partial sums")
