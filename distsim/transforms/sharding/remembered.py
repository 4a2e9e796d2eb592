"""Answers remembered per structural key: a model's layers, and each trial
placement of its inputs, ask the sharding layer the same questions again
(the same op type, attributes and types), and the answers are functions of
those alone."""
from __future__ import annotations

from typing import Callable, Dict, Generic, Hashable, List, TypeVar

A = TypeVar("A")
#: every store made, for :func:`forget_all`
_STORES: List["Remembered"] = []


_SCALARS = (int, float, str, bool, type(None))


def frozen(x: object) -> object:
    """``x`` hashable: lists and dicts as tuples."""
    if type(x) in _SCALARS:
        return x
    if isinstance(x, (list, tuple)):
        return tuple(frozen(e) for e in x)
    if isinstance(x, dict):      # (keys differ: sorting never compares values)
        return tuple(sorted((k, v if type(v) in _SCALARS else frozen(v)) for k, v in x.items()))
    return x


class Remembered(Generic[A]):
    """At most ``kept`` answers, then forgotten all at once (a sweep's
    process builds many models; one model asks a few thousand questions)."""

    def __init__(self, kept: int = 100_000) -> None:
        self.kept = kept
        self.answers: Dict[Hashable, A] = {}
        _STORES.append(self)

    def get(self, key: Hashable, compute: Callable[[], A]) -> A:
        """The answer for ``key``, computed once; asked afresh when the key
        does not hash (an attribute no tuple holds, e.g. an array)."""
        try:
            return self.answers[key]
        except TypeError:
            return compute()
        except KeyError:
            pass
        if len(self.answers) >= self.kept:
            self.answers.clear()
        answer = self.answers[key] = compute()
        return answer

    def __contains__(self, key: Hashable) -> bool:
        return key in self.answers

    def clear(self) -> None:
        self.answers.clear()


def forget_all() -> None:
    """Every store emptied (to measure, or test, the first asking)."""
    for store in _STORES:
        store.clear()
