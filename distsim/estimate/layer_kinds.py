"""Models whose layers are of two kinds: dense layers and mixture-of-experts
layers (:mod:`distsim.models.moe`: ``dense_layers``, ``moe_every``).

A profile (:mod:`.profile`) measures one representative layer of a
two-layer template whose layers are alike. A model that mixes the two kinds
gets a profile per kind -- the template of the model with every layer dense
(its MLPs of ``ffn``), and the template with every layer routing to
experts -- merged into one (:func:`merge_kinds`): the dense layer's block
:data:`~.blocks.LAYER`, the MoE layer's :data:`~.blocks.MOE`, the embedding's
from the template of the first layer's kind, the head's from that of the last
layer's kind; :attr:`~.blocks.LayerProfile.layer_blocks` names each model
layer's block. A model whose layers are all of one kind (a dense GPT,
Mixtral's every layer MoE) keeps its own single template.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from ..models.gpt import GPTConfig
from ..models.moe import DENSE_DEFAULTS, is_moe_layer
from .blocks import EMB, HEAD, LAYER, MOE, Block, LayerProfile, Param

__all__ = ["dense_variant", "layer_blocks", "merge_kinds", "moe_variant", "probe_layers"]


def layer_blocks(c: GPTConfig) -> Optional[Tuple[str, ...]]:
    """Each layer's block (:data:`LAYER` dense, :data:`MOE` routed to
    experts) where ``c`` mixes the two kinds; None where its layers are
    all alike (one template stands for all of them)."""
    kinds = tuple(MOE if is_moe_layer(c, i) else LAYER for i in range(c.layers))
    return kinds if len(set(kinds)) > 1 else None


def dense_variant(c: GPTConfig) -> GPTConfig:
    """``c`` with every layer dense: its dense layers' template."""
    return replace(c, experts=0, **DENSE_DEFAULTS)


def moe_variant(c: GPTConfig) -> GPTConfig:
    """``c`` with every layer routed to experts: its MoE layers' template."""
    return replace(c, dense_layers=0, moe_every=1)


def probe_layers(c: GPTConfig) -> int:
    """The fewest leading layers of ``c`` that hold a layer of each of its
    kinds: a forward of that many shows every kind's parameters (as
    :func:`~distsim.transforms.zero.check_shardable` reads them, the
    first refused is among them)."""
    kinds = [is_moe_layer(c, i) for i in range(c.layers)]
    return max(kinds.index(k) for k in set(kinds)) + 1


def _renamed(blk: Block) -> Block:
    """A block of the all-MoE template whose parameter owners name the
    template's layer (:data:`LAYER`) renamed :data:`MOE`."""
    def owners(pairs: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
        return [(MOE if owner == LAYER else owner, i) for owner, i in pairs]
    return replace(blk, f_gather=owners(blk.f_gather), b_gather=owners(blk.b_gather))


def merge_kinds(dense: LayerProfile, moe: LayerProfile, blocks: Tuple[str, ...]
                ) -> LayerProfile:
    """One profile of a model whose layers' blocks are ``blocks`` from the
    profiles of its dense variant (``dense``) and MoE variant (``moe``),
    both kept unchanged (see the module docstring)."""
    first = dense if blocks[0] == LAYER else moe
    last = dense if blocks[-1] == LAYER else moe

    def merged_blocks(part: str) -> Dict[str, Block]:
        """The blocks of ``part`` ("blocks"; "weight": a split backward's
        weight-gradient parts, ZB-H1) of the merged profile."""
        def take(profile: LayerProfile, name: str) -> Block:
            blk = getattr(profile, part)[name]
            return _renamed(blk) if profile is moe else blk
        if not getattr(moe, part):
            return {}
        return {EMB: take(first, EMB), LAYER: take(dense, LAYER),
                MOE: _renamed(getattr(moe, part)[LAYER]),
                HEAD: take(last, HEAD)}

    params: Dict[str, List[Param]] = {
        EMB: first.params[EMB], LAYER: dense.params[LAYER],
        MOE: [replace(p, block=MOE) for p in moe.params[LAYER]], HEAD: last.params[HEAD]}
    order = ([(b, i) for b, i in first.param_order if b == EMB]
             + [(LAYER, i) for i in range(len(params[LAYER]))]
             + [(MOE, i) for i in range(len(params[MOE]))]
             + [(b, i) for b, i in last.param_order if b == HEAD])
    costs: Dict[str, Any] = {EMB: first.partition_costs.get(EMB, 0.0),
                             LAYER: dense.partition_costs.get(LAYER, 0.0),
                             MOE: moe.partition_costs.get(LAYER, 0.0),
                             HEAD: last.partition_costs.get(HEAD, 0.0)}
    return replace(moe, blocks=merged_blocks("blocks"), weight=merged_blocks("weight"),
                   params=params, param_order=order,
                   partition_costs=costs, wall_s=dense.wall_s + moe.wall_s,
                   data_emb=first.data_emb, data_head=last.data_head, layer_blocks=blocks)
