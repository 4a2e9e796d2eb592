"""Export tiny transformers (GPT-2, BERT, Llama) to ONNX for distsim's tests.

    pip install -e ".[export]"          # torch and transformers (optional extra)
    python models/export_hf.py          # writes models/{gpt2,bert,llama}-tiny.onnx

Each model is built from a tiny config with random weights (seeded; nothing
is downloaded) and exported with ``torch.onnx.export(dynamo=True)`` with a
dynamic batch and sequence length, so the files carry the shape-computing
subgraphs real exports have. The weights stay inside the file (each file
is well under 1 MB), so the tests can compare distsim's numpy executor with
``onnx.reference`` on real numbers. distsim itself never needs torch.

Every parameter is its own initializer, so an imported model has the
parameter count of the torch model (tests/importers/test_gpt2_parity.py):

- Hugging Face initialises every bias to 0 and every layernorm weight to 1,
  and the exporter's optimizer merges identical initializers into one (all
  the zero biases of a model became one scalar). :func:`perturb` adds
  distinct seeded noise to every parameter first.
- A tied matrix (GPT-2's and BERT's output layer is the token embedding) is
  one torch parameter and stays one initializer: the default optimizer
  would constant-fold its ``Transpose`` for the output MatMul into a second,
  transposed copy. :func:`export` runs the optimizer itself with a folding
  limit below the size of any weight matrix (``FOLD_INPUT_LIMIT``), so only
  the small shape computations are folded and the transpose stays an op.

:func:`export` checks that the float initializers hold exactly the model's
parameters (each tied matrix once) and raises otherwise.
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
NOISE = 0.02  # std of the noise perturb() adds (the weights' own init std is 0.02)
# onnxscript folds no node with an input over this many elements: shape
# computations are a few elements, the smallest weight matrix here is 32 x 32.
FOLD_INPUT_LIMIT = 256


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
    perturb(model, seed=1)

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


def perturb(model, seed: int) -> None:
    """Add distinct seeded noise to every parameter (biases are no longer
    all zero nor layernorm weights all one), so that no two parameters are
    equal and the exporter cannot merge them. A tied matrix is one
    parameter and is perturbed once."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # each shared (tied) parameter once
            p.add_(torch.randn(p.shape, generator=gen) * NOISE)


def parameter_elements(module) -> int:
    return sum(p.numel() for p in module.parameters())


def initializer_elements(model) -> int:
    """Elements of the float initializers with more than one element (what
    distsim's importer makes parameters)."""
    from math import prod

    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    return sum(prod(i.dims) for i in model.graph.initializer
               if i.data_type in floats and prod(i.dims) > 1)


def export(name: str, out_dir: Path, opset: int = 18) -> Path:
    import onnx
    import onnxscript
    import torch
    from onnxscript.rewriter import onnx_fusions

    module = build(name)
    ids = torch.randint(0, TINY[name]["vocab_size"], (BATCH, SEQ))
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)}
    tmp = out_dir / f".{name}-tiny.tmp.onnx"
    # optimize=False and the exporter's own passes (what optimize=True runs:
    # optimize_ir, then the ONNX fusions), with the folding limit.
    program = torch.onnx.export(module, (ids,), None, input_names=["input_ids"],
                                output_names=["output"], dynamo=True, opset_version=opset,
                                dynamic_shapes={"input_ids": dims}, optimize=False)
    onnxscript.optimizer.optimize_ir(program.model, input_size_limit=FOLD_INPUT_LIMIT)
    onnx_fusions.fuse(program.model)
    program.save(str(tmp), external_data=False)
    model = onnx.load(str(tmp))
    # Float buffers (Llama's rotary inv_freq) may be initializers too.
    want, got = parameter_elements(module), initializer_elements(model)
    buffers = sum(b.numel() for b in module.buffers() if b.is_floating_point())
    if not want <= got <= want + buffers:
        raise RuntimeError(f"{name}: the export's float initializers hold {got} elements, the "
                           f"model has {want} parameters (+ {buffers} in float buffers): "
                           "initializers were merged or folded")
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
