"""Which template op updates which parameter: the estimator's profile reads
each parameter's optimizer ops on rank 0 by name (``{p}_gflat_r0...``
flattens its gradient, ``{p}_new_r0...`` reshapes the new parameter,
``{p}_r0...`` update it). :func:`optimizer_role` finds the owner from the
name's underscores instead of trying every parameter; it must agree with
trying every parameter in order, the first whose name and a role's suffix
start the op's name."""
from __future__ import annotations

import random

from distsim.estimate import point as est
from distsim.estimate.profile_memory import optimizer_ops, optimizer_role


def _by_trying_each(op_name, names):
    for name in names:
        for suffix, role in (("_gflat_r0", "flat"), ("_new_r0", "new"), ("_r0", "update")):
            if op_name.startswith(name + suffix):
                return name, role
    return None


def test_the_owner_is_the_first_parameter_trying_each_would_find():
    rng = random.Random(7)
    parts = ["l0", "w", "b", "attn", "_", "new", "r0", "gflat", "q", "ln"]   # names not empty
    for _ in range(20000):
        names = list(dict.fromkeys("_".join(rng.choice(parts) for _ in range(rng.randint(1, 3)))
                                   for _ in range(6)))
        op = rng.choice(names) + rng.choice(["_gflat_r0", "_new_r0", "_r0", "_r0_m", "_r1",
                                             "_new_r0.1", "", "_gflat"]) \
            + rng.choice(["", "_x", ".0"])
        if rng.random() < 0.3:
            op = rng.choice(parts) + "_" + op
        order = {n: i for i, n in enumerate(names)}
        assert optimizer_role(op, order) == _by_trying_each(op, names), (op, names)


def test_every_parameter_of_the_template_has_its_update_ops():
    case = est.resolve({"model": "gpt2", "topology": "dgx-a100", "layers": 2, "dp": 4,
                        "tp": 2, "zero": 1, "micro_batch": 1, "global_batch": 8})
    prof = est._profile_for(case)
    for ps in prof.params.values():
        for p in ps:
            assert p.opt_update, p.name          # the update ops (ZeRO 1: and the flat copy)
            assert p.opt_pre > 0.0 and p.opt_post > 0.0, p.name
    assert optimizer_ops({}, []) == []
