"""Transforms: autodiff, optimizers and the parallel strategies."""
from . import grad_rules_nn as _grad_rules_nn  # noqa: F401  (gradients of the nn ops)
from . import grad_rules_onnx as _grad_rules_onnx  # noqa: F401  (ONNX importer ops)
from . import grad_rules_moe as _grad_rules_moe  # noqa: F401  (mixture-of-experts ops)
