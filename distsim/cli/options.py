"""Command-line options shared by several subcommands (model, strategy,
topology), so that ``simulate``, ``print`` and later ``sweep`` agree."""
from __future__ import annotations

import argparse
from typing import Any, Dict

from ..api import DEFAULT_MODEL, DEFAULT_TOPOLOGY, check_batch_options
from ..errors import ConfigError


def add_model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help="model name (see models/) or path to a model .yaml (default: %(default)s)")
    g.add_argument("--layers", type=int, help="number of layers (overrides the model file)")
    g.add_argument("--hidden", type=int, help="hidden size (overrides the model file)")
    g.add_argument("--batch", type=int, help="global batch size (overrides the model file)")
    g.add_argument("--dtype", choices=["fp16", "bf16", "fp32", "f16", "f32"],
                   help="compute dtype (overrides the model file)")
    g.add_argument("--heads", type=int, help="attention heads (GPT models)")
    g.add_argument("--kv-heads", type=int, dest="kv_heads",
                   help="key/value heads, grouped-query attention (GPT models)")
    g.add_argument("--ffn", type=int, help="feed-forward size (GPT models; default 4 x hidden)")
    g.add_argument("--vocab", type=int, help="vocabulary size (GPT models)")
    g.add_argument("--seq", type=int, help="sequence length (GPT models; for ONNX models the "
                                           "size of symbolic sequence dims)")
    g.add_argument("--attention", choices=["explicit", "fused"],
                   help="attention core (GPT models): explicit ops (scores, mask, softmax, "
                        "dropout) or one fused FlashAttention kernel that keeps no seq x seq "
                        "tensor (overrides the model file; default: explicit)")
    g.add_argument("--attention-kernel", dest="attention_kernel", metavar="NAME",
                   help="fused attention's implementation whose figures in the device file "
                        "time it (GPT models, --attention fused): cudnn (cuDNN's fused "
                        "attention, Transformer Engine's NVTE_FUSED_ATTN=1); default: the "
                        "device's default kernel, FlashAttention-2")
    g.add_argument("--routing-skew", type=float, dest="routing_skew", metavar="S",
                   help="mixture-of-experts models: routing balance in [0, 1], 0 uniform, 1 "
                        "every token routed to one expert; the busiest expert's tokens set "
                        "every expert's slots (overrides the model file)")
    g.add_argument("--capacity-factor", type=float, dest="capacity_factor", metavar="F",
                   help="mixture-of-experts models: each expert's slots at most F times its "
                        "uniform share of the tokens, the rest dropped (overrides the model "
                        "file; default: none dropped)")
    g.add_argument("--dispatch", choices=["padded", "dropless", "allgather"],
                   help="mixture-of-experts models: padded (every expert computes the busiest "
                        "expert's slots), dropless (Megatron-core's default: each expert its "
                        "own tokens; the busiest expert-parallel rank sets the time; no "
                        "--capacity-factor) or allgather (padded slots; under --ep the group's "
                        "tokens all-gathered and the experts' outputs reduce-scattered instead "
                        "of two all-to-alls) (overrides the model file; default: padded)")


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel strategy")
    g.add_argument("--dp", type=int,
                   help="data-parallel degree (default: the topology's devices / (tp x pp x "
                        "cp))")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default: 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (default: 1)")
    g.add_argument("--cp", type=int,
                   help="context-parallel degree (GPT models; default: 1): every sequence split "
                        "over cp ranks, each holding two of 2 x cp equal chunks (causal "
                        "balance); the weights' gradients synchronised over dp x cp")
    g.add_argument("--cp-comm", choices=["allgather", "ring", "alltoall"], dest="cp_comm",
                   help="how context-parallel attention reaches the other ranks' keys and "
                        "values: allgather (default: gathered before attention, as Llama 3) "
                        "or ring (blocks sent around the ring, each overlapped with the "
                        "attention of the block at hand, as Megatron-LM; needs --attention "
                        "fused) or alltoall (DeepSpeed-Ulysses: sequence exchanged for heads "
                        "and back; cp must divide the key/value heads per tp rank)")
    g.add_argument("--ep", type=int,
                   help="expert-parallel degree of a mixture-of-experts model: each group of "
                        "ep data-parallel ranks shares out the experts, tokens dispatched and "
                        "combined by all-to-all (must divide --dp, dp x cp with --cp, and the "
                        "experts; default: 1)")
    g.add_argument("--sp", action="store_true", default=None,
                   help="sequence parallelism in the tensor-parallel regions (needs --tp > 1)")
    g.add_argument("--tp-overlap", action=argparse.BooleanOptionalAction, default=None,
                   dest="tp_overlap",
                   help="issue the backward's tensor-parallel all-reduce (reduce-scatter with "
                        "--sp) of a layer's input gradient before the weight-gradient GEMM, to "
                        "overlap it, as Megatron-LM's async all-reduce; --no-tp-overlap "
                        "(default): after it, as Megatron-LM v2 (2021). It shows in time under "
                        "--comm-order stream")
    g.add_argument("--fp32-grads", action=argparse.BooleanOptionalAction, default=None,
                   dest="fp32_grads",
                   help="accumulate the micro-batches' gradients in fp32 buffers (each cast "
                        "to fp32, then added) and reduce them over data parallelism in fp32, "
                        "as DeepSpeed's BF16_Optimizer; --no-fp32-grads (default): in the "
                        "parameters' dtype, as PyTorch's .grad")
    g.add_argument("--p2p-scatter", action=argparse.BooleanOptionalAction, default=None,
                   dest="p2p_scatter",
                   help="send a pipeline transfer of a value every tensor-parallel rank holds "
                        "whole as 1/tp from each rank and all-gather it on the receiving "
                        "stage, as Megatron-LM's --scatter-gather-tensors-in-pipeline and "
                        "DeepSpeed's pipeline engine; --no-p2p-scatter (default): every rank "
                        "sends the whole value, as Megatron-core")
    g.add_argument("--zero", type=int, choices=[0, 1, 2, 3],
                   help="ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters (FSDP) "
                        "sharded over data-parallel ranks (default: 0)")
    g.add_argument("--recompute", choices=["none", "selective", "full"],
                   help="activation recomputation (default: none)")
    g.add_argument("--microbatches", type=int,
                   help="micro-batches per step (default: global batch / (dp x micro-batch))")
    g.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved", "zb-h1"],
                   help="pipeline schedule (default: 1f1b); zb-h1: zero-bubble ZB-H1, the "
                        "backward split into input- and weight-gradient tasks, the weight "
                        "gradients deferred into the bubble (one chunk per rank; simulated, not "
                        "estimated: fidelity estimate refuses it)")
    g.add_argument("--virtual-stages", type=int, dest="virtual_stages",
                   help="model chunks per pipeline rank for --schedule interleaved (default: 2)")
    g.add_argument("--bucket-mb", type=float, dest="bucket_mb",
                   help="DDP gradient bucket size in MB (default: one all-reduce per gradient "
                        "as soon as it is ready; 0: all after the backward pass)")
    g.add_argument("--optimizer", choices=["adamw", "sgd"],
                   help="optimizer, both with fp32 master weights (default: adamw; SGD's "
                        "momentum is the model's 'momentum' field)")
    g.add_argument("--partition", choices=["even", "balanced"],
                   help="pipeline stages even by layers or balanced by estimated cost, "
                        "embedding and head included (default: even)")
    g.add_argument("--prefetch", type=int, metavar="LAYERS",
                   help="ZeRO-3: all-gather parameters this many layers ahead (default: 1; "
                        "0: no prefetch)")
    g.add_argument("--zero3-unit", choices=["param", "layer"],
                   help="ZeRO-3: one all-gather and reduce-scatter per parameter, or one per "
                        "layer for all its parameters as FSDP does (default: param)")
    g.add_argument("--order", metavar="AXES",
                   help="mesh layout, axes from fastest to slowest varying rank, e.g. "
                        "dp-tp-pp (default: tp-dp-pp, TP groups on adjacent GPUs)")
    g.add_argument("--plan", metavar="FILE|megatron",
                   help="how tensor parallelism places the parameters: megatron (default: "
                        "column/row pairs of linear layers, vocabulary-parallel embeddings, "
                        "found in the program) or a plan file (YAML: parameter-name pattern -> "
                        "colwise, rowwise, vocab or replicate)")
    g.add_argument("--fusion", metavar="FRAMEWORK",
                   help="which adjacent ops run as one kernel, as the simulated framework "
                        "fuses them: megatron (Megatron-LM's scale-mask-softmax, "
                        "bias-GeLU, bias-dropout-add), megatron-core (those, SwiGLU's forward and "
                        "the fused cross-entropy loss), pytorch-eager (the linear bias in the "
                        "GEMM only) or none (every op its own kernel); default: megatron "
                        "for GPT models, none for the others")
    g.add_argument("--symmetry", action="store_true", default=None,
                   help="simulate one representative device per class of identical devices "
                        "(data- and tensor-parallel peers mirror it): same results, much faster "
                        "on large clusters")
    g.add_argument("--coarsen", action="store_true", default=None,
                   help="simulate each run of compute ops between communications as one fused "
                        "op (same step time, far fewer ops; memory inside a run not tracked); "
                        "GPT and ONNX models, the MLP under any strategy but plain data "
                        "parallelism (which is simulated op by op)")
    g.add_argument("--global-batch", type=int, dest="global_batch",
                   help="sequences per step, all data-parallel ranks together (GPT models)")
    g.add_argument("--micro-batch", type=int, dest="micro_batch",
                   help="sequences per micro-batch (GPT models)")
    g.add_argument("--max-ops", type=int, dest="max_ops", metavar="N",
                   help="refuse, before building it, a program estimated at more than N ops "
                        "(layers x micro-batches x devices per stage x ops per layer); "
                        "0: no limit (default: 50000000)")


