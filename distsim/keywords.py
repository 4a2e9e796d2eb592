"""Keyword arguments checked the way the CLI checks its flags.

A misspelt option must not run with the default in its place: an unknown
name is a :class:`~distsim.errors.ConfigError` that suggests the closest
valid one (``hiden`` -> ``hidden``, ``tensor_parallel`` -> ``tp``). And a
number that comes out of numpy (an array, a DataFrame, ``np.arange``)
counts as the Python number it holds, wherever a Python number is taken.

:func:`strict_keywords` applies both to a public function; :func:`plain`
and :func:`unknown_name` serve the functions that take options as a dict.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import os
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

import numpy as np

from .errors import ConfigError

#: Names people reach for that are spelt otherwise here (the name the
#: suggestion gives, when the function has it).
ALIASES = {
    "data_parallel": "dp", "tensor_parallel": "tp", "pipeline_parallel": "pp",
    "sequence_parallel": "sp", "dp_degree": "dp", "tp_degree": "tp", "pp_degree": "pp",
    "tp_size": "tp", "pp_size": "pp", "dp_size": "dp", "zero_stage": "zero",
    "num_microbatches": "microbatches", "micro_batches": "microbatches",
    "num_micro_batches": "microbatches", "micro_batch_size": "micro_batch",
    "global_batch_size": "global_batch", "batch_size": "batch", "num_layers": "layers",
    "n_layers": "layers", "hidden_size": "hidden", "d_model": "hidden", "num_heads": "heads",
    "n_heads": "heads", "num_kv_heads": "kv_heads", "vocab_size": "vocab",
    "seq_len": "seq", "seq_length": "seq", "sequence_length": "seq",
    "virtual_pipeline_stages": "virtual_stages", "pipeline_schedule": "schedule",
    "activation_recompute": "recompute", "recomputation": "recompute",
    "bucket_size_mb": "bucket_mb", "out": "out_dir", "output": "out_dir",
}


def closest(name: str, known: Iterable[str]) -> Optional[str]:
    """The valid name ``name`` most likely means, or None."""
    known = list(known)
    alias = ALIASES.get(str(name).lower())
    if alias in known:
        return alias
    found = difflib.get_close_matches(str(name), known, n=5, cutoff=0.6)
    if not found:
        return None
    # among the closest, the one that starts as the name does (dpp: dp, not pp)
    return max(found, key=lambda k: (round(difflib.SequenceMatcher(None, name, k).ratio(), 6),
                                     len(os.path.commonprefix([name, k]))))


def unknown_name(where: str, name: Any, known: Iterable[str], what: str = "option") -> ConfigError:
    """The error for an unknown ``name`` among ``known``: the closest valid
    name when one is close, else every valid name."""
    known = sorted(str(k) for k in known)
    best = closest(str(name), known)
    hint = f"did you mean {best!r}?" if best else f"known: {', '.join(known)}"
    shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
    return ConfigError(f"{where}: unknown {what} {shown} ({hint})")


def plain(value: Any) -> Any:
    """``value`` with numpy scalars (and 0-d or 1-d arrays) as the Python
    values they hold, inside dicts, lists and tuples too; anything else
    (a Topology, a callable, a string) unchanged."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim <= 1:
        return value.tolist()
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    return value


F = TypeVar("F", bound=Callable[..., Any])


def strict_keywords(func: F) -> F:
    """``func`` that refuses a keyword it does not take (a ConfigError
    naming the closest one it does) and more positional arguments than it
    takes, and passes numpy scalars on as Python numbers. ``help()`` and
    :func:`inspect.signature` show ``func``'s own signature."""
    sig = inspect.signature(func)
    kinds = inspect.Parameter
    names = [n for n, p in sig.parameters.items()
             if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    positional = [n for n, p in sig.parameters.items()
                  if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    where = f"distsim.{func.__name__}"

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(positional):
            raise ConfigError(f"{where}: takes at most {len(positional)} arguments by position "
                              f"({', '.join(positional)}), got {len(args)}; give the others "
                              "by name (e.g. dp=8)")
        for name in kwargs:
            if name not in names:
                raise unknown_name(where, name, names, "keyword")
        for name in positional[: len(args)]:
            if name in kwargs:
                raise ConfigError(f"{where}: {name} is given twice (by position and by name)")
        return func(*(plain(a) for a in args), **{k: plain(v) for k, v in kwargs.items()})

    return checked  # type: ignore[return-value]
