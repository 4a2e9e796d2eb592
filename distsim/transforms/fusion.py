"""Kernel fusion as the framework being simulated runs it.

``Fuse(fusion)(step)`` takes a training step (after autodiff and
recomputation, before :class:`~distsim.transforms.spmd.LowerSPMD`) and
replaces each chain of adjacent ops that the framework runs as one kernel
by one ``fused`` op (:mod:`distsim.ir.ops_fused`) holding the chain as its
function, with the attribute ``kernel`` naming its parts
(``scale+mask+softmax``). The cost model prices such an op as one kernel
(:meth:`~distsim.cost.model.CostModel.kernel_cost`): one launch, the
group's external inputs read once and its external outputs written once
(intermediates never touch memory), and its parts' arithmetic. The trace
shows it as one slice named after its parts.

The settings (``--fusion``):

- ``megatron``: Megatron-LM's kernels, the
  fused scale-mask-softmax forward (``scale+mask+softmax``) and backward
  (``softmax_grad+mask+scale``), bias-GeLU (``bias+gelu``), bias-dropout-add
  (``bias+dropout+add``, or ``dropout+add`` without a bias) and the bias of
  a linear layer that no other fused kernel takes added in the GEMM
  (``matmul+bias``, ``F.linear``); Megatron-LM's float32 loss at one
  tensor-parallel rank is its vocabulary-parallel steps, unfused
  (:func:`~distsim.transforms.parallelize.differentiated_template`);
- ``megatron-core``: Megatron-core with Transformer Engine, as NeMo runs
  it: ``megatron``'s kernels, SwiGLU's forward as one kernel
  (``silu+mul``, ``bias_swiglu_fusion``), and the loss as one fused
  cross-entropy kernel at one tensor-parallel rank
  (``cross_entropy_loss_fusion``: no unfused steps);
- ``pytorch-eager``: PyTorch run eagerly: only ``F.linear``'s bias in the
  GEMM; scale, mask, softmax, dropout, GeLU and residual adds each one
  kernel;
- ``none``: every op its own kernel, the default of every family but
  the GPT family's (``megatron``: :func:`~distsim.transforms.strategy.fusion_for`
  says why).

LayerNorm and RMSNorm are one op (one kernel) under every setting; so is
FlashAttention (the model's ``attention: fused``), which leaves no
scale, mask or softmax to fuse. A chain fuses only where each part reads
the previous part's first result, the parts are adjacent in the program,
in one layer and phase, and none makes a parameter's gradient; a result
that an op outside the chain reads (a dropout mask saved for the backward
pass) is written.

Each fused op is a :class:`~distsim.transforms.coarsen.Segment`, the
device-free function coarsening builds from a run of ops: the same
grouping, a different cost rule. Coarsening (``--coarsen``) may later take
a fused kernel into one of its runs.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..ir.core import Function, Op, Value
from ..ir.ops_fused import FUSED
from .strategy import FUSIONS, check_field

#: (kernel name, the op types of its parts in order, a check of the parts)
Rule = Tuple[str, Tuple[str, ...], Optional[Callable[[Sequence[Op]], bool]]]


def _bias(op: Op) -> bool:
    """An ``add`` of a one-dimensional second operand (a bias)."""
    return op.op_type == "add" and len(op.inputs) == 2 and len(op.inputs[1].type.shape) == 1


def _first_is_bias(ops: Sequence[Op]) -> bool:
    return _bias(ops[0])


def _then_bias(ops: Sequence[Op]) -> bool:
    return _bias(ops[1])


def _residual(ops: Sequence[Op]) -> bool:
    """The last part adds two tensors of one shape (a residual)."""
    last = ops[-1]
    return len(last.inputs) == 2 and last.inputs[0].type.shape == last.inputs[1].type.shape


#: ``F.linear``: the bias added in the GEMM (cuBLAS epilogue / addmm)
LINEAR_BIAS: Rule = ("matmul+bias", ("matmul", "add"), _then_bias)

#: the rules of each setting, in priority order: a rule claims its chains
#: before the next rule looks (bias-GeLU takes fc1's bias before F.linear)
MEGATRON: Tuple[Rule, ...] = (
    ("scale+mask+softmax", ("scale", "causal_mask", "softmax"), None),
    ("softmax_grad+mask+scale", ("softmax_grad", "causal_mask", "scale"), None),
    ("bias+gelu", ("add", "gelu"), _first_is_bias),
    ("bias+dropout+add", ("add", "dropout", "add"),
     lambda ops: _first_is_bias(ops) and _residual(ops)),
    ("dropout+add", ("dropout", "add"), _residual),
    LINEAR_BIAS,
)
RULES: Dict[str, Tuple[Rule, ...]] = {
    "megatron": MEGATRON,
    "megatron-core": (("silu+mul", ("silu", "mul"), None),) + MEGATRON,
    "pytorch-eager": (LINEAR_BIAS,),
    "none": (),
}
assert set(RULES) == set(FUSIONS)


def _place(op: Op) -> tuple:
    m = op.meta
    return (m.get("layer"), m.get("phase"), m.get("detail"), m.get("category"))


class Fuse:
    """Replace the chains the setting's rules match by fused kernels
    (module docstring), in a new function; a step with none to fuse is
    returned as it is."""

    def __init__(self, fusion: str = "none") -> None:
        check_field("fusion", fusion)
        self.fusion = fusion
        self.rules = RULES[fusion]

    def __call__(self, step: Function) -> Function:
        if not self.rules:
            return step
        ops = step.ops
        consumers: Dict[Value, List[Op]] = {}
        for op in ops:
            for v in op.inputs:
                consumers.setdefault(v, []).append(op)
        grad_names = _grad_names(step)
        claimed: Dict[int, Tuple[str, int]] = {}   # op position -> (kernel, chain start)
        for name, types, check in self.rules:
            n, first = len(types), types[0]
            for i in range(len(ops) - n + 1):
                if ops[i].op_type != first:     # :func:`_matches`' first test, unsliced
                    continue
                chain = ops[i:i + n]
                if any(i + j in claimed for j in range(n)):
                    continue
                if not _matches(chain, types, check, grad_names):
                    continue
                for j in range(n):
                    claimed[i + j] = (name, i)
        if not claimed:
            return step
        lower = SimpleNamespace(grad_of={}, step_outputs=set(step.outputs), crossing=set(),
                                consumers=consumers, microbatches=1, bundle_buffers=False)
        from .coarsen import Segment    # coarsen imports nothing of this module
        new_ops: List[Op] = []
        i = 0
        count = 0
        while i < len(ops):
            hit = claimed.get(i)
            if hit is None:
                new_ops.append(ops[i])
                i += 1
                continue
            name = hit[0]
            # the chain claimed from here (``i`` is its start): its positions
            # run on, each claimed once
            n = 1
            while claimed.get(i + n) == hit:
                n += 1
            chain = ops[i:i + n]
            seg = Segment(f"k{count}.{name.replace('+', '_')}", chain, lower)
            count += 1
            # the last part's results first: the kernel is named after what
            # it makes (l0_res1, not the dropout mask it also writes)
            last = set(chain[-1].outputs)
            order = sorted(range(len(seg.outputs)), key=lambda k: seg.outputs[k] not in last)
            seg.outputs = [seg.outputs[k] for k in order]
            seg.function.outputs = [seg.function.outputs[k] for k in order]
            new_ops.append(Op(FUSED, seg.inputs, seg.outputs,
                              dict(seg.attrs, kernel=name), (seg.function,),
                              dict(chain[-1].meta)))
            i += n
        fused = Function(step.name, list(step.inputs), new_ops, list(step.outputs),
                         dict(step.meta))
        fused.meta["fusion"] = self.fusion
        return fused


def _grad_names(step: Function) -> Set[str]:
    """Names of the values that are parameters' gradients (the step's
    ``grads`` meta: parameter name -> its gradient's)."""
    g = step.meta.get("grads")
    return {str(v) for v in g.values()} if isinstance(g, dict) else set()


def _matches(chain: Sequence[Op], types: Tuple[str, ...], check,
             grad_names: Set[str]) -> bool:
    for j, (op, t) in enumerate(zip(chain, types)):
        if op.op_type != t or op.subfunctions or "rank_attrs" in op.meta \
                or "cp_rank_attrs" in op.meta or "ep_rank_attrs" in op.meta:
            return False
        if any(o.name in grad_names for o in op.outputs):
            return False
        if j and (not chain[j - 1].outputs or chain[j - 1].outputs[0] not in op.inputs
                  or _place(op) != _place(chain[0])):
            return False
    return check is None or check(chain)
