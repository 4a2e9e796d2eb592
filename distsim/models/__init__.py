"""Model builders and the model registry (``models/*.yaml`` and families)."""
from . import mlp_family as _mlp_family  # noqa: F401  (registers the mlp family)
from . import gpt_family as _gpt_family  # noqa: F401  (registers the gpt family)
from . import onnx_family as _onnx_family  # noqa: F401  (registers the onnx family)
from .mlp import MLPConfig, mlp_forward, mlp_training_step
from .registry import (FAMILIES, ModelFamily, available_models, check_batch_options, family_of,
                       load_model_config, register_family)

__all__ = ["MLPConfig", "mlp_forward", "mlp_training_step", "FAMILIES", "ModelFamily",
           "available_models", "check_batch_options", "family_of", "load_model_config",
           "register_family"]
