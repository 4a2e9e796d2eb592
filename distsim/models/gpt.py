"""GPT / Llama decoders at the op level, on one device.

:func:`gpt_forward` builds the forward pass and loss of one micro-batch on
one device; it runs as is in the NumpyExecutor. Tensor and sequence
parallelism are not written here: the ``megatron`` plan places this
program over the tensor-parallel ranks (Megatron-LM's layout, by
structure) and the sharding layer lowers it
(:func:`~distsim.transforms.parallelize.template_step`, called by
:func:`.gpt_family.build_gpt_step`). What the plan needs of the model is
its shape: the fused QKV (and SwiGLU's gate/up) projection is one weight
whose product is ``split`` into its blocks, the output layer is the
embedding read transposed (or ``lm_head``), and the vocabulary is padded
to a multiple of the tensor-parallel size (``pad_for``, Megatron's
padding; :func:`check_tensor_parallel` refuses sizes tp does not divide).

Layout of activations: ``(batch, seq, hidden)``; attention heads are
grouped by key/value head ``(batch, kv_heads, group, seq, head_dim)`` so
that grouped-query attention broadcasts keys and values in the matmul.

``meta`` of the function: ``roles`` (param / data / const), ``params``
(names in order), ``loss``, ``tied`` (``head copy -> embedding`` when the
output layer is a separate copy of the embedding), ``param_unpadded``
(``name -> rows`` of a padded vocabulary) and ``consts`` (constant inputs,
role ``const``: with padding, ``vocab_mask`` is added to the logits so
that the padded entries stay out of the softmax and the step trains the
same model as without padding).
Each op's ``meta["layer"]`` is -1 for the embedding, ``0..layers-1`` for
transformer layers and ``layers`` for the final norm, output layer and loss;
the attention core (scores, mask, softmax, dropout) has
``meta["attn_core"] = True`` (what selective recomputation recomputes).

``attention: fused`` (:class:`GPTConfig`) writes the attention core as one
``fused_attention`` op (FlashAttention: q, k, v -> the context and the
row log-sum-exps, the attention dropout inside the kernel) instead of
scores, scale, mask, softmax, dropout and the product with v; its backward,
one ``fused_attention_grad``, recomputes the probabilities from q, k, v
and the saved log-sum-exps. No ``seq x seq`` value exists, so the op is not
``attn_core``: selective recomputation has nothing to recompute in such an
attention (the op keeps q, k and v, as selective recomputation does, plus
its output and log-sum-exps, both linear in the sequence length).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..ir.builder import FunctionBuilder
from ..ir.core import Function, Value
from ..ir.types import DType, TensorType, parse_float_dtype
from ..transforms.context_parallel import check_context_parallel
from .gpt_context import (chunk_attrs, gather_sequence, heads_for_sequence, position_rows,
                          ring_attention, sequence_for_heads, ulysses_chunk_attrs)
from .moe import (check_moe, expert_slots, expert_tokens, is_moe_layer, loads_tuple,
                  mlp_params, moe_mlp_params)

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu", "relu")
POSITIONS = ("learned", "rope", "none")
ATTENTIONS = ("explicit", "fused")
#: the kernel names a model may give ``attention_kernel`` (the device file
#: holds their figures: :mod:`distsim.cost.attention_time`)
ATTENTION_KERNELS = ("cudnn",)
LOSS_DTYPES = ("fp32", "model")


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a decoder-only transformer and of its training batch.

    ``ffn`` defaults to ``4 * hidden``; ``kv_heads`` to ``heads``;
    ``head_dim`` to ``hidden // heads``. ``bias``: biases on every linear
    layer; ``qkv_bias`` (default: as ``bias``) on the query, key and value
    projections, which some models keep alone (Qwen2). ``activation``:
    ``gelu`` or ``relu`` in a plain MLP, ``swiglu`` gated. ``published_params`` is the count
    the model's authors give (only compared against, never used).
    Learned position embeddings (``position: learned``) are a table of
    ``positions`` rows (GPT-2's ``n_positions``; default ``seq``) of which a
    step uses the first ``seq``, so a model trained at a shorter sequence
    keeps its parameter count.
    Rotary position embeddings (``position: rope``) have no parameters and
    are not modelled as ops (their cost is a few element-wise passes).
    ``attention``: ``explicit`` (default) writes the attention core as
    separate ops (scores, scale, causal mask, softmax, dropout, context),
    whose ``seq x seq`` probabilities are saved for the backward pass;
    ``fused`` as one FlashAttention kernel (``fused_attention``), which saves
    only its output and the row log-sum-exps and recomputes the rest in the
    backward pass (see the module docstring).
    ``attention_kernel`` names the fused kernel's implementation whose
    figures time it (``cudnn``: cuDNN's fused attention, which Transformer
    Engine runs under ``NVTE_FUSED_ATTN=1``); none (default) is the
    device's default kernel (FlashAttention-2 on the calibrated devices).
    ``experts`` > 0 makes a mixture-of-experts model (router, top-k routed
    experts, shared experts, dense layers interleaved: :mod:`.moe`);
    ``published_active_params`` is its authors' count of the parameters
    one token uses.
    ``loss_dtype``: ``fp32`` casts the logits to float32 and computes the
    cross entropy on them, as Megatron-LM
    (``vocab_parallel_cross_entropy(output.float(), labels)``) and Hugging
    Face's causal-LM heads (``logits.float()``) do: the cast, the loss's
    passes and its gradient move float32 logits, and the float32 copy lives
    until the backward reads it (a model already in f32 or f64 keeps its
    own; under ``fusion: megatron`` the lowering writes a float32 loss as
    Megatron's vocabulary-parallel steps at every ``tp``, one rank
    included); ``model`` (default) keeps the loss in ``dtype`` (Megatron's
    ``--fp16-lm-cross-entropy``). Not yet ``fp32`` by default: the fast
    estimator's ZeRO-2 pipeline peak and its extrapolated interleaved
    timeline depart from the simulation's with it."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: Optional[int] = None
    head_dim: Optional[int] = None
    ffn: Optional[int] = None
    vocab: int = 128
    seq: int = 16
    norm: str = "layernorm"
    activation: str = "gelu"
    bias: bool = True
    qkv_bias: Optional[bool] = None
    tied_embeddings: bool = True
    position: str = "learned"
    positions: Optional[int] = None
    attention: str = "explicit"
    attention_kernel: Optional[str] = None
    loss_dtype: str = "model"
    dropout: float = 0.0
    dtype: str = "bf16"
    master_dtype: str = "f32"
    global_batch: int = 8
    micro_batch: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    momentum: float = 0.0
    norm_eps: float = 1e-5
    experts: int = 0
    top_k: int = 1
    expert_ffn: Optional[int] = None
    shared_experts: int = 0
    dense_layers: int = 0
    moe_every: int = 1
    capacity_factor: Optional[float] = None
    routing_skew: float = 0.0
    expert_loads: Optional[Tuple[float, ...]] = None
    norm_topk: bool = True
    dispatch: str = "padded"
    published_params: Optional[float] = None
    published_active_params: Optional[float] = None
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq", "global_batch", "micro_batch"):
            _positive(name, getattr(self, name))
        for name in ("kv_heads", "head_dim", "ffn", "positions"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"heads: {self.heads} heads do not divide hidden size {self.hidden} "
                              "(give head_dim)")
        if self.num_kv_heads > self.heads or self.heads % self.num_kv_heads:
            raise ConfigError(f"kv_heads: {self.num_kv_heads} must divide heads ({self.heads})")
        for name, allowed in (("norm", NORMS), ("activation", ACTIVATIONS),
                              ("position", POSITIONS), ("attention", ATTENTIONS),
                              ("loss_dtype", LOSS_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: must be one of {', '.join(allowed)}, "
                                  f"got {getattr(self, name)!r}")
        if self.attention_kernel is not None:
            if self.attention_kernel not in ATTENTION_KERNELS:
                raise ConfigError(f"attention_kernel: must be one of "
                                  f"{', '.join(ATTENTION_KERNELS)} (or none, the device's "
                                  f"default), got {self.attention_kernel!r}")
            if self.attention != "fused":
                raise ConfigError("attention_kernel: names a fused attention kernel; it needs "
                                  "attention: fused")
        if self.positions is not None and self.position != "learned":
            raise ConfigError(f"positions: a table of learned positions needs position: learned "
                              f"(got position: {self.position})")
        if self.num_positions < self.seq:
            raise ConfigError(f"seq: {self.seq} is longer than the {self.num_positions} learned "
                              "positions (positions)")
        if not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout: must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) \
                or not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum: must be in [0, 1), got {self.momentum!r}")
        _number("lr", self.lr, positive=True)
        _number("weight_decay", self.weight_decay, positive=False)
        _number("norm_eps", self.norm_eps, positive=True)
        for name in ("published_params", "published_active_params"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name), positive=True)
        object.__setattr__(self, "expert_loads", loads_tuple(self.expert_loads))
        check_moe(self)
        if self.qkv_bias is not None and not isinstance(self.qkv_bias, bool):
            raise ConfigError(f"qkv_bias: must be true or false, got {self.qkv_bias!r}")
        for name in ("bias", "tied_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.description, str):
            raise ConfigError(f"description: must be text, got {self.description!r}")
        parse_float_dtype("dtype", self.dtype)
        parse_float_dtype("master_dtype", self.master_dtype)
        if self.global_batch % self.micro_batch:
            raise ConfigError(f"global_batch: {self.global_batch} is not a multiple of "
                              f"micro_batch {self.micro_batch}")

    # -- derived sizes ---------------------------------------------------
    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the query, key and value projections have biases."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn_size(self) -> int:
        """Feed-forward size of one routed (and one shared) expert."""
        return self.expert_ffn or self.ffn_size

    @property
    def num_positions(self) -> int:
        """Rows of the learned position table."""
        return self.positions or self.seq

    def parameter_count(self, active: bool = False) -> int:
        """Parameters of the model (embeddings counted once when tied);
        ``active``: those one token uses (``top_k`` of a MoE layer's routed
        experts, the router and everything else)."""
        h, d = self.hidden, self.dim_head
        qkv = h * (self.heads + 2 * self.num_kv_heads) * d
        out = self.heads * d * h
        norm = 2 * h if self.norm == "layernorm" else h
        attention = qkv + out + 2 * norm + (h if self.bias else 0)
        if self.has_qkv_bias:
            attention += (self.heads + 2 * self.num_kv_heads) * d
        dense = mlp_params(h, self.ffn_size, self.activation == "swiglu", self.bias)
        routed = self.top_k if active else self.experts
        total = self.layers * attention + norm + self.vocab * h
        for i in range(self.layers):
            total += moe_mlp_params(self, routed) if is_moe_layer(self, i) else dense
        if not self.tied_embeddings:
            total += self.vocab * h
        if self.position == "learned":
            total += self.num_positions * h
        return total

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        if self.expert_loads is not None:
            out["expert_loads"] = list(self.expert_loads)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "gpt") -> "GPTConfig":
        allowed = {f.name for f in fields(cls)}
        for key in data:
            if key not in allowed:
                raise ConfigError(f"{where}: unknown field '{key}' "
                                  f"(allowed: {', '.join(sorted(allowed))})")
        try:
            return cls(**dict(data))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: must be a positive integer, got {value!r}")


def _number(name: str, value: Any, positive: bool) -> None:
    """A finite real (> 0, or >= 0): a NaN or a string here would reach the
    optimizer's attributes and the summary's config, where it turns into a
    crash (NaN is not JSON) or a silently meaningless run."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a number >= 0"
        raise ConfigError(f"{name}: must be {need}, got {value!r}")


