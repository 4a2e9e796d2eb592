"""Every gradient rule against central finite differences (float64).

``FD_CASES`` holds one small function per op type of the gradient-rule
table (:data:`distsim.transforms.grad_rules.GRAD_RULES`); each case runs
Autodiff, records which rules it applied, and compares the gradients with
finite differences. ``test_every_gradient_rule_has_a_finite_difference_case``
fails when a rule is added without a case here.

The SPMD collectives (``spmd.*``) have gradient rules that only mean
something over a group of ranks: their cases run the one-rank program on
``SIZE`` ranks in lock step (:func:`run_spmd`, the collectives done with
numpy) and compare each rank's gradient with finite differences of the
global function, the replicated loss as a function of every rank's inputs.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Set

import numpy as np
import pytest

import distsim.transforms.grad_rules_nn  # noqa: F401  (registers the rules)
import distsim.transforms.grad_rules_onnx  # noqa: F401
from distsim.interp import execute
from distsim.interp.gradcheck import finite_difference
from distsim.interp.kernels import KERNELS
from distsim.ir import DType, FunctionBuilder, TensorType, verify
from distsim.ir.core import Function
from distsim.transforms import autodiff as autodiff_module
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.grad_rules import GRAD_RULES

F64, I64, BOOL = DType.F64, DType.I64, DType.BOOL
SIZE = 3  # ranks of the SPMD cases


def t(*shape, dtype=F64):
    return TensorType(shape, dtype, 0)


def applied_rules(monkeypatch) -> Set[str]:
    """The op types whose gradient rule Autodiff looks up from now on."""
    seen: Set[str] = set()
    original = autodiff_module.lookup_grad_rule

    def spy(op):
        seen.add(op.op_type)
        return original(op)
    monkeypatch.setattr(autodiff_module, "lookup_grad_rule", spy)
    return seen


# -- single-device cases ---------------------------------------------------------
class Case:
    """``build(b, *inputs) -> value`` (a tuple: its first element) on
    inputs ``specs``; gradients w.r.t. ``wrt``. ``positive``: inputs drawn
    in [0.5, 1.5]; ``int_high``: integer inputs in [0, int_high);
    ``eps`` / ``rtol``: finite-difference step and tolerance."""

    def __init__(self, build, specs: Dict[str, TensorType], wrt: Sequence[str],
                 positive: Sequence[str] = (), int_high: int = 2, eps: float = 1e-6,
                 rtol: float = 1e-5) -> None:
        self.build, self.specs, self.wrt = build, specs, list(wrt)
        self.positive, self.int_high, self.eps, self.rtol = positive, int_high, eps, rtol

    def function(self) -> Function:
        b = FunctionBuilder("f")
        ins = [b.input(n, ty) for n, ty in self.specs.items()]
        y = self.build(b, *ins)
        if isinstance(y, tuple):
            y = y[0]
        w = b.input("loss_w", y.type)  # sum(y * w): a non-uniform gradient
        return verify(b.finish([b.op("reduce_sum", [b.op("mul", [y, w])], name="loss")]))

    def inputs(self, f: Function) -> List[np.ndarray]:
        rng = np.random.default_rng(0)
        out = []
        for v in f.inputs:
            if v.type.dtype is BOOL:
                out.append(rng.integers(0, 2, v.type.shape).astype(bool))
            elif v.type.dtype.is_float:
                a = rng.uniform(-1, 1, v.type.shape)
                out.append(np.abs(a) + 0.5 if v.name in self.positive else a)
            else:
                out.append(rng.integers(0, self.int_high, v.type.shape))
        return out

    def check(self) -> None:
        f = self.function()
        inputs = self.inputs(f)
        g = verify(Autodiff("loss", self.wrt)(f))
        results = execute(g, inputs)
        names = [v.name for v in f.inputs]
        for k, name in enumerate(self.wrt):
            got = results[1 + k]
            assert got.dtype == inputs[names.index(name)].dtype, name
            expected = finite_difference(f, inputs, names.index(name), eps=self.eps)
            np.testing.assert_allclose(got, expected, rtol=self.rtol, atol=1e-7,
                                       err_msg=f"gradient of {name}")


def unary(op, positive=False, **attrs):
    return Case(lambda b, x: b.op(op, [x], attrs or None), {"x": t(3, 4)}, ["x"],
                positive=("x",) if positive else ())


def binary(op, positive_y=False, **kw):
    return Case(lambda b, x, y: b.op(op, [x, y]), {"x": t(2, 3), "y": t(3)}, ["x", "y"],
                positive=("x", "y") if positive_y else (), **kw)


NCHW = {"x": t(1, 2, 5, 5)}

FD_CASES: Dict[str, Case] = {
    **{op: unary(op) for op in ("abs", "cos", "erf", "exp", "gelu", "identity", "neg", "relu",
                                "sigmoid", "silu", "sin", "tanh", "softmax", "log_softmax")},
    **{op: unary(op, positive=True) for op in ("log", "reciprocal", "sqrt")},
    **{op: binary(op) for op in ("add", "sub", "mul", "maximum", "minimum")},
    "div": binary("div", positive_y=True),
    "pow": binary("pow", positive_y=True),
    "scale": unary("scale", factor=-2.5),
    "where": Case(lambda b, c, x, y: b.op("where", [c, x, y]),
                  {"c": t(2, 3, dtype=BOOL), "x": t(2, 3), "y": t(3)}, ["x", "y"]),
    "broadcast_to": Case(lambda b, x: b.op("broadcast_to", [x], {"shape": [2, 3, 4]}),
                         {"x": t(3, 1)}, ["x"]),
    # f64 -> f32 -> f64 (linear in x, so a large step is exact up to f32
    # rounding): the gradient comes back in f64
    "cast": Case(lambda b, x: b.op("cast", [b.op("cast", [x], {"dtype": "f32"})],
                                   {"dtype": "f64"}), {"x": t(3, 4)}, ["x"], eps=1e-2,
                 rtol=1e-4),
    "depend": Case(lambda b, x, tok: b.op("depend", [b.op("tanh", [x]), tok]),
                   {"x": t(3, 4), "tok": t(2)}, ["x"]),
    "trilu": Case(lambda b, x: b.op("trilu", [x], {"upper": False, "k": 1}),
                  {"x": t(2, 4, 4)}, ["x"]),
    "reshape": Case(lambda b, x: b.op("reshape", [x], {"shape": [4, 3]}), {"x": t(2, 6)}, ["x"]),
    "transpose": Case(lambda b, x: b.op("transpose", [x], {"perm": [2, 0, 1]}),
                      {"x": t(2, 3, 4)}, ["x"]),
    "concat": Case(lambda b, x, y: b.op("concat", [x, y], {"axis": 1}),
                   {"x": t(2, 3), "y": t(2, 2)}, ["x", "y"]),
    "split": Case(lambda b, x: b.op("split", [x], {"axis": 0, "sizes": [1, 3]})[1],
                  {"x": t(4, 2)}, ["x"]),
    "slice": Case(lambda b, x: b.op("slice", [x], {"axis": 1, "start": 1, "stop": 3}),
                  {"x": t(2, 4)}, ["x"]),
    "strided_slice": Case(lambda b, x: b.op("strided_slice", [x], {"starts": [0, 3],
                                                                   "ends": [2, 0],
                                                                   "axes": [0, 1],
                                                                   "steps": [1, -2]}),
                          {"x": t(3, 5)}, ["x"]),
    "pad": Case(lambda b, x: b.op("pad", [x], {"axis": 0, "before": 1, "after": 2}),
                {"x": t(2, 2)}, ["x"]),
    "gather": Case(lambda b, x, i: b.op("gather", [x, i], {"axis": 1}),
                   {"x": t(2, 5), "i": t(3, dtype=I64)}, ["x"], int_high=5),
    "reduce_sum": unary("reduce_sum", axes=[1]),
    "reduce_mean": unary("reduce_mean", axes=[0], keepdims=True),
    "reduce_max": unary("reduce_max", axes=[1]),
    "matmul": Case(lambda b, x, y: b.op("matmul", [x, y], {"trans_b": True}),
                   {"x": t(2, 3, 4), "y": t(5, 4)}, ["x", "y"]),
    "layernorm": Case(lambda b, x, g, be: b.op("layernorm", [x, g, be]),
                      {"x": t(2, 3, 4), "g": t(4), "be": t(4)}, ["x", "g", "be"]),
    "rmsnorm": Case(lambda b, x, g: b.op("rmsnorm", [x, g]), {"x": t(2, 3, 4), "g": t(4)},
                    ["x", "g"]),
    "embedding": Case(lambda b, w, ids: b.op("embedding", [w, ids], {"offset": 1}),
                      {"w": t(4, 3), "ids": t(2, 3, dtype=I64)}, ["w"], int_high=6),
    "cross_entropy": Case(lambda b, x, lab: b.op("cross_entropy", [x, lab]),
                          {"x": t(2, 3, 5), "lab": t(2, 3, dtype=I64)}, ["x"], int_high=5),
    "select_label": Case(lambda b, x, lab: b.op("select_label", [x, lab], {"offset": 1}),
                         {"x": t(2, 3, 4), "lab": t(2, 3, dtype=I64)}, ["x"], int_high=6),
    "mse_loss": Case(lambda b, y, tgt: b.op("mse_loss", [y, tgt]),
                     {"y": t(3, 2), "tgt": t(3, 2)}, ["y"]),    # the target: no gradient
    # a small fill: the loss then has no 1e4-sized terms to swamp the differences
    "causal_mask": Case(lambda b, x: b.op("causal_mask", [x], {"fill": -3.0}),
                        {"x": t(2, 3, 4)}, ["x"]),
    "dropout": Case(lambda b, x: b.op("dropout", [x], {"p": 0.2}), {"x": t(3, 4)}, ["x"]),
    # grouped-query layout: k and v broadcast over q's group dim (2), causal
    # with more keys (4) than queries (3), v's head dim (5) not q's (4)
    "fused_attention": Case(lambda b, q, k, v: b.op("fused_attention", [q, k, v],
                                                    {"scale": 0.7, "dropout": 0.1}),
                            {"q": t(1, 2, 2, 3, 4), "k": t(1, 2, 1, 4, 4),
                             "v": t(1, 2, 1, 4, 5)}, ["q", "k", "v"]),
    "conv": Case(lambda b, x, w: b.op("conv", [x, w], {"strides": [2, 1], "pads": [1, 0, 1, 1]}),
                 {"x": t(1, 2, 5, 5), "w": t(3, 2, 3, 2)}, ["x", "w"]),
    "maxpool": Case(lambda b, x: b.op("maxpool", [x], {"kernel": [2, 2], "strides": [2, 2]}),
                    NCHW, ["x"]),
    "averagepool": Case(lambda b, x: b.op("averagepool", [x], {"kernel": [3, 2],
                                                                "pads": [1, 0, 1, 1]}),
                        NCHW, ["x"]),
    "batchnorm": Case(lambda b, x, s, be, m, v: b.op("batchnorm", [x, s, be, m, v]),
                      {"x": t(2, 3, 2, 2), "s": t(3), "be": t(3), "m": t(3), "v": t(3)},
                      ["x", "s", "be"], positive=("v",)),
    "lrn": Case(lambda b, x: b.op("lrn", [x], {"size": 3, "alpha": 0.5, "bias": 2.0}),
                {"x": t(1, 4, 2, 2)}, ["x"]),
    # 5 tokens, top 2 of 3 experts, 3 slots each: 10 choices, at least one dropped
    "moe_dispatch": Case(lambda b, x, p: b.op("moe_dispatch", [x, p],
                                              {"top_k": 2, "capacity": 3}),
                         {"x": t(5, 4), "p": t(5, 3)}, ["x"], positive=("p",)),
    "moe_combine": Case(lambda b, y, p: b.op("moe_combine", [y, p],
                                             {"top_k": 2, "capacity": 3}),
                        {"y": t(3, 3, 4), "p": t(5, 3)}, ["y", "p"], positive=("p",)),
}


# -- SPMD cases: the one-rank program on SIZE ranks ---------------------------------
def run_spmd(f: Function, per_rank_inputs: Sequence[Sequence[np.ndarray]]) -> List[list]:
    """Outputs of every rank of ``f`` run in lock step, the SPMD
    collectives done over the ranks: all-reduce (sum), copy (identity),
    all-gather and reduce-scatter (sum) along ``dim``, shift (rank ``r``
    receives rank ``r - offset``'s), all-to-all."""
    n = len(per_rank_inputs)
    envs = [dict(zip(f.inputs, ins)) for ins in per_rank_inputs]
    for op in f.ops:
        args = [[env[v] for v in op.inputs] for env in envs]
        if op.op_type.startswith("spmd."):
            assert op.attrs["size"] == n
            xs = [a[0] for a in args]
            if op.op_type == "spmd.allreduce":
                outs = [sum(xs)] * n
            elif op.op_type == "spmd.copy":
                outs = xs
            elif op.op_type == "spmd.allgather":
                outs = [np.concatenate(xs, axis=op.attrs["dim"])] * n
            elif op.op_type == "spmd.shift":      # rank r gets rank r - offset's
                outs = [xs[(r - op.attrs["offset"]) % n] for r in range(n)]
            elif op.op_type == "spmd.alltoall":   # piece j of every rank to rank j
                pieces = [np.split(x, n, axis=op.attrs["split_dim"]) for x in xs]
                outs = [np.concatenate([p[r] for p in pieces], axis=op.attrs["concat_dim"])
                        for r in range(n)]
            else:
                outs = np.split(sum(xs), n, axis=op.attrs["dim"])
            results = [[np.array(o)] for o in outs]
        else:
            results = []
            for a in args:
                r = KERNELS[op.op_type](op.attrs, *a)
                results.append(list(r) if isinstance(r, tuple) else [r])
        for env, res in zip(envs, results):
            env.update(zip(op.outputs, res))
    return [[env[v] for v in f.outputs] for env in envs]


class SpmdCase:
    """``build(b, *inputs) -> y`` per rank. ``y`` holds per-rank partial
    contributions (the loss is the all-reduce of ``sum(y)``), or, with
    ``replicated``, the same value on every rank (the loss is ``sum(y)``
    itself, as Megatron computes a replicated loss on every rank). Either
    way every rank holds the global loss. ``shared``: inputs that are one
    replicated tensor (the same on every rank; their finite difference
    moves every replica), the others differ per rank."""

    def __init__(self, op: str, build, specs: Dict[str, TensorType], wrt: Sequence[str],
                 shared: Sequence[str] = (), replicated: bool = False) -> None:
        self.op, self.build, self.specs, self.wrt, self.shared = op, build, specs, wrt, shared
        self.replicated = replicated

    def function(self) -> Function:
        b = FunctionBuilder("f")
        ins = [b.input(n, ty) for n, ty in self.specs.items()]
        if self.replicated:
            loss = b.op("reduce_sum", [self.build(b, *ins)], name="loss")
        else:
            part = b.op("reduce_sum", [self.build(b, *ins)], name="partial")
            loss = b.op("spmd.allreduce", [part], {"size": SIZE}, name="loss")
        return verify(b.finish([loss]))

    def check(self) -> None:
        f = self.function()
        rng = np.random.default_rng(1)
        names = [v.name for v in f.inputs]
        shared = {n: rng.uniform(-1, 1, self.specs[n].shape) for n in self.shared}
        per_rank = [[shared[v.name] if v.name in shared else rng.uniform(-1, 1, v.type.shape)
                     for v in f.inputs] for _ in range(SIZE)]
        g = verify(Autodiff("loss", list(self.wrt))(f))
        outs = run_spmd(g, per_rank)
        losses = [o[0] for o in outs]
        assert np.ptp(losses) < 1e-12                         # replicated

        def global_loss(replicas):
            return float(run_spmd(f, replicas)[0][0])

        eps = 1e-6
        for k, name in enumerate(self.wrt):
            i = names.index(name)
            for r in range(SIZE):
                expected = np.zeros(self.specs[name].shape)
                for idx in np.ndindex(*expected.shape):
                    moved = []
                    for sign in (1, -1):
                        reps = [[a.copy() for a in ins] for ins in per_rank]
                        targets = range(SIZE) if name in self.shared else [r]
                        for q in targets:
                            reps[q][i][idx] += sign * eps
                        moved.append(global_loss(reps))
                    expected[idx] = (moved[0] - moved[1]) / (2 * eps)
                np.testing.assert_allclose(outs[r][1 + k], expected, rtol=1e-6, atol=1e-8,
                                           err_msg=f"{self.op}: gradient of {name} on rank {r}")


SPMD_CASES: Dict[str, SpmdCase] = {
    # partial sums per rank -> replicated (Megatron's g): identity backward
    "spmd.allreduce": SpmdCase(
        "spmd.allreduce",
        lambda b, x, w: b.op("mul", [b.op("spmd.allreduce", [x], {"size": SIZE}), w]),
        {"x": t(2, 3), "w": t(2, 3)}, ["x", "w"], shared=("w",), replicated=True),
    # a replicated input into per-rank weights (Megatron's f): all-reduce backward
    "spmd.copy": SpmdCase(
        "spmd.copy", lambda b, x, w: b.op("mul", [b.op("spmd.copy", [x], {"size": SIZE}), w]),
        {"x": t(2, 3), "w": t(2, 3)}, ["x", "w"], shared=("x",)),
    # sequence shards gathered, used with per-rank weights: reduce-scatter backward
    "spmd.allgather": SpmdCase(
        "spmd.allgather",
        lambda b, x, w: b.op("mul", [b.op("spmd.allgather", [x], {"size": SIZE, "dim": 1}), w]),
        {"x": t(2, 2), "w": t(2, 2 * SIZE)}, ["x", "w"]),
    # a ring step (context parallelism's key/value blocks): the shift back
    "spmd.shift": SpmdCase(
        "spmd.shift",
        lambda b, x, w: b.op("mul", [b.op("spmd.shift", [x], {"size": SIZE, "offset": 1}), w]),
        {"x": t(2, 3), "w": t(2, 3)}, ["x", "w"]),
    # sequence exchanged for heads (Ulysses), tokens sent to their experts
    # (expert parallelism): the all-to-all with the dims swapped back
    "spmd.alltoall": SpmdCase(
        "spmd.alltoall",
        lambda b, x, w: b.op("mul", [b.op("spmd.alltoall", [x], {"size": SIZE, "split_dim": 0,
                                                               "concat_dim": 1}), w]),
        {"x": t(SIZE, 2), "w": t(1, 2 * SIZE)}, ["x", "w"]),
    # partial sums scattered in sequence shards: all-gather backward
    "spmd.reducescatter": SpmdCase(
        "spmd.reducescatter",
        lambda b, x, w: b.op("mul", [b.op("spmd.reducescatter", [x], {"size": SIZE, "dim": 0}),
                                     w]),
        {"x": t(SIZE * 2, 2), "w": t(2, 2)}, ["x", "w"]),
}


@pytest.mark.parametrize("op", sorted(FD_CASES))
def test_gradient_rule_matches_finite_differences(op, monkeypatch):
    seen = applied_rules(monkeypatch)
    FD_CASES[op].check()
    assert op in seen, f"the case for {op} never applied its rule"


# a rank of the all-gather dispatcher: experts 1 and 2 of 3 only (a partial
# combine), 6 tokens in 2 routing groups of 2 slots each: choices dropped
_LOCAL = {"top_k": 2, "capacity": 4, "groups": 2, "first_expert": 1, "local_experts": 2}
LOCAL_EXPERT_CASES = {
    "moe_dispatch": Case(lambda b, x, p: b.op("moe_dispatch", [x, p], _LOCAL),
                         {"x": t(6, 4), "p": t(6, 3)}, ["x"], positive=("p",)),
    "moe_combine": Case(lambda b, y, p: b.op("moe_combine", [y, p], _LOCAL),
                        {"y": t(2, 4, 4), "p": t(6, 3)}, ["y", "p"], positive=("p",)),
    "moe_combine-unnormalized": Case(
        lambda b, y, p: b.op("moe_combine", [y, p], dict(_LOCAL, normalize=False)),
        {"y": t(2, 4, 4), "p": t(6, 3)}, ["y", "p"], positive=("p",)),
}


@pytest.mark.parametrize("case", sorted(LOCAL_EXPERT_CASES))
def test_local_experts_gradient_rules_match_finite_differences(case):
    LOCAL_EXPERT_CASES[case].check()


@pytest.mark.parametrize("op", sorted(SPMD_CASES))
def test_spmd_gradient_rule_matches_finite_differences_over_ranks(op, monkeypatch):
    seen = applied_rules(monkeypatch)
    SPMD_CASES[op].check()
    assert op in seen


def test_every_gradient_rule_has_a_finite_difference_case():
    covered = set(FD_CASES) | set(SPMD_CASES)
    assert set(GRAD_RULES) - covered == set(), "gradient rules without a finite-difference case"
    assert covered - set(GRAD_RULES) == set()
