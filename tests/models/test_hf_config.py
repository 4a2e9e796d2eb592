"""Hugging Face config.json files read into the gpt family: the published
parameter counts of well-known models exactly, small configs simulated,
and bad files refused with one line naming the field."""
from __future__ import annotations

import json

import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.models import family_of, load_model_config
from distsim.models.gpt import GPTConfig
from distsim.models.hf_config import hf_to_gpt
from strategies_reference import strategies_reference

# the fields of the published config.json files (what matters of them)
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
             "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
             "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
             "vocab_size": 32000}
LLAMA3_8B = {**LLAMA2_7B, "intermediate_size": 14336, "max_position_embeddings": 8192,
             "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0,
             "torch_dtype": "bfloat16"}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
              "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
              "max_position_embeddings": 32768, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
              "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 32000}
QWEN2_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
             "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 131072,
             "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "vocab_size": 151936}
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "activation_function": "gelu_new", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "vocab_size": 50257, "resid_pdrop": 0.1}
PYTHIA_160M = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
               "hidden_act": "gelu", "hidden_size": 768, "intermediate_size": 3072,
               "max_position_embeddings": 2048, "num_attention_heads": 12,
               "num_hidden_layers": 12, "rotary_pct": 0.25, "tie_word_embeddings": False,
               "use_parallel_residual": True, "vocab_size": 50304}
OPT_125M = {"architectures": ["OPTForCausalLM"], "model_type": "opt",
            "activation_function": "relu", "do_layer_norm_before": True, "ffn_dim": 3072,
            "hidden_size": 768, "max_position_embeddings": 2048, "num_attention_heads": 12,
            "num_hidden_layers": 12, "torch_dtype": "float16", "vocab_size": 50272,
            "word_embed_proj_dim": 768}
FALCON_7B = {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False,
             "bias": False, "hidden_size": 4544, "multi_query": True, "new_decoder_architecture":
             False, "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
             "vocab_size": 65024}


def _parameters(data):
    config = hf_to_gpt(data, "config.json")
    return family_of(config).describe(config)["parameters"]


@pytest.mark.parametrize("data, published", [
    (LLAMA2_7B, 6_738_415_616), (LLAMA3_8B, 8_030_261_248), (MISTRAL_7B, 7_241_732_096),
    (QWEN2_05B, 494_032_768), (GPT2, 124_439_808), (PYTHIA_160M, 162_322_944),
    (OPT_125M, 125_239_296),
], ids=["llama2-7b", "llama3-8b", "mistral-7b", "qwen2-0.5b", "gpt2", "pythia-160m",
        "opt-125m"])
def test_published_parameter_counts_exactly(data, published):
    assert _parameters(data) == published


def test_falcon_7b_differs_by_the_shared_norm_and_says_so():
    """Falcon-7B's parallel block shares one layernorm per layer; the gpt
    family has two, and the description says how many parameters that adds."""
    extra = 32 * 2 * 4544
    assert _parameters(FALCON_7B) == 6_921_720_704 + extra
    config = hf_to_gpt(FALCON_7B, "falcon/config.json")
    assert f"{extra:,} parameters more than the checkpoint" in config["description"]
    assert config["kv_heads"] == 1 and config["tied_embeddings"] and not config["bias"]


@pytest.mark.parametrize("data, yaml", [(LLAMA2_7B, "llama2-7b"), (LLAMA3_8B, "llama3-8b"),
                                        (GPT2, "gpt2")])
def test_the_built_in_files_agree_with_the_configs(data, yaml):
    ours = load_model_config(yaml)
    config = hf_to_gpt(data, "config.json")
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "norm", "activation",
                "bias", "tied_embeddings", "position"):
        default = GPTConfig().__getattribute__(key) if key != "ffn" else None
        assert config.get(key, default) == ours.get(key, default), key
    assert config.get("kv_heads", config["heads"]) == ours.get("kv_heads", ours["heads"])
    assert _parameters(data) == family_of(ours).describe(ours)["parameters"]


def test_fields_mapped():
    llama = hf_to_gpt(LLAMA3_8B, "config.json")
    assert {k: llama[k] for k in ("norm", "activation", "position", "kv_heads", "seq", "dtype",
                                  "attention", "tied_embeddings", "bias")} == {
        "norm": "rmsnorm", "activation": "swiglu", "position": "rope", "kv_heads": 8,
        "seq": 8192, "dtype": "bf16", "attention": "fused", "tied_embeddings": False,
        "bias": False}
    qwen = hf_to_gpt(QWEN2_05B, "config.json")
    assert qwen["qkv_bias"] and not qwen["bias"] and qwen["tied_embeddings"]
    opt = hf_to_gpt(OPT_125M, "config.json")
    assert (opt["activation"], opt["positions"], opt["seq"], opt["dtype"]) == \
        ("relu", 2050, 2048, "bf16")
    gpt2 = hf_to_gpt(GPT2, "config.json")
    assert (gpt2["position"], gpt2["positions"], gpt2["norm"]) == ("learned", 1024, "layernorm")
    assert "sliding-window" in hf_to_gpt(MISTRAL_7B, "m")["description"]
    assert "run in parallel in the model" in hf_to_gpt(PYTHIA_160M, "p")["description"]


