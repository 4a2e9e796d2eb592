"""Differential check: a global-view module against its lowering, on the
same random inputs, value by value and device by device (``distsim
check``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...interp.numpy_executor import NumpyExecutor, random_inputs
from ...ir.core import Function, Module
from .arrays import first_wrong_piece, local_inputs


@dataclass
class CheckResult:
    """``ok``; else the first value (in program order) whose pieces differ
    from the global program's, the first rank holding a wrong piece, and
    by how much."""

    ok: bool
    values_compared: int
    first_difference: Optional[str] = None
    max_abs_error: float = 0.0
    rank: Optional[int] = None

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.values_compared} values agree"
        return (f"differ: first at %{self.first_difference} on rank {self.rank} "
                f"(max abs error {self.max_abs_error:.3g}, {self.values_compared} values compared)")


#: a float dtype's values may differ by this many units of its precision
#: (eps times the value's largest magnitude): a sharded reduction adds its
#: terms in another order, and each rounds
ROUNDING_UNITS = 4


def tolerance(want: np.ndarray, rtol: float, atol: float) -> Tuple[float, float]:
    """(rtol, atol) for comparing with ``want``: at least ``ROUNDING_UNITS``
    eps of its dtype, relative and of its largest magnitude (f16 rounds
    at 1e-3: a check at 1e-4 would report the order of a sum)."""
    if want.dtype.kind != "f" or want.size == 0:
        return rtol, atol
    eps = float(np.finfo(want.dtype).eps) * ROUNDING_UNITS
    scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
    return max(rtol, eps), max(atol, eps * scale)


def check_lowering(module: Module, local: Function, entry: str = "main", seed: int = 0,
                   rtol: float = 1e-4, atol: float = 1e-5,
                   overrides: Optional[Dict[str, np.ndarray]] = None) -> CheckResult:
    """Run ``module``'s entry function and ``local`` on random inputs
    (``overrides`` by input name, e.g. a positive variance) and compare
    every value ``local.meta['sharding']`` records, on every device: each
    replica, each shard, partial terms reduced. A partial input is fed as
    random terms on every device (their reduction is the input)."""
    f = module.functions[entry]
    inputs = random_inputs(f, seed, overrides)
    glob = NumpyExecutor()
    glob.run(f, inputs)
    record = local.meta["sharding"]
    loc = NumpyExecutor()
    loc.run(local, local_inputs(local.inputs, record, {v.name: a for v, a in zip(f.inputs, inputs)},
                                np.random.default_rng((seed, 1))))
    local_env = {v.name: a for v, a in loc.env.items()}
    compared = 0
    for v in f.values():
        if v.name not in record:
            continue
        t, names = record[v.name]
        pieces = dict(zip(t.mesh.all_coords(), (local_env[n] for n in names)))
        want = np.asarray(glob.env[v])
        r, a = tolerance(want, rtol, atol)
        compared += 1
        wrong = first_wrong_piece(pieces, t, want,
                                  lambda got, exp: np.allclose(got, exp, rtol=r, atol=a))
        if wrong is not None:
            coords, err = wrong
            return CheckResult(False, compared, v.name, err, t.mesh.rank_at(coords))
    return CheckResult(True, compared)


def global_outputs(module: Module, inputs: List[np.ndarray],
                   entry: str = "main") -> List[np.ndarray]:
    return NumpyExecutor().run(module.functions[entry], inputs)
