"""DistIR: types, values, ops, functions, the op registry and the verifier."""
from . import ops as _ops  # noqa: F401  (registers the compute ops)
from . import ops_comm as _ops_comm  # noqa: F401  (registers the communication ops)
from . import ops_onnx as _ops_onnx  # noqa: F401  (registers the ops of the ONNX importer)
from . import ops_nn as _ops_nn, ops_spmd as _ops_spmd  # noqa: F401  (nn and SPMD ops)
from . import mesh, ops_call, ops_shard  # noqa: F401  (meshes, placements, call, redistribute)
from . import ops_bundle as _ops_bundle, ops_fused as _ops_fused  # noqa: F401  (coarsening)
from . import ops_moe as _ops_moe  # noqa: F401  (mixture-of-experts dispatch and combine)
from .builder import FunctionBuilder, NameScope
from .comm import REDUCE_OPS, CollectiveType, collective_of, io_ranks, is_communication, team
from .core import Function, Module, Op, Value
from .registry import OpSpec, ShapeError, all_op_types, infer_types, lookup, register
from .types import DType, TensorType, TupleType, Type, scalar
from .verifier import verify, verify_module

__all__ = [
    "FunctionBuilder", "NameScope", "REDUCE_OPS", "CollectiveType", "collective_of", "io_ranks",
    "is_communication", "team", "Function", "Module", "Op", "Value", "OpSpec", "ShapeError",
    "all_op_types", "infer_types", "lookup", "register", "DType", "TensorType", "TupleType",
    "Type", "scalar", "verify", "verify_module",
]
