"""Hugging Face ``config.json`` files of decoder-only models, read into the
``gpt`` family's fields.

``--model path/to/config.json`` (or a folder holding one) reads the
architecture from ``model_type`` (or ``architectures``) and maps its
fields: layers, hidden size, heads, key/value heads, head size, MLP size,
vocabulary, norm and its epsilon, activation (a gated SiLU MLP is
``swiglu``), biases, tied embeddings and positions (rotary, learned or
none). Families: Llama, Mistral, Qwen2, GPT-2, GPT-NeoX, OPT and Falcon;
mixtures of experts (:mod:`.moe`): Mixtral (``num_local_experts``,
``num_experts_per_tok``) and DeepSeekMoE (``n_routed_experts``,
``n_shared_experts``, ``moe_intermediate_size``, ``first_k_dense_replace``,
``moe_layer_freq``, ``norm_topk_prob``).

What a config does not say is set as for a training run: ``seq`` is the
context length up to :data:`MAX_SEQ` (``--seq`` sets another), ``dtype``
bf16 (mixed-precision training; the checkpoint's ``torch_dtype`` is how
its weights are stored, ``--dtype`` sets another), attention
``fused`` (FlashAttention kernels; ``--attention explicit`` for the op by
op form), the global batch and micro-batch the family's defaults
(``--global-batch``, ``--micro-batch``). What the family models
differently from the checkpoint is said in ``description`` (a parallel
block: same parameters, computed one after the other; Falcon-7B's one
shared norm per layer: the family has two).

Bad input is a :class:`~distsim.errors.ConfigError` naming the file and
the field: an unknown architecture, a missing field, a field of the wrong
type or one that contradicts another (heads not dividing the hidden size).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..fileio import load_json_file

#: the longest sequence taken from a config's context length
MAX_SEQ = 8192

_ARCH_NAMES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
               "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2",
               "GPTNeoXForCausalLM": "gpt_neox", "OPTForCausalLM": "opt",
               "FalconForCausalLM": "falcon", "RWForCausalLM": "falcon",
               "MixtralForCausalLM": "mixtral", "DeepseekForCausalLM": "deepseek"}
_TYPE_ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}


def is_hf_config(text: str) -> bool:
    """Whether a ``--model`` value names a JSON config (a file or a folder
    holding ``config.json``)."""
    path = Path(text)
    return text.endswith(".json") or (path.is_dir() and (path / "config.json").is_file())


class _Fields:
    """A config's fields, read with errors that name the file and field."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def error(self, field: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {field}: {message}")

    def get(self, *names: str, default: Any = None) -> Any:
        """The first of ``names`` present (aliases of one field), else ``default``."""
        for name in names:
            if name in self.data and self.data[name] is not None:
                return self.data[name]
        return default

    def int(self, *names: str, default: Optional[int] = None) -> int:
        value = self.get(*names, default=default)
        if value is None:
            raise self.error(names[0], "missing (a positive integer)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(self._name(names), f"must be a positive integer, got {value!r}")
        return value

    def number(self, *names: str, default: float) -> float:
        value = self.get(*names, default=default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise self.error(self._name(names), f"must be a number >= 0, got {value!r}")
        return float(value)

    def flag(self, *names: str, default: bool) -> bool:
        value = self.get(*names, default=default)
        if not isinstance(value, bool):
            raise self.error(self._name(names), f"must be true or false, got {value!r}")
        return value

    def text(self, *names: str, default: str) -> str:
        value = self.get(*names, default=default)
        if not isinstance(value, str):
            raise self.error(self._name(names), f"must be text, got {value!r}")
        return value

    def _name(self, names: Tuple[str, ...]) -> str:
        return next((n for n in names if n in self.data), names[0])


def _seq(context: int) -> int:
    return min(context, MAX_SEQ)


def _heads(f: _Fields, hidden: int, heads: int, kv_field: Tuple[str, ...] = (),
           kv_default: Optional[int] = None) -> Dict[str, Any]:
    """heads, kv_heads and head_dim, checked against each other."""
    out: Dict[str, Any] = {"heads": heads}
    head_dim = f.get("head_dim")
    if head_dim is not None:
        head_dim = f.int("head_dim")
        if head_dim * heads != hidden:
            out["head_dim"] = head_dim
    elif hidden % heads:
        raise f.error(f._name(("num_attention_heads", "n_head")),
                      f"{heads} heads do not divide hidden size {hidden} (and no head_dim)")
    kv = f.int(*kv_field, default=kv_default or heads) if kv_field else (kv_default or heads)
    if kv > heads or heads % kv:
        raise f.error(kv_field[0] if kv_field else "num_key_value_heads",
                      f"{kv} key/value heads must divide the {heads} heads")
    if kv != heads:
        out["kv_heads"] = kv
    return out


def _gated_silu(f: _Fields, model: str) -> None:
    act = f.text("hidden_act", default="silu")
    if act not in ("silu", "swish"):
        raise f.error("hidden_act", f"{act!r}: a {model} model's gated MLP is modelled with "
                                    "silu (SwiGLU) only")


def _llama_like(f: _Fields, model: str) -> Dict[str, Any]:
    """Llama, Mistral and Qwen2: RMSNorm, gated SiLU MLP, rotary positions."""
    hidden = f.int("hidden_size")
    _gated_silu(f, model)
    out = {"layers": f.int("num_hidden_layers"), "hidden": hidden,
           **_heads(f, hidden, f.int("num_attention_heads"), ("num_key_value_heads",)),
           "ffn": f.int("intermediate_size"), "vocab": f.int("vocab_size"),
           "seq": _seq(f.int("max_position_embeddings", default=MAX_SEQ)),
           "norm": "rmsnorm", "norm_eps": f.number("rms_norm_eps", default=1e-6),
           "activation": "swiglu", "position": "rope",
           "tied_embeddings": f.flag("tie_word_embeddings", default=False),
           "dropout": f.number("attention_dropout", default=0.0)}
    if model == "qwen2":      # biases on q, k and v only
        out.update(bias=False, qkv_bias=True)
    else:
        attention = f.flag("attention_bias", default=False)
        mlp = f.flag("mlp_bias", default=False)
        if attention != mlp:
            raise f.error("mlp_bias", f"{mlp} with attention_bias {attention}: the gpt family "
                                      "puts biases on every linear layer or on none")
        out["bias"] = attention
    return out


def _mixtral(f: _Fields) -> Dict[str, Any]:
    """Mixtral: Mistral with every MLP replaced by routed experts."""
    out = _llama_like(f, "mixtral")
    experts = f.int("num_local_experts")
    out.update(experts=experts, top_k=_top_k(f, experts), norm_topk=True)
    return out


def _deepseek(f: _Fields) -> Dict[str, Any]:
    """DeepSeekMoE: fine-grained routed experts, shared experts, the first
    layers dense."""
    out = _llama_like(f, "deepseek")
    scoring = f.text("scoring_func", default="softmax")
    if scoring != "softmax":
        raise f.error("scoring_func", f"{scoring!r}: routers are modelled with softmax")
    experts = f.int("n_routed_experts")
    out.update(experts=experts, top_k=_top_k(f, experts),
               expert_ffn=f.int("moe_intermediate_size"),
               dense_layers=min(_count(f, "first_k_dense_replace"), out["layers"]),
               moe_every=f.int("moe_layer_freq", default=1),
               norm_topk=f.flag("norm_topk_prob", default=False))
    shared = _count(f, "n_shared_experts")
    if shared:
        out["shared_experts"] = shared
    return out


def _top_k(f: _Fields, experts: int) -> int:
    k = f.int("num_experts_per_tok")
    if k > experts:
        raise f.error("num_experts_per_tok", f"{k} is larger than the {experts} experts")
    return k


def _count(f: _Fields, name: str) -> int:
    """An integer field >= 0 (absent: 0)."""
    value = f.get(name, default=0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise f.error(name, f"must be an integer >= 0, got {value!r}")
    return value


def _gpt2(f: _Fields) -> Dict[str, Any]:
    hidden = f.int("n_embd", "hidden_size")
    act = f.text("activation_function", default="gelu_new")
    if not act.startswith("gelu"):
        raise f.error("activation_function", f"{act!r}: GPT-2 is modelled with gelu")
    positions = f.int("n_positions", "max_position_embeddings", default=1024)
    out = {"layers": f.int("n_layer", "num_hidden_layers"), "hidden": hidden,
           **_heads(f, hidden, f.int("n_head", "num_attention_heads")),
           "vocab": f.int("vocab_size"), "seq": _seq(positions),
           "position": "learned", "positions": positions, "norm": "layernorm",
           "norm_eps": f.number("layer_norm_epsilon", default=1e-5), "activation": "gelu",
           "bias": True, "tied_embeddings": f.flag("tie_word_embeddings", default=True),
           "dropout": f.number("resid_pdrop", default=0.1)}
    inner = f.get("n_inner")
    if inner is not None:
        out["ffn"] = f.int("n_inner")
    return out


def _gpt_neox(f: _Fields) -> Dict[str, Any]:
    hidden = f.int("hidden_size")
    act = f.text("hidden_act", default="gelu")
    if not act.startswith("gelu"):
        raise f.error("hidden_act", f"{act!r}: GPT-NeoX is modelled with gelu")
    if not f.flag("attention_bias", default=True):
        raise f.error("attention_bias", "false: the gpt family puts biases on every linear "
                                        "layer or on none (GPT-NeoX's MLP has them)")
    return {"layers": f.int("num_hidden_layers"), "hidden": hidden,
            **_heads(f, hidden, f.int("num_attention_heads")),
            "ffn": f.int("intermediate_size"), "vocab": f.int("vocab_size"),
            "seq": _seq(f.int("max_position_embeddings", default=2048)),
            "norm": "layernorm", "norm_eps": f.number("layer_norm_eps", default=1e-5),
            "activation": "gelu", "position": "rope", "bias": True,
            "tied_embeddings": f.flag("tie_word_embeddings", default=False),
            "dropout": f.number("hidden_dropout", default=0.0)}


def _opt(f: _Fields) -> Dict[str, Any]:
    hidden = f.int("hidden_size")
    project = f.get("word_embed_proj_dim")
    if project is not None and project != hidden:
        raise f.error("word_embed_proj_dim", f"{project} differs from hidden_size {hidden} "
                      "(an embedding projection, as in OPT-350m, is not modelled)")
    if not f.flag("do_layer_norm_before", default=True):
        raise f.error("do_layer_norm_before", "false: post-norm layers are not modelled")
    act = f.text("activation_function", default="relu")
    if act not in ("relu", "gelu"):
        raise f.error("activation_function", f"{act!r}: OPT is modelled with relu or gelu")
    context = f.int("max_position_embeddings", default=2048)
    return {"layers": f.int("num_hidden_layers"), "hidden": hidden,
            **_heads(f, hidden, f.int("num_attention_heads")),
            "ffn": f.int("ffn_dim"), "vocab": f.int("vocab_size"), "seq": _seq(context),
            # OPT's learned positions are offset by 2 rows
            "position": "learned", "positions": context + 2, "norm": "layernorm",
            "norm_eps": 1e-5, "activation": act, "bias": f.flag("enable_bias", default=True),
            "tied_embeddings": f.flag("tie_word_embeddings", default=True),
            "dropout": f.number("dropout", default=0.1)}


def _falcon(f: _Fields) -> Dict[str, Any]:
    hidden = f.int("hidden_size", "n_embd")
    heads = f.int("num_attention_heads", "n_head")
    new = f.flag("new_decoder_architecture", default=False)
    if new:
        kv = f.int("num_kv_heads", "n_head_kv", default=heads)
    else:
        kv = 1 if f.flag("multi_query", default=True) else heads
    alibi = f.flag("alibi", default=False)
    out = {"layers": f.int("num_hidden_layers", "n_layer"), "hidden": hidden,
           **_heads(f, hidden, heads, kv_default=kv),
           "ffn": f.int("ffn_hidden_size", default=4 * hidden), "vocab": f.int("vocab_size"),
           "seq": _seq(f.int("max_position_embeddings", default=2048)),
           "norm": "layernorm", "norm_eps": f.number("layer_norm_epsilon", default=1e-5),
           "activation": "gelu", "position": "none" if alibi else "rope",
           "bias": f.flag("bias", default=False),
           "tied_embeddings": f.flag("tie_word_embeddings", default=True),
           "dropout": f.number("hidden_dropout", default=0.0)}
    return out


def _notes(model: str, f: _Fields, fields: Mapping[str, Any]) -> List[str]:
    """What the gpt family models differently from the checkpoint."""
    notes = []
    parallel = (model == "gpt_neox" and f.flag("use_parallel_residual", default=True)) or \
        (model == "falcon" and f.flag("parallel_attn", default=True))
    if parallel:
        notes.append("attention and MLP of a layer run in parallel in the model, one after "
                     "the other here (same parameters and FLOPs)")
    if model == "falcon" and parallel and not f.flag("new_decoder_architecture", default=False) \
            and f.get("num_ln_in_parallel_attn") in (None, 1):
        extra = fields["layers"] * 2 * fields["hidden"]
        notes.append(f"each layer has two norms here, one shared in the model: {extra:,} "
                     "parameters more than the checkpoint")
    if model == "falcon" and fields["position"] == "none":
        notes.append("ALiBi attention biases are not modelled (no parameters)")
    if model in ("mistral", "mixtral") and f.get("sliding_window") is not None:
        notes.append("sliding-window attention is computed as full causal attention")
    return notes


_MAPPERS: Dict[str, Callable[[_Fields], Dict[str, Any]]] = {
    "llama": lambda f: _llama_like(f, "llama"), "mistral": lambda f: _llama_like(f, "mistral"),
    "qwen2": lambda f: _llama_like(f, "qwen2"), "gpt2": _gpt2, "gpt_neox": _gpt_neox,
    "opt": _opt, "falcon": _falcon, "mixtral": _mixtral, "deepseek": _deepseek,
}
ARCHITECTURES = tuple(sorted(_MAPPERS))


def architecture_of(data: Mapping[str, Any], where: str) -> str:
    """The family name of a config: ``model_type``, else ``architectures``."""
    model_type = data.get("model_type")
    if model_type is not None:
        if not isinstance(model_type, str):
            raise ConfigError(f"{where}: model_type: must be text, got {model_type!r}")
        model_type = _TYPE_ALIASES.get(model_type, model_type)
        if model_type in _MAPPERS:
            return model_type
        raise ConfigError(f"{where}: model_type: unknown architecture {model_type!r} "
                          f"(supported: {', '.join(ARCHITECTURES)})")
    archs = data.get("architectures")
    if isinstance(archs, list):
        for arch in archs:
            if arch in _ARCH_NAMES:
                return _ARCH_NAMES[arch]
        raise ConfigError(f"{where}: architectures: unknown architecture "
                          f"{', '.join(map(repr, archs)) or '(none)'} "
                          f"(supported: {', '.join(ARCHITECTURES)})")
    raise ConfigError(f"{where}: model_type: missing (which architecture the config is for; "
                      f"supported: {', '.join(ARCHITECTURES)})")


def hf_to_gpt(data: Mapping[str, Any], where: str = "config.json",
              name: Optional[str] = None) -> Dict[str, Any]:
    """The ``gpt`` family config of a Hugging Face config mapping."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a config.json must be a JSON object of fields")
    model = architecture_of(data, where)
    f = _Fields(data, where)
    fields = _MAPPERS[model](f)
    fields["dtype"] = "bf16"        # mixed-precision training, whatever the checkpoint's dtype
    fields["attention"] = "fused"
    notes = _notes(model, f, fields)
    description = f"{model} config from {where}" + "".join(f"; {n}" for n in notes)
    return {"family": "gpt", "name": name or model, "description": description, **fields}


def load_hf_config(text: str) -> Dict[str, Any]:
    """Read ``config.json`` (a path to it, or to its folder) into a ``gpt``
    family config, named after its folder (or the file, if not ``config.json``)."""
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    where = str(path)
    data = load_json_file(path, where)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return hf_to_gpt(data, where, name=name or None)
