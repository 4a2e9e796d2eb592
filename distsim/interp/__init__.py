"""Running functions: one Interpreter walker; NumpyExecutor and ShapeInference."""
from . import kernels_nn as _kernels_nn  # noqa: F401  (kernels of the nn ops)
from . import kernels_onnx as _kernels_onnx  # noqa: F401  (kernels of the ONNX importer ops)
from . import kernels_shard as _kernels_shard  # noqa: F401  (kernels of shard_slice, redistribute)
from . import kernels_moe as _kernels_moe  # noqa: F401  (mixture-of-experts dispatch and combine)
from .interpreter import Interpreter
from .kernels import KERNELS, kernel
from .numpy_executor import NumpyExecutor, execute, random_inputs
from .shape_inference import ShapeInference, infer_function_types

__all__ = ["Interpreter", "KERNELS", "kernel", "NumpyExecutor", "execute", "random_inputs",
           "ShapeInference", "infer_function_types"]
