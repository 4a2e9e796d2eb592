"""``--collective-algo NAME`` applies to every collective that has NAME;
the others use ``auto`` (a send/recv has no ring, an all-gather no tree).
A name no collective kind knows is refused before anything is built. An
op's own ``algorithm`` attribute stays strict."""
from collections import defaultdict

import pytest

import distsim.api as api
from distsim.errors import ConfigError
from distsim.ir.comm import CollectiveType as C
from distsim.sim.collective_algos import ALGORITHMS
from distsim.sim.collectives import KNOWN_ALGORITHMS, check_algorithm_name, resolve_algorithm

GPT = dict(model="gpt2", topology="dgx-a100-x2", layers=2, hidden=256, heads=4, seq=128,
           vocab=1024, global_batch=64)


def test_resolve_per_run_falls_back_to_auto_only_for_kinds_without_the_name():
    assert resolve_algorithm(C.ALL_REDUCE, "tree", per_run=True) == "tree"
    assert resolve_algorithm(C.SEND_RECV, "ring", per_run=True) == "auto"
    assert resolve_algorithm(C.ALL_GATHER, "tree", per_run=True) == "auto"
    assert resolve_algorithm(C.REDUCE_SCATTER, "hierarchical", per_run=True) == "hierarchical"
    assert resolve_algorithm(C.BROADCAST, "hierarchical", per_run=True) == "auto"
    for kind in C:
        assert resolve_algorithm(kind, "auto", per_run=False) == "auto"


def test_an_ops_own_algorithm_is_strict_and_unknown_names_always_fail():
    with pytest.raises(ConfigError, match=r"sendrecv: unknown algorithm 'ring'"):
        resolve_algorithm(C.SEND_RECV, "ring")
    with pytest.raises(ConfigError, match=r"allgather: unknown algorithm 'tree' "
                                          r"\(known: auto, ring, hierarchical\)"):
        resolve_algorithm(C.ALL_GATHER, "tree", per_run=False)
    with pytest.raises(ConfigError, match="unknown algorithm 'rign'"):
        resolve_algorithm(C.ALL_REDUCE, "rign", per_run=True)


def test_known_names_are_the_union_of_the_tables():
    assert set(KNOWN_ALGORITHMS) == {"auto", "ring", "tree", "hierarchical", "nvls", "direct"}
    assert check_algorithm_name("direct") == "direct"
    for bad in ("foo", "", None, 3, "Ring"):
        with pytest.raises(ConfigError, match="--collective-algo: unknown algorithm"):
            check_algorithm_name(bad)


def _algorithms_by_kind(result):
    used = defaultdict(set)
    for rec in result.trace.ops:
        if rec.category == "communication":
            used[C.from_op_type(rec.op_type)].add(rec.detail)
    return used


@pytest.mark.parametrize("requested, strategy", [
    ("ring", dict(tp=2, pp=2)),                 # send/recv between stages: no ring
    ("tree", dict(dp=16, zero=3)),              # all-gather / reduce-scatter: no tree
    ("tree", dict(tp=4, sp=True)),              # sequence parallel: reduce-scatter, all-gather
    ("hierarchical", dict(tp=2, pp=2)),         # send/recv: no hierarchical
])
def test_per_run_algorithm_runs_real_programs(requested, strategy):
    result = api.simulate(collective_algo=requested, **GPT, **strategy)
    used = _algorithms_by_kind(result)
    fallback = [k for k in used if requested not in ALGORITHMS[k]]
    assert fallback, f"the program should have a collective without {requested!r}: {dict(used)}"
    for kind, names in used.items():
        # every record names an algorithm the kind really has (never the request
        # blindly), and kinds that have the requested one use it, or the kind's
        # first when it does not apply to the team (hierarchical inside a node)
        assert names <= set(ALGORITHMS[kind]), (kind, names)
        if requested in ALGORITHMS[kind]:
            assert names <= {requested, next(iter(ALGORITHMS[kind]))}, (kind, names)
    assert result.step_time_s > 0
    if requested == "ring":
        assert used[C.SEND_RECV] == {"direct"}
        assert used[C.ALL_REDUCE] == {"ring"}


def test_per_run_choice_changes_only_the_kinds_that_have_it():
    # zero 3 on two nodes: all-gathers and reduce-scatters have no tree, so
    # "tree" leaves them on auto: they run the algorithms the auto run picks
    auto = api.simulate(collective_algo="auto", dp=16, zero=3, **GPT)
    tree = api.simulate(collective_algo="tree", dp=16, zero=3, **GPT)

    def algorithms(result, kinds):
        return sorted({(r.name, r.detail) for r in result.trace.ops
                       if r.category == "communication" and C.from_op_type(r.op_type) in kinds})

    sharded = {C.ALL_GATHER, C.REDUCE_SCATTER}
    assert algorithms(tree, sharded) == algorithms(auto, sharded) != []
    assert {d for _, d in algorithms(tree, {C.ALL_REDUCE})} <= {"tree"}


def test_unknown_name_is_refused_before_building(monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("built a program for a run that cannot start")

    monkeypatch.setattr(api, "build_program", no_build)
    with pytest.raises(ConfigError, match=r"--collective-algo: unknown algorithm 'rign' "
                                          r"\(known: auto, direct, hierarchical, nvls, ring, "
                                          r"tree\)"):
        api.simulate(collective_algo="rign", **GPT, tp=2, pp=2)
