"""Where the estimator's parameters are: every parameter of a configuration
with its pipeline stage, in the step's parameter order (the order the
optimizer updates them), and per stage how many of each kind it holds (a
layer's parameters once per layer of the stage). The same for every point
with the same layout: worked out once per layout (a mixin of
:class:`~.timeline.Builder`).
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

from .profile import EMB, HEAD, LAYER

if TYPE_CHECKING:     # pragma: no cover - for the annotations only
    from .profile import LayerProfile, Param


@lru_cache(maxsize=256)
def _all_params(emb: Tuple[int, ...], per_layer: int, layer_stages: Tuple[int, ...],
                head: Tuple[int, ...], last_stage: int) -> Tuple[Tuple[tuple, int], ...]:
    """:meth:`Builder.all_params` of a layout (the same for many points)."""
    out = [((EMB, None, i), 0) for i in emb]
    for layer, stage in enumerate(layer_stages):
        out.extend(((LAYER, layer, i), stage) for i in range(per_layer))
    out.extend(((HEAD, None, i), last_stage) for i in head)
    return tuple(out)


@lru_cache(maxsize=256)
def _param_counts(emb: Tuple[int, ...], per_layer: int, layer_stages: Tuple[int, ...],
                  head: Tuple[int, ...], last_stage: int) -> Tuple[Dict[Tuple[str, int], int], ...]:
    """:meth:`Builder.param_counts` of a layout."""
    counts: List[Dict[Tuple[str, int], int]] = [{} for _ in range(1 + max((0, last_stage,
                                                                         *layer_stages)))]
    for (block, _, i), stage in _all_params(emb, per_layer, layer_stages, head, last_stage):
        counts[stage][(block, i)] = counts[stage].get((block, i), 0) + 1
    return tuple(counts)


class ParamLayout:
    """The parameters of :class:`~.timeline.Builder` (a mixin: it
    uses the builder's profile, chunks and ``stage_of``)."""

    profile: "LayerProfile"
    chunks: int
    chunk_of_layer: Sequence[int]

    def param(self, key: tuple) -> "Param":
        return self.profile.params[key[0]][key[2]]

    def all_params(self) -> Sequence[Tuple[tuple, int]]:
        """Every parameter with its stage, in the step's parameter order."""
        return _all_params(*self._params_layout())

    def param_counts(self) -> Sequence[Dict[Tuple[str, int], int]]:
        """Per stage, how many of its parameters are each (block, index in
        the block) (a layer's parameters once per layer of the stage)."""
        return _param_counts(*self._params_layout())

    def _params_layout(self) -> tuple:
        order = self.profile.param_order
        return (tuple(i for block, i in order if block == EMB), len(self.profile.params[LAYER]),
                tuple(self.stage_of(c) for c in self.chunk_of_layer),
                tuple(i for block, i in order if block == HEAD), self.stage_of(self.chunks - 1))
