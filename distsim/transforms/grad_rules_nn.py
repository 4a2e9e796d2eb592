"""Gradient rules of the neural-network ops and of the element-wise ops the
first rule table left out (gelu, tanh, sigmoid, sqrt, div, log, silu), and
of the SPMD collectives under Megatron's conventions: the gradient of a
replicated value is complete on every rank, so an all-reduce's gradient is
the identity and a copy's (*f*) gradient is an all-reduce; all-gather and
reduce-scatter are each other's gradient.
"""
from __future__ import annotations

from .grad_rules import NON_DIFFERENTIABLE, _name, grad_rule, unbroadcast

NON_DIFFERENTIABLE.add("stop_gradient")


@grad_rule("gelu", "silu")
def _act(b, op, grads):
    return [b.op(f"{op.op_type}_grad", [grads[0], op.inputs[0]], name=_name(op, 0))]


@grad_rule("tanh")
def _tanh(b, op, grads):
    g, y = grads[0], op.outputs[0]
    gyy = b.op("mul", [b.op("mul", [g, y], name=_name(op, 0)), y], name=_name(op, 0))
    return [b.op("sub", [g, gyy], name=_name(op, 0))]


@grad_rule("sigmoid")
def _sigmoid(b, op, grads):
    g, y = grads[0], op.outputs[0]
    gy = b.op("mul", [g, y], name=_name(op, 0))
    return [b.op("sub", [gy, b.op("mul", [gy, y], name=_name(op, 0))], name=_name(op, 0))]


@grad_rule("sqrt")
def _sqrt(b, op, grads):
    q = b.op("div", [grads[0], op.outputs[0]], name=_name(op, 0))
    return [b.op("scale", [q], {"factor": 0.5}, name=_name(op, 0))]


@grad_rule("log")
def _log(b, op, grads):
    return [b.op("div", [grads[0], op.inputs[0]], name=_name(op, 0))]


@grad_rule("div")
def _div(b, op, grads):
    (g,) = grads
    x, y = op.inputs
    dx = b.op("div", [g, y], name=_name(op, 0))
    dy = b.op("neg", [b.op("div", [b.op("mul", [g, op.outputs[0]], name=_name(op, 1)), y],
                           name=_name(op, 1))], name=_name(op, 1))
    return [unbroadcast(b, dx, x.type.shape, _name(op, 0)),
            unbroadcast(b, dy, y.type.shape, _name(op, 1))]


@grad_rule("transpose")
def _transpose(b, op, grads):
    perm = list(op.attrs["perm"])
    inverse = [perm.index(i) for i in range(len(perm))]
    return [b.op("transpose", [grads[0]], {"perm": inverse}, name=_name(op, 0))]


@grad_rule("softmax", "log_softmax")
def _softmax(b, op, grads):
    return [b.op(f"{op.op_type}_grad", [grads[0], op.outputs[0]], {"axis": op.attrs["axis"]},
                 name=_name(op, 0))]


@grad_rule("layernorm")
def _layernorm(b, op, grads):
    x, gamma, beta = op.inputs
    return list(b.op("layernorm_grad", [grads[0], x, gamma],
                     {"axis": op.attrs["axis"], "eps": op.attrs["eps"]},
                     name=[_name(op, 0), _name(op, 1), _name(op, 2)]))


@grad_rule("rmsnorm")
def _rmsnorm(b, op, grads):
    x, gamma = op.inputs
    return list(b.op("rmsnorm_grad", [grads[0], x, gamma], {"eps": op.attrs["eps"]},
                     name=[_name(op, 0), _name(op, 1)]))


@grad_rule("fused_attention")
def _fused_attention(b, op, grads):
    """One ``fused_attention_grad`` reading q, k, v, out and lse (what a
    FlashAttention backward keeps from the forward); lse's gradient, when
    lse is used, goes in as a seventh input."""
    dout, dlse = grads
    out, lse = op.outputs
    if dout is None:
        dout = b.op("zeros_like", [out], name=f"d_{out.name}")
    inputs = [dout, *op.inputs, out, lse] + ([dlse] if dlse is not None else [])
    return list(b.op("fused_attention_grad", inputs, dict(op.attrs),
                     name=[_name(op, 0), _name(op, 1), _name(op, 2)]))


