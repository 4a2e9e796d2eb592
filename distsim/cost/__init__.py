"""Cost: device specs, FLOP counts, the roofline cost model."""
from . import flops_nn as _flops_nn  # noqa: F401  (FLOPs of the nn ops)
from . import flops_onnx as _flops_onnx  # noqa: F401  (FLOPs of the ONNX importer ops)
from . import flops_moe as _flops_moe  # noqa: F401  (FLOPs of the mixture-of-experts ops)
from .device import DeviceSpec, device_spec_from_dict
from .flops import FLOP_RULES, FLOPS_PER_ELEMENT, flop_rule, op_flops, op_memory_bytes
from .model import CostModel, OpCost

__all__ = ["DeviceSpec", "device_spec_from_dict", "FLOP_RULES", "FLOPS_PER_ELEMENT", "flop_rule",
           "op_flops", "op_memory_bytes", "CostModel", "OpCost"]
