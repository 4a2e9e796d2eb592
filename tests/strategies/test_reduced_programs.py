"""Reduced programs (``symmetry=True``): one representative device per
pipeline stage. They must give the same step time (within 0.1%; in
practice to rounding) and the same per-device memory as the full program,
and must refuse to be executed."""
from collections import Counter

import pytest

import distsim
from distsim.errors import ExecutionError
from distsim.interp import execute, random_inputs

CASES = [
    ("dgx-a100", dict(dp=8)),
    ("dgx-a100", dict(dp=4, tp=2)),
    ("dgx-a100", dict(dp=2, tp=2, pp=2, zero=1)),
    ("dgx-a100", dict(dp=2, tp=2, pp=2, zero=3, schedule="interleaved", microbatches=4)),
    ("dgx-a100", dict(dp=4, tp=2, zero=2, bucket_mb=1.0)),
    ("dgx-a100", dict(dp=4, pp=2, zero=3, zero3_unit="layer", microbatches=2)),
    ("dgx-a100", dict(dp=2, tp=4, sp=True, recompute="selective")),
    ("dgx-a100", dict(dp=1, tp=2, pp=4, schedule="gpipe")),
    ("dgx-a100", dict(dp=2, tp=2, pp=2, zero=2, schedule="zb-h1", microbatches=4)),
    ("dgx-a100-x8", dict(dp=8, tp=2, pp=4)),
]


#: summary figures that a reduced program must reproduce
SAME_FIGURES = ("step_time_s", "num_devices", "compute_s", "communication_s",
                "exposed_communication_s", "idle_s", "max_exposed_communication_s", "min_idle_s",
                "max_peak_memory_bytes", "max_peak_memory_rank", "oom", "total_flops",
                "tokens_per_step", "tokens_per_s", "model_flops", "mfu", "hfu",
                "bubble_fraction")


@pytest.mark.parametrize("topology,strategy", CASES)
def test_reduced_equals_full(topology, strategy):
    full = distsim.simulate(model="tiny", topology=topology, **strategy)
    reduced = distsim.simulate(model="tiny", topology=topology, symmetry=True, **strategy)
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    fs, rs = full.summary(), reduced.summary()
    # every fleet-wide figure: the reduced run weights each representative
    # by the devices it stands for (total_flops and hfu were 1/(dp x tp) of
    # the full run's before)
    for key in SAME_FIGURES:
        assert rs[key] == pytest.approx(fs[key], rel=1e-3, abs=1e-12), key
    assert rs["oom_category"] == fs["oom_category"]
    assert rs["total_flops"] > 0 and rs["hfu"] > 0
    peaks = {d["rank"]: d["peak_memory_bytes"] for d in fs["devices"]}
    for d in rs["devices"]:  # each representative's memory is its class's
        assert d["peak_memory_bytes"] == peaks[d["rank"]]
    pp = strategy.get("pp", 1)
    assert len(rs["devices"]) == pp
    assert sum(d["represents"] for d in rs["devices"]) == fs["num_devices"]
    assert len(reduced.program.ops) < len(full.program.ops)


def test_reduced_program_cannot_be_executed():
    result = distsim.simulate(model="tiny", topology="dgx-a100", dp=8, symmetry=True)
    program = result.program
    with pytest.raises(ExecutionError, match="reduced program"):
        execute(program, random_inputs(program))


COARSEN_CASES = [
    dict(dp=2, tp=2, pp=2),
    dict(dp=2, tp=2, pp=2, zero=3, schedule="interleaved", microbatches=4, recompute="full"),
    dict(dp=2, tp=4, sp=True, recompute="selective"),
    dict(dp=1, tp=2, pp=4, schedule="gpipe"),
    dict(dp=4, tp=2, zero=2, bucket_mb=1.0),
    dict(dp=4, pp=2, zero=3, zero3_unit="layer", microbatches=2),
    # gradient accumulation over micro-batches fused into the segments
    # (all but the last micro-batch, whose gradients feed the sync)
    dict(dp=2, tp=2, pp=2, zero=1, microbatches=4),
    dict(dp=4, tp=2, microbatches=4, global_batch=16, bucket_mb=0.25),
    dict(dp=2, tp=2, pp=2, microbatches=6, global_batch=12, schedule="interleaved", sp=True),
    dict(dp=1, tp=2, pp=4, microbatches=8, global_batch=8, schedule="zb-h1"),
    dict(dp=4, pp=2, microbatches=2, schedule="zb-h1", zero=3, recompute="selective"),
]


