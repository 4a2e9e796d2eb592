"""Constant folding for the ONNX importer: a node whose inputs are all
known at import time (shape arithmetic: Shape -> Gather -> Concat ->
Reshape, Range, masks, ...) is evaluated with ``onnx.reference`` under the
model's own opset, so that every op the reference implements folds with
ONNX's exact semantics."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator


def fold_node(node: onnx.NodeProto, inputs: Dict[str, np.ndarray],
              opset_imports: Sequence[onnx.OperatorSetIdProto]) -> List[np.ndarray]:
    """The outputs of ``node`` on the constant ``inputs`` (by name)."""
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                  a.shape) for name, a in inputs.items()]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in node.output if o]
    graph = helper.make_graph([node], "fold", graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=list(opset_imports))
    results = ReferenceEvaluator(model).run(None, dict(inputs))
    named = dict(zip([o for o in node.output if o], results))
    return [np.asarray(named[o]) if o else None for o in node.output]
