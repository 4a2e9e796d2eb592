"""The op registry: for every op type, its signature (arity, attributes)
and its shape rule.

Higher layers keep their own tables keyed by the same op type (numpy kernels
in ``interp``, FLOP counts in ``cost``, gradients in ``transforms``); this
module is the single list of what ops exist.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import UnsupportedOpError
from .core import normalize_attr
from .types import TensorType

ShapeRule = Callable[[Sequence[TensorType], Mapping[str, object]], List[TensorType]]


class ShapeError(Exception):
    """Raised by a shape rule; the verifier turns it into a VerifyError
    naming the op."""


@dataclass(frozen=True)
class OpSpec:
    """What an op type is: ``num_inputs`` (None: variadic), its attributes
    with defaults (``REQUIRED`` for none), and its shape rule."""

    name: str
    num_inputs: Optional[int]
    infer: ShapeRule
    attrs: Mapping[str, object] = field(default_factory=dict)
    doc: str = ""
    is_communication: bool = False
    elementwise: bool = False


REQUIRED = object()
_REGISTRY: Dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"op type '{spec.name}' registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def lookup(op_type: str) -> OpSpec:
    try:
        return _REGISTRY[op_type]
    except KeyError:
        raise UnsupportedOpError(f"unknown op type '{op_type}'") from None


def is_registered(op_type: str) -> bool:
    return op_type in _REGISTRY


def all_op_types() -> Tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def with_defaults(op_type: str, attrs: Mapping[str, object]) -> Dict[str, object]:
    """``attrs`` completed by the spec's defaults; raises ShapeError for a
    missing required or an unknown attribute."""
    spec = lookup(op_type)
    out = {}
    for key in attrs:
        if key not in spec.attrs:
            raise ShapeError(f"unknown attribute '{key}' (allowed: "
                             f"{', '.join(spec.attrs) or 'none'})")
    for key, default in spec.attrs.items():
        if key in attrs:
            out[key] = attrs[key]
        elif default is REQUIRED:
            raise ShapeError(f"missing attribute '{key}'")
        elif default is not None:
            out[key] = default
    return out


# Shape rules are pure functions of (op type, attributes, input types): the
# same op repeated over micro-batches and layers is inferred once.
_INFER_CACHE: Dict[tuple, Tuple[TensorType, ...]] = {}
_INFER_CACHE_LIMIT = 1 << 16


def infer_types(op_type: str, input_types: Sequence[TensorType],
                attrs: Mapping[str, object]) -> List[TensorType]:
    """Apply the op's shape rule (after checking arity); results are cached."""
    try:
        key = (op_type, tuple(attrs.items()), tuple(input_types))
        hit = _INFER_CACHE.get(key)
    except TypeError:  # a list attribute (as callers may pass): as the op will hold it
        try:
            key = (op_type, tuple((k, normalize_attr(v)) for k, v in attrs.items()),
                   tuple(input_types))
            hit = _INFER_CACHE.get(key)
        except TypeError:  # an unhashable attribute value: no caching
            key, hit = None, None
    if hit is not None:
        return list(hit)
    result = _infer_types(op_type, input_types, attrs)
    if key is not None:
        if len(_INFER_CACHE) >= _INFER_CACHE_LIMIT:
            _INFER_CACHE.clear()
        _INFER_CACHE[key] = tuple(result)
    return result


def _infer_types(op_type: str, input_types: Sequence[TensorType],
                 attrs: Mapping[str, object]) -> List[TensorType]:
    spec = lookup(op_type)
    if spec.num_inputs is not None and len(input_types) != spec.num_inputs:
        raise ShapeError(f"expects {spec.num_inputs} inputs, got {len(input_types)}")
    for t in input_types:
        if not isinstance(t, TensorType):
            raise ShapeError(f"expects tensor inputs, got {t}")
    attrs = with_defaults(op_type, attrs)
    try:
        return spec.infer(input_types, attrs)
    except ShapeError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, OverflowError) as e:
        # Shape rules assume well-typed attributes (``dim`` an int, ``ranks``
        # a list of ints, ...); a parsed file can give anything, so a rule
        # that trips over a malformed attribute is a bad-input error.
        given = ", ".join(f"{k} = {v!r}" for k, v in attrs.items())
        raise ShapeError(f"malformed attributes {{{given}}} ({type(e).__name__}: {e})") from None
