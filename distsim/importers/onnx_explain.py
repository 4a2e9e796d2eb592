"""Explaining shape errors of the ONNX importer: a mixin of
:class:`~distsim.importers.onnx.OnnxImporter`.

The usual cause of a shape error in a real export is a sequence longer
than the model's positions table: the exporter slices the position ids by
the sequence length (ONNX clamps a Slice past the end, so the error comes
later, as a broadcast) or gathers rows past the table's end. These helpers
recognise both and say so; any other shape error names the graph input
shapes in use.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..errors import VerifyError
from .onnx_ops import OnnxNode


class ShapeHints:
    """Needs ``type_of``, ``const``, ``where``, ``b`` (the builder),
    ``roles``, ``onnx_names`` and ``producer`` (ONNX name -> node) from the
    importer."""

    clamped: Dict[str, Tuple[str, str, int, int, int]]
    producer: Dict[str, Any]

    def note_clamp(self, node: OnnxNode) -> None:
        """Remember a Slice that asks for more than its input holds along an
        axis (ONNX clamps the end): a sequence longer than a positions table
        sliced by the sequence length shows up later as a broadcast error."""
        try:
            shape = self.type_of(node.inputs[0]).shape
            if node.opset < 10:
                starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
                steps = None
            else:
                starts, ends, axes, steps = (None if i >= len(node.inputs) or not node.inputs[i]
                                             else self.const(node.inputs[i])
                                             for i in range(1, 5))
            if starts is None or ends is None:
                return
            ends = [int(e) for e in np.asarray(ends).reshape(-1)]
            axes = list(range(len(ends))) if axes is None else \
                [int(a) for a in np.asarray(axes).reshape(-1)]
            steps = [1] * len(ends) if steps is None else \
                [int(t) for t in np.asarray(steps).reshape(-1)]
        except (KeyError, IndexError, TypeError, ValueError):
            return
        for axis, end, step in zip(axes, ends, steps):
            size = shape[axis % len(shape)] if shape else 0
            # INT64_MAX / INT32_MAX ends mean "to the end": not a request
            if step > 0 and size < end < (1 << 30):
                self.clamped[node.outputs[0]] = (node.label, node.inputs[0], axis % len(shape),
                                                 end, size)
                return

    def input_shapes_text(self) -> str:
        return ", ".join(f"{self.onnx_names.get(v.name, v.name)} "
                         f"{'x'.join(str(d) for d in v.type.shape) or 'scalar'}"
                         for v in self.b.function.inputs if self.roles.get(v.name) == "data")

    def sequence_hint(self, needed: int, available: int) -> Optional[str]:
        """'the sequence length N (input ...) exceeds the model's M positions'
        when ``needed`` is a non-batch dim of a graph input."""
        for v in self.b.function.inputs:
            if self.roles.get(v.name) == "data" and needed in v.type.shape[1:]:
                shape = "x".join(str(d) for d in v.type.shape)
                return (f"the sequence length {needed} (input "
                        f"'{self.onnx_names.get(v.name, v.name)}' {shape}) exceeds the model's "
                        f"{available} positions")
        return None

    def shape_error(self, node: OnnxNode, error: Exception) -> VerifyError:
        """A VerifyError naming the node, with the likely cause when a
        clamped Slice feeds it (a sequence longer than the model's
        positions), else the graph input shapes in use."""
        seen, stack = set(), [i for i in node.inputs if i]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.clamped:
                label, sliced, axis, end, size = self.clamped[name]
                cause = self.sequence_hint(end, size) or f"asked for {end}"
                return VerifyError(f"{self.where(node)}: {error}: {cause} (Slice '{label}' "
                                   f"takes only {size} of '{sliced}' along axis {axis})")
            producer = self.producer.get(name)
            if producer is not None:
                stack.extend(i for i in producer.input if i)
        return VerifyError(f"{self.where(node)}: {error} (graph inputs: "
                           f"{self.input_shapes_text() or 'none'})")

