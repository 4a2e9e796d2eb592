"""Models by name: built-in families and the YAML configs in ``models/``.

A model config is a mapping with a ``family`` (``mlp``, ...) and that
family's fields. ``load_model_config("mlp")`` reads ``models/mlp.yaml``
(or the embedded default when the file is absent); a path to a ``.yaml``
file is read as is; a path to an ``.onnx`` file (or the stem of one in
``models/``) is the ``onnx`` family on that file; a Hugging Face
``config.json`` (a path to it or its folder, or its fields as a mapping)
is read into the ``gpt`` family (:mod:`.hf_config`). Families register a
:class:`ModelFamily` that turns a
config and a parallel strategy into a local-view program.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..errors import ConfigError
from ..ir.core import Function
from ..paths import models_dir, not_found_hint
from ..yamlio import load_yaml_file, yaml_number
from .hf_config import hf_to_gpt, is_hf_config, load_hf_config


@dataclass(frozen=True)
class ModelFamily:
    """``build(config, strategy) -> Function`` (local view, ready to simulate);
    ``defaults``: the embedded config; ``describe(config) -> dict`` (e.g.
    parameter count); ``check(config)``: the fields checked on their own,
    without a strategy (a ConfigError naming the field), so that a model
    file's error names the file."""

    name: str
    build: Callable[[Mapping[str, Any], Any], Function]
    defaults: Mapping[str, Any]
    describe: Callable[[Mapping[str, Any]], Dict[str, Any]]
    check: Optional[Callable[[Mapping[str, Any]], Any]] = None


FAMILIES: Dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    FAMILIES[family.name] = family
    return family


def available_models() -> List[str]:
    names = set(FAMILIES)
    folder = models_dir()
    if folder.is_dir():
        names.update(p.stem for p in folder.glob("*.yaml"))
        names.update(p.stem for p in folder.glob("*.onnx"))
    return sorted(names)


def load_model_config(model: str | Path | Mapping[str, Any]) -> Dict[str, Any]:
    """The config mapping (with ``family`` and ``name``) of a model name,
    YAML path or mapping."""
    if isinstance(model, Mapping):
        config = dict(model)
        where = "model"
        if "family" not in config and ("model_type" in config or "architectures" in config):
            config = hf_to_gpt(config, where)      # a Hugging Face config, as a mapping
    else:
        text = str(model)
        path = Path(text)
        if is_hf_config(text):
            where = text
            config = load_hf_config(text)
        elif text.endswith((".yaml", ".yml")):
            where = text
            config = load_yaml_file(path, "model file", not_found_hint("models", text, ".yaml"))
        elif text.endswith(".onnx"):
            where = text
            config = {"family": "onnx", "path": text}
        elif (models_dir() / f"{text}.onnx").is_file():
            where = str(models_dir() / f"{text}.onnx")
            config = {"family": "onnx", "path": where}
        elif (models_dir() / f"{text}.yaml").is_file():
            where = str(models_dir() / f"{text}.yaml")
            config = load_yaml_file(models_dir() / f"{text}.yaml", "model file")
        elif text in FAMILIES:
            where = text
            config = {"family": text, **FAMILIES[text].defaults}
        else:
            raise ConfigError(f"unknown model '{text}' (known: {', '.join(available_models())}; "
                              "or give a path to a .yaml, .onnx or Hugging Face config.json "
                              "file)")
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}: a model file must be a mapping of fields")
        config = _numbers(config)
        config.setdefault("name", path.stem if text.endswith((".yaml", ".yml", ".onnx")) else text)
    family = config.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
        raise ConfigError(f"{where}: family: unknown model family {family!r} "
                          f"(known: {', '.join(sorted(FAMILIES))})")
    check = FAMILIES[family].check
    if where != "model" and check is not None:     # a file: its errors name it
        try:
            check(config)
        except ConfigError as e:
            message = str(e)
            own = f"{config.get('name')}: "     # the family's prefix, the file's stem
            if message.startswith(own):
                message = message[len(own):]
            raise ConfigError(message if message.startswith(where) else
                              f"{where}: {message}") from None
    return config


#: fields that are text whatever they look like
_TEXT_FIELDS = ("family", "name", "description", "path", "dtype", "master_dtype")


def _numbers(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of a model file with numbers in exponent notation read as
    numbers: YAML 1.1 leaves ``lr: 1e-4`` (no dot, or no exponent sign) as
    text, which the families would refuse as not a number, as the topology
    loader reads them (:func:`~distsim.yamlio.yaml_number`)."""
    return {k: v if k in _TEXT_FIELDS else yaml_number(v) for k, v in config.items()}


def check_batch_options(batch: Any, global_batch: Any) -> None:
    """``batch`` (``--batch``) and ``global_batch`` (``--global-batch``)
    both set the global batch (of a GPT, of an imported ONNX model): given
    together they must agree, or one would win unsaid. The one check of
    :func:`distsim.api.build_program` (so of ``simulate`` and simulated sweep
    points), of the sweep's estimator and of the CLI."""
    if batch is not None and global_batch is not None and batch != global_batch:
        raise ConfigError(f"--batch {batch} and --global-batch {global_batch} differ (both are "
                          "the global batch: give one)")


def family_of(config: Mapping[str, Any]) -> ModelFamily:
    return FAMILIES[config["family"]]
