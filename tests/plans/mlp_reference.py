"""The MLP's single-device step in float64 and helpers to run any strategy's
lowered program (the generic path) on the same numbers."""
from __future__ import annotations

import numpy as np

from distsim.interp import execute
from distsim.ir import verify
from distsim.models.mlp import MLPConfig, mlp_forward
from distsim.models.mlp_family import build_mlp
from distsim.transforms.autodiff import Autodiff
from distsim.transforms.optimizer import SGD
from distsim.transforms.strategy import Strategy
from distsim.transforms.zero_numbers import global_updates, local_inputs

TOLERANCE = dict(rtol=1e-9, atol=1e-12)


class MLPReference:
    """The one-device step (SGD on float64 master weights) of an MLP of
    ``overrides`` (MLPConfig fields) on the whole batch, and the updated
    weights it computes."""

    def __init__(self, **overrides):
        fields = dict(layers=4, hidden=8, batch=16, dtype="f64", lr=0.5)
        fields.update(overrides)
        self.config = MLPConfig(**fields)
        c = self.config
        fwd = mlp_forward(c, device=0)
        step = Autodiff(fwd.meta["loss"], fwd.meta["params"])(fwd)
        self.step = verify(SGD(lr=c.lr, master_dtype="f64")(step))
        rng = np.random.default_rng(0)
        self.params = {p: rng.normal(0, 0.5, fwd.value_by_name(p).type.shape)
                       for p in fwd.meta["params"]}
        self.data = {"x": rng.normal(0, 1, (c.batch, c.hidden)),
                     "target": rng.normal(0, 1, (c.batch, c.hidden))}
        inputs = []
        for v in self.step.inputs:
            if v.name.endswith(".master"):
                inputs.append(self.params[v.name[:-len(".master")]].copy())
            else:
                inputs.append(self.params.get(v.name, self.data.get(v.name)))
        outs = execute(self.step, inputs)
        self.loss = float(outs[0])
        self.updated = {v.name[:-len("_new")]: o for v, o in zip(self.step.outputs, outs)
                        if v.name.endswith("_new") and "." not in v.name}
        assert set(self.updated) == set(self.params)

    def lower(self, **strategy):
        s = Strategy(**{"optimizer": "sgd", "dp": 1, **strategy})
        return verify(build_mlp({"family": "mlp", "name": "mlp", **self.config.to_dict()}, s))

    def run(self, program):
        outs = execute(program, local_inputs(program, self.params, self.data))
        return outs, global_updates(program, outs)

    def check(self, **strategy):
        """Lower under ``strategy``, run, and compare every updated weight
        and the loss with the one-device step."""
        program = self.lower(**strategy)
        outs, updated = self.run(program)
        assert set(updated) == set(self.updated), strategy
        for name, expected in self.updated.items():
            np.testing.assert_allclose(updated[name], expected, **TOLERANCE,
                                       err_msg=f"{strategy}: parameter {name}")
        losses = [o for v, o in zip(program.outputs, outs)
                  if program.meta["io"].get(v.name, {}).get("role") == "loss"]
        np.testing.assert_allclose(np.mean(losses), self.loss, rtol=1e-9)
        return program
