"""Types of DistIR values: element types, tensors placed on one device,
tuples, and sharded tensors on a device mesh.

Types are frozen dataclasses: hashable, comparable by structure, and cheap to
share between values.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from math import prod
from typing import Optional, Tuple

from ..errors import ConfigError


class DType(enum.Enum):
    """Element types, by their short text name."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"
    U8 = "u8"   # raw bytes: a bundle of tensors (distsim.ir.ops_bundle)

    # Members are singletons compared by identity: hash them by identity in
    # C (Enum's own __hash__ is a Python call, paid on every cache lookup
    # keyed by a dtype).
    __hash__ = object.__hash__

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F16, DType.BF16, DType.F32, DType.F64)

    @property
    def numpy_name(self) -> str:
        """The numpy dtype the reference executor computes this type in
        (bf16 has no numpy type: computed in float32)."""
        return _NUMPY[self]

    @classmethod
    def parse(cls, text: str) -> "DType":
        """Accept the text name and the common aliases (fp16, float32, ...)."""
        key = text.strip().lower()
        key = _ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise ConfigError(f"unknown dtype '{text}' (expected one of {names})") from None

    def __str__(self) -> str:
        return self.value


_ITEMSIZE = {DType.F16: 2, DType.BF16: 2, DType.F32: 4, DType.F64: 8,
             DType.I32: 4, DType.I64: 8, DType.BOOL: 1, DType.U8: 1}
_DTYPE_CODE = {d: i for i, d in enumerate(DType)}

def parse_float_dtype(name: str, value: object) -> DType:
    """The floating-point dtype a model field names (``name`` goes in the
    error): a model does not train in an integer type, and a value that is
    not text would crash the parser. One ConfigError naming the field
    otherwise."""
    if not isinstance(value, str):
        raise ConfigError(f"{name}: must be a dtype name such as bf16, got {value!r}")
    try:
        dtype = DType.parse(value)
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from None
    if not dtype.is_float:
        raise ConfigError(f"{name}: must be a floating-point dtype (f16, bf16, f32, f64), "
                          f"got {value!r}")
    return dtype


_NUMPY = {DType.F16: "float16", DType.BF16: "float32", DType.F32: "float32",
          DType.F64: "float64", DType.I32: "int32", DType.I64: "int64", DType.BOOL: "bool",
          DType.U8: "uint8"}
_ALIASES = {"fp16": "f16", "float16": "f16", "half": "f16", "fp32": "f32", "float32": "f32",
            "float": "f32", "fp64": "f64", "float64": "f64", "double": "f64",
            "bfloat16": "bf16", "int32": "i32", "int64": "i64", "long": "i64", "uint8": "u8"}


class Type:
    """Base class of every value type."""

    @property
    def size_bytes(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class TensorType(Type):
    """A dense tensor of ``shape`` and ``dtype`` that lives on one device
    (``device`` is a rank; ``None`` for a program not yet placed)."""

    shape: Tuple[int, ...]
    dtype: DType
    device: Optional[int] = None

    def __post_init__(self) -> None:
        shape = self.shape
        # hot path: builders pass tuples of ints already
        if type(shape) is not tuple or not all(type(d) is int for d in shape):
            object.__setattr__(self, "shape", tuple(int(d) for d in shape))

    # Types are keys of the shape-rule and cost caches, hashed millions of
    # times in a large program: the hash (and the size) are computed once.
    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            dev = self.device
            h = hash((self.shape, _DTYPE_CODE[self.dtype], -1 if dev is None else dev))
            # kept only when made of ints, so the same in every process (a
            # pickled type carries it)
            if dev is None or type(dev) is int:
                object.__setattr__(self, "_hash", h)
        return h

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def size_bytes(self) -> int:
        n = self.__dict__.get("_size")
        if n is None:
            n = prod(self.shape) * _ITEMSIZE[self.dtype]
            object.__setattr__(self, "_size", n)
        return n

    def __str__(self) -> str:
        """The text-format spelling, e.g. ``f32[64,128]@0``."""
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.dtype.value}[{dims}]" + ("" if self.device is None else f"@{self.device}")

    def with_device(self, device: Optional[int]) -> "TensorType":
        return TensorType(self.shape, self.dtype, device)

    def with_shape(self, shape: Tuple[int, ...]) -> "TensorType":
        return TensorType(tuple(shape), self.dtype, self.device)

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(self.shape, dtype, self.device)


@dataclass(frozen=True)
class TupleType(Type):
    """A tuple of types (used by ops that produce grouped results)."""

    types: Tuple[Type, ...]

    @property
    def size_bytes(self) -> int:
        return sum(t.size_bytes for t in self.types)


def scalar(dtype: DType = DType.F32, device: Optional[int] = None) -> TensorType:
    """A rank-0 tensor."""
    return TensorType((), dtype, device)
