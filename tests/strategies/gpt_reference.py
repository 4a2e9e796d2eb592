"""A tiny GPT, its single-device reference step and helpers to run any
strategy's lowered program on the same numbers (the strategy tests' fixtures,
and the comparison of the GPT builder with the generic path)."""
from __future__ import annotations

import numpy as np
import pytest

from distsim.interp import execute
from distsim.ir import verify
from distsim.models.gpt import GPTConfig
from distsim.models.gpt_family import build_gpt_step, resolve_batch, validate
from distsim.transforms.adam import AdamHyper, AdamW
from distsim.transforms.autodiff import Autodiff
from distsim.models.gpt import gpt_forward
from distsim.transforms.optimizer import SGD, SGDHyper
from distsim.transforms.spmd import LowerSPMD
from distsim.transforms.strategy import Strategy
from distsim.transforms.zero_numbers import global_updates, local_inputs

# float64 everywhere so that every strategy agrees with the reference to
# round-off; eps = 1 keeps Adam's first step proportional to the gradient
# (with a tiny eps it would be lr * sign(g), blind to scale errors).
TINY = dict(layers=4, hidden=16, heads=4, kv_heads=2, vocab=32, seq=8, dtype="f64",
            master_dtype="f64", global_batch=8, micro_batch=2, dropout=0.1, lr=0.5,
            weight_decay=0.1)
HYPER = AdamHyper(lr=0.5, eps=1.0, weight_decay=0.1)
TOLERANCE = dict(rtol=1e-9, atol=1e-11)


class Reference:
    """The single-device step of the tiny GPT (``overrides``: config
    fields) with AdamW or, ``optimizer="sgd"``, SGD (the config's momentum),
    both on float64 master weights."""

    def __init__(self, optimizer="adamw", **overrides):
        self.config = GPTConfig(**{**TINY, **overrides})
        self.optimizer = optimizer
        c = self.config
        fwd = gpt_forward(c, micro_batch=c.global_batch)
        step = Autodiff(fwd.meta["loss"], fwd.meta["params"])(fwd)
        if optimizer == "sgd":
            self.hyper = SGDHyper(lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
            self.step = verify(SGD(lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay,
                                   master_dtype="f64")(step))
        else:
            self.hyper = HYPER
            self.step = verify(AdamW(lr=HYPER.lr, eps=HYPER.eps,
                                     weight_decay=HYPER.weight_decay, master_dtype="f64")(step))
        rng = np.random.default_rng(0)
        roles = self.step.meta["roles"]
        self.params = {v.name: rng.normal(0, 0.3, v.type.shape) for v in self.step.inputs
                       if roles.get(v.name) == "param"}
        self.data = {"ids": rng.integers(0, c.vocab, (c.global_batch, c.seq)),
                     "labels": rng.integers(0, c.vocab, (c.global_batch, c.seq))}
        inputs = []
        for v in self.step.inputs:
            n = v.name
            if n in self.params:
                inputs.append(self.params[n])
            elif n.endswith(".master"):
                inputs.append(self.params[n[:-len(".master")]].copy())
            elif roles.get(n) == "optimizer":
                inputs.append(np.zeros(v.type.shape))
            else:
                inputs.append(self.data[n])
        # each float input in the executor's dtype of its own (float32 for bf16)
        inputs = [np.asarray(x, dtype=v.type.dtype.numpy_name) if v.type.dtype.is_float else x
                  for v, x in zip(self.step.inputs, inputs)]
        outs = execute(self.step, inputs)
        self.loss = float(outs[0])
        self.updated = {v.name[:-len("_new")]: o for v, o in zip(self.step.outputs, outs)
                        if v.name.endswith("_new") and "." not in v.name}

    def lower(self, **strategy):
        strategy = {"optimizer": self.optimizer, **strategy}
        s = Strategy(**strategy)
        s = s if s.dp is not None else Strategy(**{**strategy, "dp": 1})
        m = validate(self.config, s)
        c, _ = resolve_batch(self.config, s)
        step = build_gpt_step(c, s, c.micro_batch)
        return verify(LowerSPMD(s, m, self.hyper, "f64", coarsen=s.coarsen)(step))

    def run(self, program):
        params = dict(self.params)
        params["lm_head"] = self.params.get("lm_head", self.params["wte"])
        outs = execute(program, local_inputs(program, params, self.data))
        return outs, global_updates(program, outs)

    def check(self, **strategy):
        program = self.lower(**strategy)
        outs, updated = self.run(program)
        for name, expected in self.updated.items():
            np.testing.assert_allclose(updated[name], expected, **TOLERANCE,
                                       err_msg=f"{strategy}: parameter {name}")
        if "lm_head" in updated and "lm_head" not in self.updated:
            np.testing.assert_allclose(updated["lm_head"], self.updated["wte"], **TOLERANCE)
        losses = [o for v, o in zip(program.outputs, outs)
                  if program.meta["io"].get(v.name, {}).get("role") == "loss"]
        assert np.mean(losses) == pytest.approx(self.loss, rel=1e-9)
        return program
