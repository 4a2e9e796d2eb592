"""The mesh layout: "TP stays inside a node unless told otherwise". With
the default order (tp fastest, then dp, then pp: Megatron-LM's) every
tensor-parallel group is on one server whenever tp divides the GPUs per
server; ``order`` lays the mesh out otherwise, and the summary notes TP
groups that span servers."""
from itertools import product

import pytest

import distsim
from distsim.ir.comm import is_communication
from distsim.topology import load_topology
from distsim.transforms.strategy import ORDERS, Strategy


@pytest.mark.parametrize("topology", ["dgx-a100", "dgx-a100-x4"])
def test_default_order_keeps_every_tp_group_in_one_server(topology):
    topo = load_topology(topology)
    n = topo.num_devices
    checked = 0
    for tp, pp in product((1, 2, 4, 8), (1, 2, 4)):
        if n % (tp * pp):
            continue
        s = Strategy(tp=tp, pp=pp).resolved(n)
        groups = s.tp_groups()
        assert sorted(r for g in groups for r in g) == list(range(n))   # a partition
        for g in groups:
            assert len({topo.node_of(r) for r in g}) == 1, (tp, pp, g)
        checked += 1
    assert checked >= 9


@pytest.mark.parametrize("order", ORDERS)
def test_every_order_is_a_bijection(order):
    s = Strategy(dp=3, tp=2, pp=4, order=order)
    ranks = [s.rank(d, p, t) for d in range(3) for p in range(4) for t in range(2)]
    assert sorted(ranks) == list(range(24))
    fastest = order.split("-")[0]
    step = {"tp": s.rank(0, 0, 1), "dp": s.rank(1, 0, 0), "pp": s.rank(0, 1, 0)}
    assert step[fastest] == 1


def tp_teams(program, tp):
    """The teams of the tensor-parallel collectives of a lowered GPT step
    (those the SPMD ops of the model became: forward and backward, not the
    gradient sync)."""
    return {tuple(op.attrs["ranks"]) for op in program.ops if is_communication(op)
            and op.meta.get("role") not in ("grad_sync", "zero_gather", "pipeline")
            and len(op.attrs["ranks"]) == tp}


def test_lowered_tp_collectives_stay_in_a_server_unless_reordered():
    topo = load_topology("dgx-a100-x2")
    kw = dict(model="tiny", topology="dgx-a100-x2", dp=2, tp=4, pp=2, network_mode="analytical")
    default = distsim.simulate(**kw)
    teams = tp_teams(default.program, 4)
    assert len(teams) == 4                                # dp x pp groups
    assert all(len({topo.node_of(r) for r in team}) == 1 for team in teams)
    assert default.summary()["notes"] == []
    apart = distsim.simulate(**kw, order="dp-pp-tp")      # TP ranks 4 apart
    teams = tp_teams(apart.program, 4)
    assert all(len({topo.node_of(r) for r in team}) == 2 for team in teams)
    note, = apart.summary()["notes"]
    assert "4 of 4 TP groups span more than one server" in note and "--order dp-pp-tp" in note
    assert "note: tensor parallelism crosses servers" in apart.summary_table()
    # the same training, only placed otherwise
    assert apart.summary()["total_flops"] == default.summary()["total_flops"]


def test_tp_larger_than_a_server_is_noted():
    r = distsim.simulate(model="tiny", topology="dgx-a100-x2", tp=16, heads=16, hidden=64,
                         network_mode="analytical")
    note, = r.summary()["notes"]
    assert "tp 16 is more than the 8 GPUs per server" in note
