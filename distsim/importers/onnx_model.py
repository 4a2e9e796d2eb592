"""Reading an ONNX file: the model proto, its element types, its names as
DistIR names, and the opsets the importer (:mod:`.onnx`) was checked
against."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Tuple, Union

import onnx
from onnx import TensorProto

from ..errors import ConfigError, ParseError, UnsupportedOpError
from ..ir.types import DType
from ..paths import not_found_hint, resolve

ONNX_DTYPES = {TensorProto.FLOAT: DType.F32, TensorProto.FLOAT16: DType.F16,
               TensorProto.BFLOAT16: DType.BF16, TensorProto.DOUBLE: DType.F64,
               TensorProto.INT32: DType.I32, TensorProto.INT64: DType.I64,
               TensorProto.BOOL: DType.BOOL}
MIN_OPSET = 9
# The newest ai.onnx opset the op table was checked against: onnx 1.23's
# schemas, in which opsets 19-28 changed only element types and optional
# attributes for the ops of the table (tests/importers/test_onnx_opset_checks.py
# fails when an installed onnx changes one of them past this). A newer
# opset is imported with these definitions, after a warning.
NEWEST_OPSET = 28

ModelSource = Union[str, Path, bytes, onnx.ModelProto]


def dtype_of_onnx(elem_type: int, where: str) -> DType:
    try:
        return ONNX_DTYPES[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() \
            else str(elem_type)
        raise UnsupportedOpError(f"{where}: element type {name} is not supported "
                                 f"(supported: float, float16, bfloat16, double, int32, int64, "
                                 f"bool)") from None


def sanitize_name(name: str) -> str:
    """An ONNX name as a DistIR value name (``[A-Za-z0-9_][A-Za-z0-9_.-]*``)."""
    if isinstance(name, bytes):  # protobuf hands back invalid UTF-8 as bytes
        name = name.decode("utf-8", errors="replace")
    text = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).strip("_")
    return text if text and text[0] not in ".-" else f"v{text}"


def load_onnx_model(source: ModelSource) -> Tuple[onnx.ModelProto, str, Optional[str]]:
    """(model, source name, folder of external data). External data is not
    loaded: only shapes matter, and int constants are read on demand."""
    if isinstance(source, onnx.ModelProto):
        return source, "<model>", None
    if isinstance(source, (bytes, bytearray)):
        data, name, base = bytes(source), "<bytes>", None
    else:
        path = resolve("models", str(source), ".onnx")   # a path, or a name in models/
        name, base = str(path), str(path.parent)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found"
                              f"{not_found_hint('models', str(source), '.onnx')}") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e}") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ParseError(f"not an ONNX model, or truncated ({type(e).__name__}: {e})",
                         source=name) from None
    if not model.HasField("graph") or not (model.graph.node or model.graph.output):
        raise ParseError("not an ONNX model (no graph with nodes or outputs)", source=name)
    return model, name, base


class OnnxOpsetWarning(UserWarning):
    """A model's opset is newer than the importer was checked against."""


def newest_checked_opset() -> int:
    """NEWEST_OPSET, or the installed onnx's newest opset when older (its
    reference evaluator folds the constants)."""
    return min(NEWEST_OPSET, onnx.defs.onnx_opset_version())