def padded_vocab(config: GPTConfig, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``tp`` (Megatron pads it
    so that every rank holds an equal shard)."""
    return -(-config.vocab // tp) * tp


def check_tensor_parallel(config: GPTConfig, tp: int, sp: bool) -> None:
    if config.heads % tp:
        raise ConfigError(f"--tp {tp} does not divide the {config.heads} attention heads")
    if config.num_kv_heads % tp:
        raise ConfigError(f"--tp {tp} does not divide the {config.num_kv_heads} key/value heads")
    if config.ffn_size % tp and any(not is_moe_layer(config, i) for i in range(config.layers)):
        raise ConfigError(f"--tp {tp} does not divide the feed-forward size {config.ffn_size}")
    if config.experts and config.expert_ffn_size % tp:
        raise ConfigError(f"--tp {tp} does not divide the experts' feed-forward size "
                          f"{config.expert_ffn_size}")
    if sp and config.seq % tp:
        raise ConfigError(f"--sp: --tp {tp} does not divide the sequence length {config.seq}")


class _GPTBuilder:
    def __init__(self, config: GPTConfig, micro_batch: int, device: Optional[int], untie: bool,
                 pad_for: int, cp: int = 1, cp_comm: str = "allgather") -> None:
        self.c = config
        self.cp = cp
        self.ring = cp > 1 and cp_comm == "ring"
        self.ulysses = cp > 1 and cp_comm == "alltoall"
        #: tokens of a sequence on this rank (a context-parallel rank's share)
        self.seq = config.seq // cp
        self.vocab = padded_vocab(config, pad_for)
        self.mb = micro_batch
        self.device = device
        self.untie = untie
        self.dtype = DType.parse(config.dtype)
        self.b = FunctionBuilder("gpt_step")
        self.roles: Dict[str, str] = {}
        self.params: List[str] = []
        self.unpadded: Dict[str, int] = {}
        self.consts: Dict[str, Dict[str, Any]] = {}
        self.layer = -1

    # -- helpers -----------------------------------------------------------
    def t(self, *shape: int, dtype: Optional[DType] = None) -> TensorType:
        return TensorType(tuple(shape), dtype or self.dtype, self.device)

    def op(self, op_type: str, inputs, attrs=None, name=None, **meta):
        meta["layer"] = self.layer
        return self.b.op(op_type, inputs, attrs, name=name, meta=meta)

    def param(self, name: str, shape: Tuple[int, ...]) -> Value:
        v = self.b.input(name, self.t(*shape))
        self.roles[name] = "param"
        self.params.append(name)
        return v

    def norm(self, x: Value, prefix: str) -> Value:
        h = self.c.hidden
        g = self.param(f"{prefix}_g", (h,))
        if self.c.norm == "rmsnorm":
            return self.op("rmsnorm", [x, g], {"eps": self.c.norm_eps}, name=f"{prefix}_out")
        bta = self.param(f"{prefix}_b", (h,))
        return self.op("layernorm", [x, g, bta], {"eps": self.c.norm_eps}, name=f"{prefix}_out")

    def dropout(self, x: Value, name: str, **meta) -> Value:
        if self.c.dropout <= 0:
            return x
        return self.op("dropout", [x], {"p": self.c.dropout}, name=[name, f"{name}_mask"],
                       **meta)[0]

    def linear(self, x: Value, w: Value, bias: Optional[Value], name: str) -> Value:
        y = self.op("matmul", [x, w], name=name)
        if bias is not None:
            y = self.op("add", [y, bias], name=f"{name}_b")
        return y

    # -- the model ---------------------------------------------------------
    def embed(self, ids: Value) -> Value:
        c = self.c
        self.layer = -1
        wte = self.param("wte", (self.vocab, c.hidden))
        if self.vocab != c.vocab:
            self.unpadded["wte"] = c.vocab
        x = self.op("embedding", [wte, ids], name="emb")
        if c.position == "learned":
            wpe = self.param("wpe", (c.num_positions, c.hidden))
            if self.cp > 1:
                wpe = position_rows(self.op, wpe, self.cp, c.seq)
            elif c.num_positions > c.seq:  # the first seq rows of the table
                wpe = self.op("slice", [wpe], {"axis": 0, "start": 0, "stop": c.seq},
                              name="wpe_rows")
            x = self.op("add", [x, wpe], name="emb_pos")
        return self.dropout(x, "emb_drop")

    def attention(self, x: Value, i: int) -> Value:
        c, mb = self.c, self.mb
        s, d = self.seq, c.dim_head
        heads, kv = c.heads, c.num_kv_heads
        group = heads // kv
        p = f"l{i}"
        width = (heads + 2 * kv) * d
        wqkv = self.param(f"{p}_wqkv", (c.hidden, width))
        bqkv = self.param(f"{p}_bqkv", (width,)) if c.has_qkv_bias else None
        wo = self.param(f"{p}_wo", (heads * d, c.hidden))
        bo = self.param(f"{p}_bo", (c.hidden,)) if c.bias else None
        h = self.norm(x, f"{p}_ln1")
        qkv = self.linear(h, wqkv, bqkv, f"{p}_qkv")
        q, k, v = self.op("split", [qkv], {"axis": 2, "sizes": [heads * d, kv * d, kv * d]},
                          name=[f"{p}_q", f"{p}_k", f"{p}_v"])
        q = self.op("reshape", [q], {"shape": [mb, s, kv, group, d]}, name=f"{p}_q")
        q = self.op("transpose", [q], {"perm": [0, 2, 3, 1, 4]}, name=f"{p}_q")
        k = self.op("reshape", [k], {"shape": [mb, s, kv, 1, d]}, name=f"{p}_k")
        k = self.op("transpose", [k], {"perm": [0, 2, 3, 1, 4]}, name=f"{p}_k")
        v = self.op("reshape", [v], {"shape": [mb, s, kv, 1, d]}, name=f"{p}_v")
        v = self.op("transpose", [v], {"perm": [0, 2, 3, 1, 4]}, name=f"{p}_v")
        chunks: Dict[str, Any] = {"attrs": {}, "meta": {}}
        if self.ulysses:
            q, k, v = heads_for_sequence(self.op, [q, k, v], self.cp, p)
            chunks = ulysses_chunk_attrs(self.cp)
        elif self.cp > 1 and not self.ring:
            k = gather_sequence(self.op, k, self.cp, f"{p}_k")
            v = gather_sequence(self.op, v, self.cp, f"{p}_v")
            chunks = chunk_attrs(self.cp)
        fused = {"scale": 1.0 / math.sqrt(d), "causal": True, "dropout": float(c.dropout)}
        if c.attention_kernel is not None:
            fused["kernel"] = c.attention_kernel
        if self.ring:
            ctx = ring_attention(self.op, q, k, v, self.cp, fused, p)
        elif c.attention == "fused":
            ctx, _ = self.op("fused_attention", [q, k, v], {**fused, **chunks["attrs"]},
                             name=[f"{p}_ctx", f"{p}_lse"], **chunks["meta"])
        else:
            core = {"attn_core": True}
            scores = self.op("matmul", [q, k], {"trans_b": True}, name=f"{p}_scores", **core)
            scores = self.op("scale", [scores], {"factor": 1.0 / math.sqrt(d)},
                             name=f"{p}_scores", **core)
            scores = self.op("causal_mask", [scores], chunks["attrs"] or None,
                             name=f"{p}_masked", **core, **chunks["meta"])
            probs = self.op("softmax", [scores], {"axis": -1}, name=f"{p}_probs", **core)
            probs = self.dropout(probs, f"{p}_probs_drop", **core)
            ctx = self.op("matmul", [probs, v], name=f"{p}_ctx")
        if self.ulysses:
            ctx = sequence_for_heads(self.op, ctx, self.cp, p)
        ctx = self.op("transpose", [ctx], {"perm": [0, 3, 1, 2, 4]}, name=f"{p}_ctx")
        ctx = self.op("reshape", [ctx], {"shape": [mb, s, heads * d]}, name=f"{p}_ctx")
        out = self.linear(ctx, wo, bo, f"{p}_proj")
        out = self.dropout(out, f"{p}_attn_drop")
        return self.op("add", [x, out], name=f"{p}_res1")

    def ffn_params(self, p: str, f: int, experts: int = 0) -> Tuple[Any, ...]:
        """The weights of an MLP of size ``f``: ``{p}_w1``, ``{p}_w2`` and
        biases ``_b1``, ``_b2``; with ``experts``, that many MLPs' weights
        stacked on a leading dim."""
        c = self.c
        width = 2 * f if c.activation == "swiglu" else f
        lead = (experts,) if experts else ()
        row = (1,) if experts else ()
        w1 = self.param(f"{p}_w1", lead + (c.hidden, width))
        b1 = self.param(f"{p}_b1", lead + row + (width,)) if c.bias else None
        w2 = self.param(f"{p}_w2", lead + (f, c.hidden))
        b2 = self.param(f"{p}_b2", lead + row + (c.hidden,)) if c.bias else None
        return p, f, w1, b1, w2, b2

    def ffn(self, h: Value, weights: Tuple[Any, ...]) -> Value:
        """The MLP of :meth:`ffn_params` on ``h`` (batched over experts:
        ``h`` is ``experts x slots x hidden``)."""
        p, f, w1, b1, w2, b2 = weights
        h = self.linear(h, w1, b1, f"{p}_fc1")
        if self.c.activation == "swiglu":
            gate, up = self.op("split", [h], {"axis": h.type.rank - 1, "sizes": [f, f]},
                               name=[f"{p}_gate", f"{p}_up"])
            h = self.op("mul", [self.op("silu", [gate], name=f"{p}_act"), up], name=f"{p}_glu")
        else:
            h = self.op(self.c.activation, [h], name=f"{p}_act")
        return self.linear(h, w2, b2, f"{p}_fc2")

    def mlp(self, x: Value, i: int) -> Value:
        c, p = self.c, f"l{i}"
        if is_moe_layer(c, i):
            weights = (self.param(f"{p}_router", (c.hidden, c.experts)),
                       self.ffn_params(f"{p}_experts", c.expert_ffn_size, c.experts),
                       self.ffn_params(f"{p}_shared", c.shared_experts * c.expert_ffn_size)
                       if c.shared_experts else None)
            out = self.moe(self.norm(x, f"{p}_ln2"), p, *weights)
        else:
            weights = self.ffn_params(p, c.ffn_size)
            out = self.ffn(self.norm(x, f"{p}_ln2"), weights)
        out = self.dropout(out, f"{p}_mlp_drop")
        return self.op("add", [x, out], name=f"{p}_res2")

    def moe(self, h: Value, p: str, router: Value, experts: Tuple[Any, ...],
            shared: Optional[Tuple[Any, ...]]) -> Value:
        """A MoE layer's MLP part (:mod:`.moe`): the router's probabilities
        choose each token's experts; ``moe_dispatch`` copies the tokens into
        their experts' slots, the experts run batched, ``moe_combine`` sums
        each token's expert outputs weighted by its gates; shared experts
        are one dense MLP beside them. The tokens are this rank's (its two
        chunks of each sequence under context parallelism), routed at their
        own capacity, as Megatron-core's dispatcher routes a cp rank's."""
        c, mb = self.c, self.mb
        tokens = mb * self.seq
        route = {"top_k": c.top_k, "capacity": expert_slots(c, tokens)}
        flat = self.op("reshape", [h], {"shape": [tokens, c.hidden]}, name=f"{p}_tokens")
        logits = self.op("matmul", [flat, router], name=f"{p}_router_logits")
        probs = self.op("softmax", [logits], {"axis": -1}, name=f"{p}_router_probs")
        counts = {"expert_tokens": expert_tokens(c, tokens)} if c.dispatch == "dropless" else {}
        if c.dispatch == "allgather":
            counts = {"dispatcher": "allgather"}
        slots = self.op("moe_dispatch", [flat, probs], route, name=f"{p}_dispatch", **counts)
        y = self.ffn(slots, experts)
        out = self.op("moe_combine", [y, probs], {**route, "normalize": c.norm_topk},
                      name=f"{p}_combine")
        out = self.op("reshape", [out], {"shape": [mb, self.seq, c.hidden]}, name=f"{p}_moe_out")
        if shared is not None:
            out = self.op("add", [out, self.ffn(h, shared)], name=f"{p}_moe_sum")
        return out

    def head(self, x: Value, labels: Value) -> Value:
        c = self.c
        self.layer = c.layers
        vocab = self.vocab
        h = self.norm(x, "lnf")
        if c.tied_embeddings and not self.untie:
            w = self.b.function.inputs[[v.name for v in self.b.function.inputs].index("wte")]
        else:
            w = self.param("lm_head", (vocab, c.hidden))
            if vocab != c.vocab:
                self.unpadded["lm_head"] = c.vocab
        logits = self.op("matmul", [h, w], {"trans_b": True}, name="logits")
        if vocab != c.vocab:
            # padded vocabulary: the padding's logits pushed out of the softmax
            mask = self.b.input("vocab_mask", self.t(vocab))
            self.roles[mask.name] = "const"
            self.consts[mask.name] = {"kind": "vocab_pad", "valid": c.vocab, "shard": vocab}
            logits = self.op("add", [logits, mask], name="logits_masked")
        if c.loss_dtype == "fp32" and logits.type.dtype.itemsize < DType.F32.itemsize:
            # the half-precision logits upcast (a model in f32 or f64 keeps its own)
            logits = self.op("cast", [logits], {"dtype": DType.F32.value}, name="logits_f32")
        return self.op("cross_entropy", [logits, labels], name="loss")

    def build(self) -> Function:
        c, mb = self.c, self.mb
        ids = self.b.input("ids", self.t(mb, self.seq, dtype=DType.I64))
        labels = self.b.input("labels", self.t(mb, self.seq, dtype=DType.I64))
        self.roles.update(ids="data", labels="data")
        x = self.embed(ids)
        for i in range(c.layers):
            self.layer = i
            x = self.attention(x, i)
            x = self.mlp(x, i)
        loss = self.head(x, labels)
        f = self.b.finish([loss])
        f.meta.update(roles=self.roles, params=list(self.params), loss=loss.name,
                      batch_inputs=["ids", "labels"], param_unpadded=dict(self.unpadded),
                      consts=dict(self.consts), model={"family": "gpt", **c.to_dict()})
        if self.untie and c.tied_embeddings:
            f.meta["tied"] = {"lm_head": "wte"}
        return f


def gpt_forward(config: GPTConfig, micro_batch: Optional[int] = None,
                device: Optional[int] = 0, untie: bool = False,
                pad_for: int = 1, cp: int = 1, cp_comm: str = "allgather") -> Function:
    """Forward pass and loss of one micro-batch on one device (see the
    module docstring). ``untie``: give the output layer its own copy of a
    tied embedding (``meta["tied"]``), as pipeline stages do. ``pad_for``:
    pad the vocabulary as for that many tensor-parallel ranks (Megatron's
    padding, :func:`padded_vocab`): the one-device model that the megatron
    plan splits over them. ``cp``: the forward of context-parallel rank 0
    of ``cp`` (its two chunks of each sequence, the keys and values
    gathered over the group: :mod:`.gpt_context`); the other ranks' own
    attributes are in the ops' ``meta["cp_rank_attrs"]``; ``cp_comm``
    ``ring``: ring attention instead of the gather (fused attention only),
    ``alltoall``: DeepSpeed-Ulysses' exchange of sequence for heads."""
    mb = micro_batch if micro_batch is not None else config.micro_batch
    _positive("micro_batch", mb)
    _positive("pad_for", pad_for)
    _positive("cp", cp)
    check_context_parallel(config.seq, cp)
    if cp > 1 and cp_comm == "ring" and config.attention != "fused":
        raise ConfigError("--cp-comm ring: ring attention merges its blocks by the log-sum-exps "
                          "of the fused attention kernel; it needs attention: fused "
                          "(--attention fused)")
    return _GPTBuilder(config, mb, device, untie, pad_for, cp, cp_comm).build()
