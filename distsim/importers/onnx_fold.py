"""Constant folding for the ONNX importer: a node whose inputs are all
known at import time (shape arithmetic: Shape -> Gather -> Concat ->
Reshape, Range, masks, ...) is evaluated with ``onnx.reference`` under the
model's own opset, so that every op the reference implements folds with
ONNX's exact semantics. ``NUMPY_FOLDS`` replaces the reference where it is
wrong (GatherElements with more than 64 entries along the axis, onnx 1.23)."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator


def _gather_elements(attrs, data, idx):
    axis = attrs.get("axis", 0) % data.ndim
    return [np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx), axis)]


NUMPY_FOLDS: Dict[str, Callable[..., List[np.ndarray]]] = {"GatherElements": _gather_elements}


def fold_node(node: onnx.NodeProto, inputs: Dict[str, np.ndarray],
              opset_imports: Sequence[onnx.OperatorSetIdProto]) -> List[np.ndarray]:
    """The outputs of ``node`` on the constant ``inputs`` (by name)."""
    if node.op_type in NUMPY_FOLDS and node.domain in ("", "ai.onnx"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return NUMPY_FOLDS[node.op_type](attrs, *(inputs[i] for i in node.input if i))
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                  a.shape) for name, a in inputs.items()]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in node.output if o]
    graph = helper.make_graph([node], "fold", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=list(opset_imports))
    results = ReferenceEvaluator(model).run(None, dict(inputs))
    named = dict(zip([o for o in node.output if o], results))
    return [np.asarray(named[o]) if o else None for o in node.output]