def add_topology_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help="topology name (see topologies/, or dgx-a100-xN) or path to a .yaml; "
                        "at most 65,536 devices (default: %(default)s)")


def add_onnx_options(p: argparse.ArgumentParser) -> None:
    """Options of models imported from ONNX files (``--model FILE.onnx``)."""
    g = p.add_argument_group("imported models (--model FILE.onnx)")
    g.add_argument("--train", action="store_true", default=None,
                   help="append an MSE loss, the backward pass and the optimizer's update "
                        "(--optimizer, AdamW by default; fp32 master weights, sharded by "
                        "--zero) to the forward graph, on any number of devices")
    g.add_argument("--input-shape", action="append", metavar="NAME=AxB", dest="input_shape",
                   help="shape of a graph input, e.g. input_ids=8x1024 (repeatable)")
    add_frozen_option(g)


def add_frozen_option(g) -> None:
    """``--frozen PATTERN`` (repeatable): initializers that are buffers."""
    g.add_argument("--frozen", action="append", metavar="PATTERN",
                   help="initializers whose names match PATTERN (fnmatch, e.g. '*inv_freq') are "
                        "buffers, not trained (repeatable; replaces the default '*inv_freq', "
                        "which freezes a Llama export's rotary frequencies)")


def input_shapes_option(items) -> Dict[str, str]:
    """``["ids=2x64"]`` -> ``{"ids": "2x64"}`` (shapes are parsed by the model
    family). An input named twice is refused: the last would win unsaid."""
    out: Dict[str, str] = {}
    for item in items or ():
        name, sep, shape = item.rpartition("=")
        if not sep or not name:
            raise ConfigError(f"--input-shape: expected NAME=AxB, got '{item}'")
        if name in out:
            raise ConfigError(f"--input-shape: input '{name}' is given twice "
                              f"({name}={out[name]} and {name}={shape}): give it once")
        out[name] = shape
    return out


def program_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments of :func:`distsim.api.build_program` from args."""
    out = {"model": args.model, "topology": args.topology}
    # also checked by build_program; here before anything is read or built
    check_batch_options(getattr(args, "batch", None), getattr(args, "global_batch", None))
    if getattr(args, "input_shape", None):
        out["input_shapes"] = input_shapes_option(args.input_shape)
    if getattr(args, "frozen", None):
        out["frozen"] = list(args.frozen)
    for key in ("layers", "hidden", "batch", "dtype", "dp", "tp", "pp", "cp", "cp_comm", "train",
                "seq", "heads", "kv_heads", "ffn", "vocab", "attention", "attention_kernel",
                "routing_skew", "capacity_factor", "dispatch", "sp", "zero", "recompute",
                "microbatches", "schedule", "virtual_stages", "bucket_mb", "global_batch",
                "micro_batch", "symmetry", "coarsen", "max_ops", "optimizer", "partition",
                "prefetch", "zero3_unit", "order", "plan", "fusion", "ep", "tp_overlap",
                "fp32_grads", "p2p_scatter"):
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out
