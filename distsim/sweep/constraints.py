"""Constraints of a sweep: which grid points to skip, and why.

A constraint is either a Python callable ``f(config) -> bool`` (``config``:
a dict of every option of the point, plus the derived names below; false
means skip) or an expression string, as written in a YAML spec::

    constraints:
      - "dp * tp * pp == devices"
      - expr: "hidden % tp == 0"
        reason: "tp must divide the hidden size"

Expressions are parsed once and evaluated by a small whitelisting walker
(no ``eval``): literals, names, arithmetic (``+ - * / // % **``),
comparisons (also chained, ``in``, ``not in``), ``and``/``or``/``not``,
``x if c else y``, tuples/lists, and the functions ``min``, ``max``,
``abs``, ``int``, ``float``, ``len``. Names are option names (``tp``,
``hidden``, ...; an option the point does not set has the value the run
will use: the model's ``hidden``, the ``dp`` that ``tp x pp`` leave, ...;
see :mod:`.unset`) and ``devices``, the number of devices of the point's
topology.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from ..errors import ConfigError

#: The largest exponent ``**`` takes, the longest string or tuple ``*``
#: builds, and the most bits an integer result may have: a constraint is
#: a small check of one point, and ``10 ** 10 ** 10`` or ``"a" * 10 ** 10``
#: would otherwise compute for hours or exhaust memory (a hang, not an error).
MAX_EXPONENT = 4096
MAX_SEQUENCE = 10_000
MAX_INT_BITS = 4096


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b) > MAX_EXPONENT \
            and isinstance(a, (int, float)) and abs(a) not in (0, 1):
        raise ValueError(f"exponent {b!r} is too large (at most {MAX_EXPONENT})")
    return _bounded(operator.pow(a, b))


def _mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, bytes, tuple, list)) and isinstance(n, int) \
                and len(seq) * max(n, 0) > MAX_SEQUENCE:
            raise ValueError(f"repeating a sequence {n} times makes more than "
                             f"{MAX_SEQUENCE} items")
    return _bounded(operator.mul(a, b))


def _bounded(value: Any) -> Any:
    """``value``, unless it is an integer too large for a constraint to
    mean anything (repeated products would grow without bound)."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"an integer of more than {MAX_INT_BITS} bits")
    return value


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: _pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
           ast.Is: operator.is_, ast.IsNot: operator.is_not}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_FUNCS: Dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs, "int": int,
                                         "float": float, "len": len}

#: Names a constraint may use beyond the options themselves.
DERIVED_NAMES = ("devices",)


@dataclass(frozen=True)
class Constraint:
    """A check of one grid point; ``reason`` is recorded on skipped rows."""

    check: Callable[[Mapping[str, Any]], Any]
    reason: str
    names: Optional[frozenset] = None   # the names an expression reads

    def __call__(self, config: Mapping[str, Any]) -> bool:
        return bool(self.check(config))


class _Expr:
    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = where
        try:
            self.tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as e:
            raise ConfigError(f"{where}: constraint {text!r} is not a valid expression: "
                              f"{e.msg}") from None
        self.names = frozenset(n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)
                               and n.id not in _FUNCS and n.id not in ("True", "False", "None"))
        self._check_nodes(self.tree)

    def _check_nodes(self, tree: ast.AST) -> None:
        allowed = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp,
                   ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Call,
                   ast.And, ast.Or, *_BINOPS, *_CMPOPS, *_UNARY)
        for node in ast.walk(tree):
            if not isinstance(node, allowed):
                raise ConfigError(f"{self.where}: constraint {self.text!r}: "
                                  f"{type(node).__name__} is not allowed in a constraint")
            if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name)
                                               or node.func.id not in _FUNCS or node.keywords):
                raise ConfigError(f"{self.where}: constraint {self.text!r}: only "
                                  f"{', '.join(_FUNCS)} may be called")

    def __call__(self, env: Mapping[str, Any]) -> Any:
        try:
            return self._eval(self.tree.body, env)
        except ConfigError:
            raise
        except Exception as e:  # a TypeError on None, a ZeroDivisionError, ...
            raise ConfigError(f"{self.where}: constraint {self.text!r} failed on "
                              f"{_short(env, self.names)}: {type(e).__name__}: {e}") from None

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        ev = self._eval
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            return env[node.id]
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](ev(node.left, env), ev(node.right, env))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand, env))
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                value: Any = True
                for v in node.values:
                    value = ev(v, env)
                    if not value:
                        return value
                return value
            value = False
            for v in node.values:
                value = ev(v, env)
                if value:
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = ev(node.left, env)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return ev(node.body, env) if ev(node.test, env) else ev(node.orelse, env)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(ev(e, env) for e in node.elts)
        if isinstance(node, ast.Call):
            return _FUNCS[node.func.id](*(ev(a, env) for a in node.args))  # type: ignore[union-attr]
        raise ConfigError(f"{self.where}: constraint {self.text!r}: unsupported syntax")


def _short(env: Mapping[str, Any], names: Iterable[str]) -> str:
    """The values of the names an expression reads (not every option of
    the point: the error stays one readable line)."""
    shown = [f"{k}={env[k]!r}" for k in sorted(names) if k in env]
    return "{" + ", ".join(shown) + "}"


ConstraintLike = Union[str, Callable[[Mapping[str, Any]], Any], Mapping[str, Any], Constraint]


def make_constraints(items: Optional[Iterable[ConstraintLike]], known_names: Iterable[str],
                     where: str = "constraints") -> List[Constraint]:
    """Constraints from strings, ``{expr, reason}`` mappings or callables;
    expressions that read an unknown name are refused here."""
    if items is None:
        return []
    if isinstance(items, (str, Mapping)) or callable(items):
        items = [items]  # type: ignore[list-item]
    known = set(known_names) | set(DERIVED_NAMES)
    out: List[Constraint] = []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        if isinstance(item, Constraint):
            out.append(item)
        elif isinstance(item, str):
            expr = _Expr(item, here)
            _check_names(expr, known, here)
            out.append(Constraint(expr, f"constraint: {item.strip()}", expr.names))
        elif isinstance(item, Mapping):
            extra = set(item) - {"expr", "reason"}
            if "expr" not in item or not isinstance(item["expr"], str) or extra:
                raise ConfigError(f"{here}: a constraint is a string or a mapping "
                                  "with 'expr' (and optional 'reason')")
            expr = _Expr(item["expr"], here)
            _check_names(expr, known, here)
            reason = item.get("reason") or f"constraint: {item['expr'].strip()}"
            out.append(Constraint(expr, str(reason), expr.names))
        elif callable(item):
            name = getattr(item, "__name__", type(item).__name__)
            doc = (getattr(item, "__doc__", None) or "").strip().splitlines()
            reason = f"constraint: {doc[0] if doc and name == '<lambda>' else name}"
            out.append(Constraint(item, reason))
        else:
            raise ConfigError(f"{here}: a constraint is an expression string, a mapping "
                              f"with 'expr', or a callable; got {item!r}")
    return out


def _check_names(expr: _Expr, known: set, where: str) -> None:
    unknown = sorted(expr.names - known)
    if unknown:
        raise ConfigError(f"{where}: constraint {expr.text!r} uses unknown name(s) "
                          f"{', '.join(unknown)} (known: {', '.join(sorted(known))})")
