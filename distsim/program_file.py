"""DistIR text programs as files: reading them (one place for the file
errors and for choosing the verifier: global-view programs with meshes,
sharded types or calls get the sharding verifier; local-view programs the
plain one) and turning one into the program a simulation runs.

    distsim simulate models/nested_mlp.dir --topology dgx-a100
    distsim.simulate("models/nested_mlp.dir", topology="dgx-a100")

An annotated (global-view) program is propagated and lowered first, as
``distsim lower`` prints it; a per-device (local-view) one runs as
written. Its devices are the topology's ranks of the same numbers. Every
error about a file's program names the file (:func:`about_file`).
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from .errors import ConfigError, DistsimError, ParseError
from .ir.core import Function, Module
from .ir.mesh import DTensorType
from .ir.types import DType
from .ir.verifier import verify, verify_module
from .paths import models_dir, not_found_hint, resolve
from .text import parse_module

#: the suffix of DistIR text files
SUFFIX = ".dir"

#: what a text program's own values and ops fix, so options that would
#: change it are refused rather than ignored: the options that may be
#: given, and the value each may take
NEUTRAL_OPTIONS: Dict[str, Any] = {"tp": 1, "pp": 1}
#: options of the simulation itself, not of the program: accepted as given
RUN_OPTIONS = ("symmetry", "max_ops")


def read_text(path_text: str) -> str:
    """The text of a DistIR file: a path, or the name of an example
    program in ``models/`` (``nested_mlp``)."""
    path = resolve("models", path_text, SUFFIX)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found"
                          f"{not_found_hint('models', path_text, SUFFIX)}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a DistIR text file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None


def is_global_view(module: Module) -> bool:
    if module.meshes:
        return True
    for f in module:
        if any(isinstance(v.type, DTensorType) for v in f.values()):
            return True
        if any(op.op_type == "call" for op in f.ops):   # (a fused op's segment is local view)
            return True
    return False


@contextmanager
def about_file(path_text: str) -> Iterator[None]:
    """Errors raised inside name the file: an error about an op read from
    it starts with ``path:line:`` already (see :mod:`distsim.ir.source`),
    any other gets ``path:`` in front."""
    try:
        yield
    except ParseError:
        raise
    except DistsimError as e:
        message = str(e)
        if message.startswith(f"{path_text}:"):
            raise
        raise type(e)(f"{path_text}: {message}") from None


def read_program(path_text: str) -> Module:
    """Parse and verify a DistIR text file; errors name the file."""
    from .transforms.sharding import verify_sharded
    module = parse_module(read_text(path_text), source=str(path_text))
    with about_file(path_text):
        return verify_sharded(module) if is_global_view(module) else verify_module(module)


def check_entry(module: Module, path_text: str, entry: str) -> None:
    """``--entry`` names a function of the file: said with the file name
    and the functions there are, before the sharding passes (whose own
    error names neither)."""
    if entry not in module.functions:
        known = ", ".join(f"@{name}" for name in module.functions)
        raise ConfigError(f"{path_text}: --entry {entry}: no function @{entry} "
                          f"(the file has {known})")


def is_program_model(model: Any) -> bool:
    """Whether a simulation's ``model`` names a DistIR text program: a path
    ending in ``.dir``, or the stem of an example program in ``models/``
    that no model file of another kind shares."""
    if not isinstance(model, (str, Path)):
        return False
    text = str(model)
    if text.endswith(SUFFIX):
        return True
    folder = models_dir()
    return "/" not in text and (folder / f"{text}{SUFFIX}").is_file() and not any(
        (folder / f"{text}{ext}").is_file() for ext in (".yaml", ".yml", ".onnx"))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_program_options(path_text: str, options: Mapping[str, Any]) -> None:
    """Model and strategy options would change what the program says
    itself (its shapes, placements and devices): refused by name."""
    for key, value in options.items():
        if key in RUN_OPTIONS or (key in NEUTRAL_OPTIONS and value == NEUTRAL_OPTIONS[key]):
            continue
        shown = "" if value is True else f" {value}"
        raise ConfigError(f"{path_text}: {_flag(key)}{shown}: a DistIR text program fixes its "
                          "own shapes, placements and devices; model and strategy options do "
                          "not apply to it")


def _dtype(f: Function) -> str:
    """The program's compute dtype: the float type most of its op results
    hold (f32 when none does), for the peak FLOP/s the summary divides by."""
    counts = Counter(v.type.dtype for op in f.ops for v in op.outputs)
    floats = [d for d, _ in counts.most_common() if d.is_float]
    return (floats[0] if floats else DType.F32).value


def default_entry(module: Module, path_text: str) -> str:
    """The function a file's simulation starts from: ``@main``, or the
    file's only function that no op of another calls (``distsim print``
    names a model's step after the model, e.g. ``@gpt_step``, and writes
    its fused kernels' functions beside it)."""
    if "main" in module.functions or not module.functions:
        return "main"
    called = {sub.name for f in module.functions.values() for op in f.ops
              for sub in op.subfunctions}
    roots = [name for name in module.functions if name not in called]
    if len(roots) == 1:
        return roots[0]
    known = ", ".join(f"@{name}" for name in module.functions)
    raise ConfigError(f"{path_text}: no function @main to simulate, and the file has several "
                      f"({known}): name the step @main")


def load_text_program(path_text: str, ranks: Any, topology_name: str,
                      options: Mapping[str, Any], entry: Optional[str] = None
                      ) -> Tuple[Function, Dict[str, Any]]:
    """The local-view program of the file's ``entry`` (default
    :func:`default_entry`; an annotated one
    propagated and lowered) checked against the topology's ``ranks``, and
    the run's config (``summary.json``'s): ``model`` (the file's stem),
    ``family`` ``program``, ``path``, ``dtype``, ``devices`` (how many the
    program uses) and ``topology``. Every error names the file."""
    check_program_options(path_text, options)
    module = read_program(path_text)
    entry = entry if entry is not None else default_entry(module, path_text)
    if entry not in module.functions:
        known = ", ".join(f"@{name}" for name in module.functions)
        raise ConfigError(f"{path_text}: no function @{entry} to simulate (the file has {known})")
    with about_file(path_text):
        if is_global_view(module):
            from .transforms.sharding import shard_program
            _, program = shard_program(module, entry)
        else:
            program = module.functions[entry]
        verify(program, known_devices=ranks)
        if not program.ops:
            raise ConfigError(f"@{entry} has no ops to simulate")
    config = {"model": Path(path_text).stem, "family": "program", "path": str(path_text),
              "dtype": _dtype(program), "devices": len(program.devices()),
              "topology": topology_name}
    return program, config