@pytest.mark.parametrize("strategy", COARSEN_CASES)
def test_coarsened_program_has_the_same_step_time(strategy):
    """Fused runs end before values leave by communication and start where
    values arrive by it, so their summed time changes nothing."""
    full = distsim.simulate(model="tiny", topology="dgx-a100", **strategy)
    fused = distsim.simulate(model="tiny", topology="dgx-a100", coarsen=True, **strategy)
    assert fused.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert len(fused.program.ops) < 0.8 * len(full.program.ops)
    assert fused.summary()["total_flops"] == pytest.approx(full.summary()["total_flops"], rel=1e-9)


@pytest.mark.parametrize("microbatches", [None, 4])
def test_coarsened_program_computes_the_same_numbers(microbatches):
    """The numpy executor runs the fused segments (with 4 micro-batches,
    the gradient accumulation fused into them): same outputs."""
    import numpy as np
    from distsim.api import build_program
    full, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, dtype="f32",
                               microbatches=microbatches)
    fused, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, dtype="f32", coarsen=True,
                                microbatches=microbatches)
    # |x|: Adam's second moments must not be negative (sqrt)
    inputs = [np.abs(x) if x.dtype.kind == "f" else x for x in random_inputs(full, seed=1)]
    a = execute(full, inputs)
    b = execute(fused, inputs)
    assert [v.name for v in full.inputs] == [v.name for v in fused.inputs]
    for x, y in zip(a, b):
        assert np.all(np.isfinite(x))
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_coarsening_fuses_the_accumulation_of_all_but_the_last_micro_batch():
    """With 8 micro-batches the gradient adds of micro-batches 1..6 live in
    the segments; only the last micro-batch's gradients stay separate ops."""
    full = distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2,
                            microbatches=8, global_batch=16)
    fused = distsim.simulate(model="tiny", topology="dgx-a100", dp=2, tp=2, pp=2,
                             microbatches=8, global_batch=16, coarsen=True)
    assert fused.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)

    def adds_per_parameter(program):
        """gradient-accumulation adds, per parameter (over its 4 ranks)"""
        found = Counter()
        for op in program.ops:
            if op.op_type == "add" and op.meta.get("category") == "gradients":
                found[op.outputs[0].name.split("_gacc")[0]] += 1
        return found
    full_adds, fused_adds = adds_per_parameter(full.program), adds_per_parameter(fused.program)
    ranks = 4  # dp 2 x tp 2 per stage
    assert set(full_adds.values()) == {7 * ranks}  # micro-batches 1..7 add into the buffer
    # the vocabulary-parallel embedding's gradient op takes per-rank
    # attributes (its vocabulary offset) and is never fused
    assert fused_adds == {p: (7 * ranks if p == "wte" else ranks) for p in full_adds}
    assert len(fused.program.ops) < 0.5 * len(full.program.ops)


def test_symmetry_and_coarsening_together():
    full = distsim.simulate(model="tiny", topology="dgx-a100-x8", dp=8, tp=2, pp=4)
    both = distsim.simulate(model="tiny", topology="dgx-a100-x8", dp=8, tp=2, pp=4,
                            symmetry=True, coarsen=True)
    assert both.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)


def test_oom_ranks_of_a_reduced_program_list_every_rank_it_stands_for():
    """A representative over its capacity stands for its whole stage: the
    reduced run lists the same OOM ranks as the full one (it listed only
    the representatives before). Capacity sits between the stages' peaks,
    so some stages run out and some do not."""
    import copy
    from dataclasses import replace
    from distsim.topology import load_topology

    strategy = dict(dp=2, tp=2, pp=2)
    probe = distsim.simulate(model="tiny", topology="dgx-a100", symmetry=True, **strategy)
    peaks = sorted({d["peak_memory_bytes"] for d in probe.summary()["devices"]})
    assert len(peaks) == 2
    topo = copy.copy(load_topology("dgx-a100"))
    topo.device_spec = replace(topo.device_spec, memory_bytes=float(sum(peaks)) / 2)
    full = distsim.simulate(model="tiny", topology=topo, **strategy).summary()
    reduced = distsim.simulate(model="tiny", topology=topo, symmetry=True, **strategy).summary()
    assert full["oom"] and len(full["oom_ranks"]) == 4        # one stage of dp 2 x tp 2
    assert reduced["oom_ranks"] == full["oom_ranks"]


