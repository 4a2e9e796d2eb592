"""What each option of a run means, in one place: ``help(distsim.simulate)``
and ``help(distsim.build_program)`` show these texts under the names the
options have everywhere (the Python keyword; the ``distsim simulate`` flag
is the same with ``-`` for ``_``: ``kv_heads`` is ``--kv-heads``).

A test checks that every keyword of those functions is documented here
and that the CLI's flags and the API's keywords are the same names.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple, TypeVar

Group = Tuple[str, Sequence[Tuple[str, str]]]

MODEL: Group = ("Model options (each overrides the model's file; None keeps the file's value)", (
    ("layers", "number of layers"),
    ("hidden", "hidden size"),
    ("batch", "global batch size (a GPT's global_batch; an ONNX model's batch)"),
    ("dtype", "compute dtype: 'bf16', 'fp16' / 'f16' or 'fp32' / 'f32'"),
    ("train", "ONNX models: append an MSE loss, the backward pass and the optimizer's update"),
    ("input_shapes", "ONNX models: graph input name -> shape, e.g. {'input_ids': (8, 1024)} "
                     "(on the command line: --input-shape input_ids=8x1024, repeatable)"),
    ("frozen", "ONNX models: fnmatch patterns of initializers that are buffers, not trained "
               "(default ['*inv_freq'])"),
    ("seq", "sequence length (GPT models; ONNX models: the size of symbolic sequence dims)"),
    ("heads", "attention heads (GPT models)"),
    ("kv_heads", "key/value heads, for grouped-query attention (GPT models)"),
    ("ffn", "feed-forward size (GPT models; default 4 x hidden)"),
    ("vocab", "vocabulary size (GPT models)"),
    ("attention", "'explicit' ops (scores, mask, softmax, dropout) or one 'fused' "
                  "FlashAttention kernel (GPT models)"),
    ("attention_kernel", "fused attention's implementation, timed by its figures in the "
                         "device file's attention.kernels: 'cudnn' (cuDNN's fused attention, "
                         "Transformer Engine's NVTE_FUSED_ATTN=1); default: the device's "
                         "default kernel, FlashAttention-2 (GPT models, attention fused)"),
    ("routing_skew", "mixture-of-experts GPT models: routing balance in [0, 1], 0 uniform, 1 "
                     "every token routed to one expert (the busiest expert's tokens set every "
                     "expert's slots)"),
    ("capacity_factor", "mixture-of-experts GPT models: each expert's slots at most this "
                        "times its uniform share of the tokens (tokens past it dropped; "
                        "default: none dropped)"),
    ("dispatch", "mixture-of-experts GPT models: 'padded' (default: every expert computes the "
                 "busiest expert's slots) or 'dropless' (Megatron-core's: each expert its own "
                 "tokens, the busiest expert-parallel rank sets the time; no capacity_factor)"),
))

STRATEGY: Group = ("Parallel strategy (None: the default named)", (
    ("dp", "data-parallel degree (default: the devices tp x pp x cp leave)"),
    ("tp", "tensor-parallel degree (default 1)"),
    ("pp", "pipeline-parallel degree (default 1)"),
    ("cp", "context-parallel degree (GPT models; default 1): every sequence split over cp "
           "ranks, each holding two of 2 x cp chunks (causal balance); the weights' gradients "
           "sync over dp x cp"),
    ("cp_comm", "how context-parallel attention reaches the other ranks' keys and values: "
                "'allgather' (default; gathered before attention, Llama 3's way) or 'ring' "
                "(blocks passed around the ring point to point, each overlapped with the "
                "attention of the block at hand; needs fused attention) or 'alltoall' "
                "(DeepSpeed-Ulysses: sequence exchanged for heads around attention)"),
    ("ep", "expert-parallel degree of a mixture-of-experts model: each group of ep "
           "data-parallel ranks shares out the experts, tokens dispatched and combined by "
           "all-to-all (must divide dp x cp and the experts; default 1)"),
    ("sp", "sequence parallelism in the tensor-parallel regions (needs tp > 1)"),
    ("tp_overlap", "the backward's tensor-parallel all-reduce (reduce-scatter with sp) of a "
                   "layer's input gradient issued before the weight-gradient GEMM, to overlap "
                   "it, as Megatron-LM's async all-reduce; false (default): after it, as "
                   "Megatron-LM v2 (2021). Shows in time under comm_order 'stream'"),
    ("fp32_grads", "the gradient buffers in fp32: each micro-batch's gradient cast to fp32 and "
                   "added, the data-parallel reduction and the optimizer on the fp32 buffer, as "
                   "DeepSpeed's BF16_Optimizer; false (default): in the parameters' dtype"),
    ("p2p_scatter", "a pipeline transfer of a value every tensor-parallel rank holds whole sent "
                    "as 1/tp from each rank and all-gathered over the receiving stage's "
                    "tensor-parallel group, as Megatron-LM's --scatter-gather-tensors-in-"
                    "pipeline and DeepSpeed's pipeline engine; false (default): every rank "
                    "sends the whole value, as Megatron-core"),
    ("zero", "ZeRO stage: 0 (default), 1 optimizer state, 2 + gradients, 3 + parameters "
             "sharded over the data-parallel ranks"),
    ("recompute", "activation recomputation: 'none' (default), 'selective', 'full'"),
    ("global_batch", "sequences per step, all data-parallel ranks together (GPT and ONNX "
                     "models; default: the model's)"),
    ("microbatches", "how many micro-batches each data-parallel rank runs per step (their "
                     "size follows: global_batch / (dp x microbatches))"),
    ("micro_batch", "how many sequences one micro-batch holds (their number follows: "
                    "global_batch / (dp x micro_batch))"),
    ("schedule", "pipeline schedule: '1f1b' (default), 'gpipe', 'interleaved', 'zb-h1' "
                 "(zero-bubble ZB-H1: the backward split into input- and weight-gradient "
                 "tasks, the weight gradients deferred into the bubble; one chunk per rank; "
                 "simulated only, the estimator refuses it)"),
    ("virtual_stages", "model chunks per pipeline rank for the interleaved schedule "
                       "(default 2)"),
    ("bucket_mb", "DDP gradient bucket size in MB (default: one all-reduce per gradient as "
                  "soon as it is ready; 0: all after the backward pass)"),
    ("optimizer", "'adamw' (default) or 'sgd', both on fp32 master weights (the MLP's step "
                  "is SGD)"),
    ("partition", "pipeline stages 'even' by layers (default) or 'balanced' by estimated cost"),
    ("prefetch", "ZeRO-3: all-gather parameters this many layers ahead (default 1; 0: none)"),
    ("zero3_unit", "ZeRO-3: one all-gather and reduce-scatter per 'param' (default) or per "
                   "'layer'"),
    ("order", "mesh layout, the axes from fastest to slowest varying rank (default "
              "'tp-dp-pp'; e.g. 'dp-tp-pp')"),
    ("plan", "how tensor parallelism places the parameters: 'megatron' (default: column/row "
             "pairs of linear layers, vocabulary-parallel embeddings, found in the program) or "
             "the path of a plan file (parameter-name pattern -> colwise, rowwise, vocab, "
             "replicate)"),
    ("fusion", "which adjacent ops run as one kernel (one launch, one memory pass), as the "
               "simulated framework fuses them: 'megatron' (Megatron-LM's fused "
               "scale-mask-softmax, bias-GeLU, bias-dropout-add, the linear bias in the GEMM), "
               "'megatron-core' (those, SwiGLU's forward and the fused cross-entropy loss of "
               "Megatron-core with Transformer Engine, as NeMo runs it), 'pytorch-eager' (the "
               "linear bias in the GEMM only) or 'none' (every op its own "
               "kernel); default: 'megatron' for GPT models, 'none' for the others"),
    ("symmetry", "simulate one device per class of identical devices: the same results, "
                 "much faster on large clusters"),
    ("coarsen", "simulate each run of compute ops between communications as one op: the "
                "same step time, far fewer ops (GPT and ONNX models; the MLP off plain data "
                "parallelism)"),
))

RUN: Group = ("Simulation", (
    ("network_mode", "'flow' (default: max-min fair sharing of links) or 'analytical' "
                     "(each transfer alone on its route's bottleneck)"),
    ("collective_algo", "algorithm for every collective kind that has it, 'auto' for the "
                        "others: 'auto' (default), 'ring', 'tree', 'hierarchical', ..."),
    ("comm_streams", "which collectives queue behind each other on a device: 'per-group' "
                     "(one stream per process group, i.e. per team of ranks, as NCCL "
                     "communicators run: a tensor-parallel all-reduce does not wait for a "
                     "data-parallel one; they share links) or 'shared' (default: one stream "
                     "for every collective, in program order)"),
    ("launch", "how the host launches kernels: 'async' (default: launches return at once, "
               "the host runs ahead of the device) or 'blocking' (each launch waits for its "
               "kernel, as under CUDA_LAUNCH_BLOCKING=1: one kernel, collective or group of "
               "point-to-point transfers at a time per device, in program order, no "
               "compute/communication overlap, the host's launch time before each; the "
               "estimator refuses it)"),
    ("comm_order", "when a collective may start: 'inputs' (once its inputs are "
                   "ready and every member has reached it, overlapping compute issued before "
                   "it) or 'stream' (default: also no earlier than the end of the compute op "
                   "issued before it on its device, as PyTorch's ProcessGroupNCCL orders the "
                   "communication stream behind the compute stream)"),
    ("p2p", "how the training engine issues its pipeline transfers: 'async' (default: a "
            "stage's transfers as one group, batch_isend_irecv, and the host goes on: "
            "compute after a send overlaps it; Megatron-core with overlap_p2p_comm), "
            "'synchronous' (grouped, and what the device issues after a group waits for all "
            "of it, sends included: Megatron-LM 2021-2022's torch.cuda.synchronize() after "
            "each) or "
            "'separate' (each send and receive its own call, as DeepSpeed's pipeline engine: "
            "a device's transfers one after another, one launch each under blocking "
            "launches, what follows waiting for them); the estimator refuses the last two "
            "with comm_order 'inputs'"),
    ("max_ops", "refuse, before building it, a program estimated at more than this many "
                "ops (None: 50,000,000; 0: no limit)"),
    ("max_wall_s", "stop a run still going after this many seconds of wall-clock time, "
                   "building and verifying the program included, with a SimulationError "
                   "(None or 0: no limit)"),
    ("max_trace_records", "at most this many timed records in trace.json when the result is "
                          "written; past it the trace is summarised (None: 1,000,000; 0: no "
                          "limit)"),
    ("record_links", "keep each link's utilisation over time, for links.png and trace.json's "
                     "link counters (default False; distsim simulate records them unless "
                     "--no-link-samples)"),
    ("progress", "a callable given a short message as each phase starts (building, "
                 "simulating)"),
))

BUILD: Group = ("Building", (
    ("max_ops", "refuse, before building it, a program estimated at more than this many "
                "ops (None: 50,000,000; 0: no limit)"),
    ("verify_program", "verify the built program (default True; distsim.simulate verifies it "
                       "itself, with the table the simulator reads)"),
))

#: The line of a docstring that :func:`with_option_docs` replaces.
MARKER = "@options"


def option_names(*groups: Group) -> Tuple[str, ...]:
    return tuple(name for _, entries in groups for name, _ in entries)


def format_groups(*groups: Group, indent: str = "    ") -> str:
    """The groups as docstring text: a heading, then one line per option."""
    width = max(len(name) for _, entries in groups for name, _ in entries) + 2
    lines = []
    for heading, entries in groups:
        lines += [f"{indent}{heading}:", ""]
        for name, text in entries:
            lines.append(f"{indent}  {name.ljust(width)}{text}")
        lines.append("")
    return "\n".join(lines).rstrip()


F = TypeVar("F", bound=Callable)


def with_option_docs(*groups: Group) -> Callable[[F], F]:
    """Put the groups' texts into the function's docstring, at the line
    :data:`MARKER`."""
    def apply(func: F) -> F:
        doc = func.__doc__ or ""
        assert f"    {MARKER}\n" in doc, f"{func.__name__}: no {MARKER} line in the docstring"
        func.__doc__ = doc.replace(f"    {MARKER}\n", format_groups(*groups) + "\n")
        return func
    return apply