def _tiny(model_type="llama", **extra):
    base = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 96,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
            "vocab_size": 128, "max_position_embeddings": 16}
    return {**base, **extra}


def test_a_small_config_file_simulates_under_every_parallelism(tmp_path):
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_tiny()))
    result = distsim.simulate(model=str(folder / "config.json"), topology="dgx-a100", dp=2,
                              tp=2, pp=2, global_batch=8)
    config = result.summary()["config"]
    assert config["model"] == "tiny-llama" and config["family"] == "gpt"
    assert (config["layers"], config["hidden"], config["kv_heads"], config["norm"]) == \
        (4, 64, 2, "rmsnorm")
    assert result.step_time_s > 0 and result.summary()["mfu"] > 0
    # the folder names the same model; a mapping of the fields too
    assert load_model_config(str(folder)) == load_model_config(str(folder / "config.json"))
    assert distsim.simulate(model=_tiny(), topology="dgx-a100", dp=8,
                            global_batch=8).summary()["config"]["norm"] == "rmsnorm"


@pytest.mark.parametrize("overrides", [dict(activation="relu"),
                                       dict(bias=False, qkv_bias=True, norm="rmsnorm")])
def test_relu_and_qkv_biases_train_as_the_single_device_step(overrides):
    """The two fields the configs needed (OPT's relu, Qwen2's q/k/v-only
    biases) train under dp x tp x pp as on one device."""
    strategies_reference()(**overrides).check(dp=2, tp=2, pp=2)


@pytest.mark.parametrize("data, message", [
    ({"model_type": "bert", "hidden_size": 8},
     "model_type: unknown architecture 'bert' (supported: deepseek, falcon, gpt2, gpt_neox, "
     "llama"),
    ({"architectures": ["T5ForConditionalGeneration"]},
     "architectures: unknown architecture 'T5ForConditionalGeneration'"),
    ({"hidden_size": 8}, "model_type: missing"),
    ({k: v for k, v in _tiny().items() if k != "num_hidden_layers"},
     "num_hidden_layers: missing (a positive integer)"),
    (_tiny(num_attention_heads=3), "num_attention_heads: 3 heads do not divide hidden size 64"),
    (_tiny(num_key_value_heads=3), "num_key_value_heads: 3 key/value heads must divide the 4"),
    (_tiny(hidden_size="64"), "hidden_size: must be a positive integer, got '64'"),
    (_tiny(rms_norm_eps=float("nan")), "rms_norm_eps: must be a number >= 0, got nan"),
    (_tiny(hidden_act="gelu"), "hidden_act: 'gelu': a llama model's gated MLP"),
    (_tiny("opt", ffn_dim=96, word_embed_proj_dim=32),
     "word_embed_proj_dim: 32 differs from hidden_size 64"),
    ({"model_type": "gpt2", "n_layer": 2, "n_head": 4, "vocab_size": 10}, "n_embd: missing"),
])
def test_bad_configs_name_the_field(data, message):
    with pytest.raises(ConfigError) as info:
        hf_to_gpt(data, "x/config.json")
    assert str(info.value).startswith("x/config.json: " + message), str(info.value)


@pytest.mark.parametrize("text, message", [
    (json.dumps({"model_type": "bert"}), "model_type: unknown architecture 'bert'"),
    (json.dumps(_tiny(num_attention_heads=5)), "num_attention_heads: 5 heads do not divide"),
    ("{not json", "not valid JSON (line 1, column 2"),
    ("[1, 2]", "a config.json must be a JSON object of fields"),
])
def test_cli_refuses_a_bad_config_with_one_line_and_no_output(tmp_path, capsys, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    out = tmp_path / "out"
    code = main(["simulate", "--model", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not out.exists()


def test_cli_names_a_missing_file(tmp_path, capsys):
    code = main(["simulate", "--model", str(tmp_path / "nope.json"), "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "nope.json: no such file" in err and err.count("\n") == 1


def test_models_command_describes_a_config(tmp_path, capsys):
    folder = tmp_path / "llama-2-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA2_7B))
    assert main(["models", "--json", str(folder), "llama2-7b"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["llama-2-7b", "llama2-7b"]
    assert rows[0]["parameters"] == rows[1]["parameters"] == 6_738_415_616