#: a small mixture-of-experts model: 8 experts, 2 per token
MOE_MODEL = {"family": "gpt", "layers": 2, "hidden": 256, "heads": 4, "vocab": 1024,
             "seq": 128, "global_batch": 16, "micro_batch": 1, "experts": 8, "top_k": 2}


def _peaks(result) -> dict:
    return {d["rank"]: d["peak_memory_bytes"] for d in result.summary()["devices"]}


def test_symmetry_with_expert_parallelism_across_stages():
    """Expert parallelism under a pipeline (dp 4, ep 4, pp 2, ZeRO 1): one
    representative per stage gives the full program's step time and each
    of its devices' peak memory."""
    strategy = dict(dp=4, pp=2, ep=4, zero=1)
    full = distsim.simulate(MOE_MODEL, "dgx-a100", **strategy)
    reduced = distsim.simulate(MOE_MODEL, "dgx-a100", symmetry=True, **strategy)
    assert reduced.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    peaks = _peaks(full)
    assert len(reduced.summary()["devices"]) == 2
    for rank, peak in _peaks(reduced).items():
        assert peak == peaks[rank], rank


#: coarsened against full: every device's peak and its categories
COARSEN_MEMORY_CASES = [
    ("tiny", dict(dp=2, tp=2, pp=2)),                     # no experts: not EP-specific
    (MOE_MODEL, dict(dp=4, pp=2, ep=4, zero=1)),
    (MOE_MODEL, dict(cp=2, ep=4, tp=2, sp=True, recompute="selective")),   # ep over dp x cp
    ("tiny", dict(dp=2, tp=2, pp=2, recompute="full", microbatches=4)),
    ("tiny", dict(dp=2, tp=4, sp=True, recompute="selective")),     # spmd.copy fused through
    ("tiny", dict(dp=2, tp=2, pp=2, zero=1, microbatches=4)),      # accumulation in segments
    ("tiny", dict(dp=4, tp=2, zero=2, bucket_mb=1.0, microbatches=2, global_batch=8)),
    ("tiny", dict(dp=2, tp=2, pp=2, zero=3, schedule="interleaved", microbatches=4)),
    ("tiny", dict(dp=2, tp=2, pp=2, microbatches=6, global_batch=12, schedule="interleaved",
                  sp=True)),
    ("tiny", dict(dp=1, tp=2, pp=4, microbatches=8, global_batch=8, schedule="zb-h1")),
    ("tiny", dict(dp=2, tp=2, pp=2, zero=2, recompute="selective", microbatches=4,
                  schedule="zb-h1")),
    ("tiny", dict(cp=2, tp=2, cp_comm="ring", attention="fused", recompute="full")),
    ("tiny", dict(dp=2, tp=2, pp=2, fusion="megatron", microbatches=4)),
]


@pytest.mark.parametrize("model,strategy", COARSEN_MEMORY_CASES)
def test_coarsened_program_has_the_same_peak_memory(model, strategy):
    """Coarsening keeps each device's peak memory and what it is made of,
    as it keeps the step time: a fused op's values come and go where its
    ops' would (distsim.sim.segment_bodies). A fused segment used to
    allocate all its results at its start and free its inputs at its end,
    its temporaries taking nothing: Mixtral-8x7B's ep 8 layout on 64 H100s
    read 63.59 GB on rank 0 coarsened against 63.17 GB full."""
    full = distsim.simulate(model, "dgx-a100", **strategy)
    fused = distsim.simulate(model, "dgx-a100", coarsen=True, **strategy)
    assert fused.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert _peaks(fused) == _peaks(full)
    assert fused.trace.meta["peak_memory_by_category"] == \
        full.trace.meta["peak_memory_by_category"]


def test_coarsened_reduced_program_has_the_full_peak_memory():
    """Symmetry and coarsening together: the representatives' peaks and
    categories are the full program's."""
    strategy = dict(dp=2, tp=2, pp=2, zero=1, microbatches=4)
    full = distsim.simulate("tiny", "dgx-a100", **strategy)
    both = distsim.simulate("tiny", "dgx-a100", symmetry=True, coarsen=True, **strategy)
    peaks, cats = _peaks(full), full.trace.meta["peak_memory_by_category"]
    assert len(both.summary()["devices"]) == 2
    for rank, peak in _peaks(both).items():
        assert peak == peaks[rank], rank
        assert both.trace.meta["peak_memory_by_category"][rank] == cats[rank]