@grad_rule("embedding")
def _embedding(b, op, grads):
    table, ids = op.inputs
    return [b.op("embedding_grad", [grads[0], ids],
                 {"num_embeddings": table.type.shape[0], "offset": op.attrs.get("offset", 0)},
                 name=_name(op, 0)), None]


@grad_rule("cross_entropy")
def _cross_entropy(b, op, grads):
    logits, labels = op.inputs
    return [b.op("cross_entropy_grad", [grads[0], logits, labels], name=_name(op, 0)), None]


@grad_rule("select_label")
def _select_label(b, op, grads):
    logits, labels = op.inputs
    return [b.op("select_label_grad", [grads[0], logits, labels],
                 {"offset": op.attrs.get("offset", 0)}, name=_name(op, 0)), None]


@grad_rule("causal_mask")
def _causal_mask(b, op, grads):
    chunks = {k: op.attrs[k] for k in ("q_chunks", "k_chunks") if op.attrs.get(k)}
    return [b.op("causal_mask", [grads[0]], {"fill": 0.0, **chunks}, name=_name(op, 0))]


@grad_rule("concat")
def _concat(b, op, grads):
    sizes = [v.type.shape[op.attrs["axis"]] for v in op.inputs]
    names = [_name(op, i) for i in range(len(op.inputs))]
    parts = b.op("split", [grads[0]], {"axis": op.attrs["axis"], "sizes": sizes}, name=names)
    return list(parts) if isinstance(parts, tuple) else [parts]


@grad_rule("split")
def _split(b, op, grads):
    parts = [g if g is not None else b.op("zeros_like", [v], name=f"d_{v.name}")
             for g, v in zip(grads, op.outputs)]
    return [b.op("concat", parts, {"axis": op.attrs["axis"]}, name=_name(op, 0))]


@grad_rule("slice")
def _slice(b, op, grads):
    dim = op.inputs[0].type.shape[op.attrs["axis"]]
    return [b.op("pad", [grads[0]], {"axis": op.attrs["axis"], "before": op.attrs["start"],
                                     "after": dim - op.attrs["stop"]}, name=_name(op, 0))]


@grad_rule("pad")
def _pad(b, op, grads):
    before = op.attrs.get("before", 0)
    size = op.inputs[0].type.shape[op.attrs["axis"]]
    return [b.op("slice", [grads[0]], {"axis": op.attrs["axis"], "start": before,
                                       "stop": before + size}, name=_name(op, 0))]


@grad_rule("dropout")
def _dropout(b, op, grads):
    return [b.op("dropout_grad", [grads[0], op.outputs[1]], {"p": op.attrs["p"]},
                 name=_name(op, 0))]


@grad_rule("depend")
def _depend(b, op, grads):
    return [grads[0], None]


@grad_rule("spmd.allreduce")
def _spmd_allreduce(b, op, grads):
    if op.attrs.get("reduce_op", "sum") != "sum":
        return [None]
    return [grads[0]]


@grad_rule("spmd.copy")
def _spmd_copy(b, op, grads):
    return [b.op("spmd.allreduce", [grads[0]], {"group": op.attrs["group"],
                                                "size": op.attrs["size"]}, name=_name(op, 0))]


@grad_rule("spmd.allgather")
def _spmd_allgather(b, op, grads):
    return [b.op("spmd.reducescatter", [grads[0]],
                 {"group": op.attrs["group"], "size": op.attrs["size"], "dim": op.attrs["dim"]},
                 name=_name(op, 0))]


@grad_rule("spmd.shift")
def _spmd_shift(b, op, grads):
    return [b.op("spmd.shift", [grads[0]], {"group": op.attrs["group"], "size": op.attrs["size"],
                                            "offset": -int(op.attrs["offset"])},
                 name=_name(op, 0))]


@grad_rule("spmd.alltoall")
def _spmd_alltoall(b, op, grads):
    return [b.op("spmd.alltoall", [grads[0]],
                 {"group": op.attrs["group"], "size": op.attrs["size"],
                  "split_dim": op.attrs["concat_dim"], "concat_dim": op.attrs["split_dim"]},
                 name=_name(op, 0))]


@grad_rule("spmd.reducescatter")
def _spmd_reducescatter(b, op, grads):
    return [b.op("spmd.allgather", [grads[0]],
                 {"group": op.attrs["group"], "size": op.attrs["size"], "dim": op.attrs["dim"]},
                 name=_name(op, 0))]
