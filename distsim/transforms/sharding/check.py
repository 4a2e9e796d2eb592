"""Differential check: a global-view module against its lowering, on the
same random inputs, value by value (``distsim check``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from ...interp.numpy_executor import NumpyExecutor, random_inputs
from ...ir.core import Function, Module
from .arrays import assemble, local_inputs


@dataclass
class CheckResult:
    """``ok``; else the first value (in program order) whose assembled
    shards differ from the global program's, and by how much."""

    ok: bool
    values_compared: int
    first_difference: Optional[str] = None
    max_abs_error: float = 0.0

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.values_compared} values agree"
        return (f"differ: first at %{self.first_difference} "
                f"(max abs error {self.max_abs_error:.3g}, {self.values_compared} values compared)")


def check_lowering(module: Module, local: Function, entry: str = "main", seed: int = 0,
                   rtol: float = 1e-4, atol: float = 1e-5,
                   overrides: Optional[Dict[str, np.ndarray]] = None) -> CheckResult:
    """Run ``module``'s entry function and ``local`` on random inputs
    (``overrides`` by input name, e.g. a positive variance) and compare
    every value ``local.meta['sharding']`` records."""
    f = module.functions[entry]
    inputs = random_inputs(f, seed, overrides)
    glob = NumpyExecutor()
    glob.run(f, inputs)
    record = local.meta["sharding"]
    loc = NumpyExecutor()
    loc.run(local, local_inputs(local.inputs, record, {v.name: a for v, a in zip(f.inputs, inputs)}))
    local_env = {v.name: a for v, a in loc.env.items()}
    compared = 0
    for v in f.values():
        if v.name not in record:
            continue
        t, names = record[v.name]
        pieces = dict(zip(t.mesh.all_coords(), (local_env[n] for n in names)))
        got = assemble(pieces, t)
        want = np.asarray(glob.env[v])
        compared += 1
        if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
            return CheckResult(False, compared, v.name, err)
    return CheckResult(True, compared)


def global_outputs(module: Module, inputs: List[np.ndarray], entry: str = "main") -> List[np.ndarray]:
    return NumpyExecutor().run(module.functions[entry], inputs)
