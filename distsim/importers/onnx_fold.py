"""Constant folding for the ONNX importer: a node whose inputs are all
known at import time (shape arithmetic: Shape -> Gather -> Concat ->
Reshape, Range, masks, ...) is evaluated with ``onnx.reference`` under the
model's own opset, so that every op the reference implements folds with
ONNX's exact semantics. ``NUMPY_FOLDS`` replaces the reference where it is
wrong (GatherElements with more than 64 entries along the axis, onnx 1.23).

Folding allocates its result, so :func:`fold_output_numel` first finds the
size of every output without evaluating (ONNX shape inference on the node
with its constant inputs as initializers, exact arithmetic for ``Range``):
a few scalars can ask ``Range``, ``Tile``, ``Expand``, ``OneHot`` or
``Pad`` for gigabytes, and the importer must not try to allocate them
(see ``FOLD_OUTPUT_LIMIT``)."""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator

from ..errors import VerifyError
from .onnx_ops import FOLD_ONLY


def _gather_elements(attrs, data, idx):
    axis = attrs.get("axis", 0) % data.ndim
    return [np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx), axis)]


NUMPY_FOLDS: Dict[str, Callable[..., List[np.ndarray]]] = {"GatherElements": _gather_elements}

# The most elements one constant computed at import time may have. Folding
# really allocates the result in numpy, and its size may depend on the data
# (Range's limit, Tile's repeats, Expand's shape, OneHot's depth, Pad's
# pads): a tiny model could otherwise make the importer allocate gigabytes
# or exhaust the machine's memory. 2**26 elements (512 MiB at 8 bytes) is
# generous: a (1, 1, 8192, 8192) causal mask, as large as the masks real
# exports compute, still folds. Past it, an op that also runs at run time
# (Expand, Where, Add, ...) is kept as an op of the program; an op supported
# only on constants (Range, Tile, ...) is refused by name.
FOLD_OUTPUT_LIMIT = 1 << 26


def fold_fits(node: onnx.NodeProto, inputs: Dict[str, np.ndarray],
              opset_imports: Sequence[onnx.OperatorSetIdProto], where: str) -> bool:
    """Whether folding ``node`` makes constants of at most FOLD_OUTPUT_LIMIT
    elements. A larger one is not allocated: an op that also runs at run
    time stays an op of the program (say, a mask Expand-ed to batch x heads
    x seq x seq); one supported only on constants (Range, Tile, ...) is
    refused, naming the node (``where``) and the size."""
    numel = fold_output_numel(node, inputs, opset_imports)
    if numel is None or numel <= FOLD_OUTPUT_LIMIT:
        return True
    if node.op_type in FOLD_ONLY:
        raise VerifyError(f"{where}: its output would have {numel:,} elements, more than the "
                          f"{FOLD_OUTPUT_LIMIT:,} a constant computed at import time may have")
    return False


def fold_output_numel(node: onnx.NodeProto, inputs: Dict[str, np.ndarray],
                      opset_imports: Sequence[onnx.OperatorSetIdProto]) -> Optional[int]:
    """The number of elements of the largest output of ``node`` on the
    constant ``inputs``, found without evaluating it; None when it cannot be
    told: a malformed node (evaluating it then says what is wrong) or an
    output past 2**63 elements (which numpy refuses before allocating)."""
    if node.op_type == "Range":
        return _range_numel(node, inputs)
    initializers = [numpy_helper.from_array(np.asarray(a), name) for name, a in inputs.items()]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
               for o in node.output if o]
    graph = helper.make_graph([node], "size", [], outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=list(opset_imports))
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # a node shape inference cannot read: let the evaluation report it
        return None
    largest: Optional[int] = None
    for out in inferred.graph.output:
        tt = out.type.tensor_type if out.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        dims = tt.shape.dim
        if not all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
            continue  # unknown, or an int64 overflow (more than numpy can allocate)
        numel = math.prod(int(d.dim_value) for d in dims)
        largest = numel if largest is None else max(largest, numel)
    return largest


def _range_numel(node: onnx.NodeProto, inputs: Dict[str, np.ndarray]) -> Optional[int]:
    """ceil((limit - start) / delta), in exact integers for integer inputs
    (shape inference gets 0 for a span past 2**63 or an infinite limit)."""
    try:
        start, limit, delta = (np.asarray(inputs[name]).reshape(-1)[0].item()
                               for name in node.input[:3])
        if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
            count = -((start - limit) // delta)
        else:
            count = math.ceil((limit - start) / delta)
    except (ArithmeticError, ValueError, KeyError, IndexError):  # a zero or non-finite
        return None                                                # step: evaluation says
    return max(int(count), 0)


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
