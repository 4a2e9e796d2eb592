"""Export tiny transformers (GPT-2, BERT, Llama) to ONNX for distsim's tests.

    pip install -e ".[export]"          # torch and transformers (optional extra)
    python models/export_hf.py          # writes models/{gpt2,bert,llama}-tiny.onnx

Each model is built from a tiny config with random weights (seeded; nothing
is downloaded) and exported with ``torch.onnx.export(dynamo=True)`` with a
dynamic batch and sequence length, so the files carry the shape-computing
subgraphs real exports have. The weights stay inside the file (each file
is well under 1 MB), so the tests can compare distsim's numpy executor with
``onnx.reference`` on real numbers. distsim itself never needs torch.
"""
from __future__ import annotations

import argparse
from pathlib import Path

# The configs are shared with the tests (tests/importers/test_onnx_models.py).
TINY = {
    "gpt2": dict(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4),
    "bert": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=64),
    "llama": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64),
}
BATCH, SEQ = 2, 16


def build(name: str):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(use_cache=False, attn_implementation="eager")
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(**TINY[name], **common))
    elif name == "bert":
        model = tf.BertModel(tf.BertConfig(**TINY[name], **common), add_pooling_layer=False)
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY[name], **common))
    model.eval()

    class FirstOutput(torch.nn.Module):
        """input_ids -> logits (or hidden states): a plain tensor out."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            extra = {}
            if name == "bert":  # explicit token types: no buffer lookup in the graph
                extra["token_type_ids"] = torch.zeros_like(input_ids)
            return self.inner(input_ids=input_ids, return_dict=False, **extra)[0]

    return FirstOutput(model)


def export(name: str, out_dir: Path, opset: int = 18) -> Path:
    import onnx
    import torch

    module = build(name)
    ids = torch.randint(0, TINY[name]["vocab_size"], (BATCH, SEQ))
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)}
    tmp = out_dir / f".{name}-tiny.tmp.onnx"
    torch.onnx.export(module, (ids,), str(tmp), input_names=["input_ids"],
                      output_names=["output"], dynamo=True, opset_version=opset,
                      dynamic_shapes={"input_ids": dims}, external_data=False)
    model = onnx.load(str(tmp))
    model.producer_name = f"distsim models/export_hf.py ({name}, torch {torch.__version__})"
    path = out_dir / f"{name}-tiny.onnx"
    onnx.save(model, str(path))
    tmp.unlink()
    for extra in out_dir.glob(f".{name}-tiny.tmp.onnx*"):
        extra.unlink()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=sorted(TINY), help="gpt2, bert, llama")
    parser.add_argument("--out", default=str(Path(__file__).parent), help="output folder")
    parser.add_argument("--opset", type=int, default=18)
    args = parser.parse_args()
    for name in args.models:
        path = export(name, Path(args.out), args.opset)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
