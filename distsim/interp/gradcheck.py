"""Central finite differences of a function's first output, the reference
gradients of autodiff tests."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.core import Function
from .numpy_executor import execute


def finite_difference(f: Function, inputs: Sequence[np.ndarray], index: int,
                      eps: float = 1e-6) -> np.ndarray:
    """d outputs[0] / d inputs[index] (outputs[0] a scalar), by central
    differences in the inputs' precision (use float64)."""
    base = [np.array(a) for a in inputs]
    grad = np.zeros_like(base[index], dtype=np.float64)
    it = np.nditer(base[index], flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[index][i] += eps
        minus[index][i] -= eps
        grad[i] = (execute(f, plus)[0] - execute(f, minus)[0]) / (2 * eps)
    return grad
