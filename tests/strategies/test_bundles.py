"""Bundles (distsim.transforms.coarsen): the results of a fused segment
that the same segments read travel as one value. They must change no step
time and no memory curve, only the number of values; a bundled program
must still compute the same numbers (see also
test_reduced_programs.test_coarsened_program_computes_the_same_numbers)."""
from collections import defaultdict

import numpy as np
import pytest

import distsim
from distsim.api import build_program
from distsim.interp import execute, random_inputs
from distsim.transforms.coarsen import Coarsening

CASES = [
    dict(dp=2, tp=2, pp=2),
    dict(dp=2, tp=2, pp=2, zero=1, microbatches=4),
    dict(dp=2, tp=2, pp=2, zero=3, schedule="interleaved", microbatches=4, recompute="full"),
    dict(dp=2, tp=4, sp=True, recompute="selective", microbatches=3, global_batch=12),
    dict(dp=4, tp=2, zero=2, bucket_mb=1.0, microbatches=2, global_batch=8),
    dict(dp=1, tp=2, pp=4, schedule="gpipe", microbatches=6, global_batch=6),
]


def _values(program):
    return len(program.inputs) + sum(len(op.outputs) for op in program.ops)


def _curve(trace):
    """Each device's live bytes after every instant at which they change
    (samples at one instant collapse to the last)."""
    last = defaultdict(dict)
    for s in trace.memory:
        last[s.rank][s.time_s] = s.live_bytes
    return {rank: [(t, b) for t, b in sorted(by_time.items())]
            for rank, by_time in last.items()}


def _simulate(monkeypatch, bundle, model="tiny", **options):
    monkeypatch.setattr(Coarsening, "bundle_results", bundle)
    return distsim.simulate(model=model, topology="dgx-a100", coarsen=True, **options)


@pytest.mark.parametrize("strategy", CASES)
def test_bundles_change_no_time_and_no_memory_curve(monkeypatch, strategy):
    plain = _simulate(monkeypatch, False, **strategy)
    bundled = _simulate(monkeypatch, True, **strategy)
    packs = sum(op.op_type == "fused" and any(o.op_type == "pack" for o in op.subfunctions[0].ops)
                for op in bundled.program.ops)
    assert packs > 0
    assert _values(bundled.program) < _values(plain.program)
    assert len(bundled.program.ops) == len(plain.program.ops)
    assert bundled.step_time_s == plain.step_time_s
    assert bundled.trace.peak_memory() == plain.trace.peak_memory()
    assert _curve(bundled.trace) == _curve(plain.trace)
    assert bundled.summary()["total_flops"] == plain.summary()["total_flops"]


def test_bundles_with_symmetry_change_nothing_but_the_values(monkeypatch):
    strategy = dict(dp=2, tp=2, pp=2, microbatches=8, global_batch=16, symmetry=True)
    plain = _simulate(monkeypatch, False, **strategy)
    bundled = _simulate(monkeypatch, True, **strategy)
    assert _values(bundled.program) < _values(plain.program)
    assert bundled.step_time_s == plain.step_time_s
    assert bundled.trace.peak_memory() == plain.trace.peak_memory()


def test_bundled_program_computes_the_same_numbers_as_the_unbundled(monkeypatch):
    """Same inputs, same outputs to the bit: pack and unpack pass the
    tensors through."""
    programs = []
    for bundle in (False, True):
        monkeypatch.setattr(Coarsening, "bundle_results", bundle)
        program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, dtype="f32",
                                      coarsen=True, microbatches=4)
        programs.append(program)
    plain, bundled = programs
    assert _values(bundled) < _values(plain)
    inputs = [np.abs(x) if x.dtype.kind == "f" else x for x in random_inputs(plain, seed=3)]
    for x, y in zip(execute(plain, inputs), execute(bundled, inputs)):
        np.testing.assert_array_equal(x, y)


def test_a_bundle_holds_the_summed_bytes_of_its_parts():
    program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, coarsen=True,
                                  microbatches=4)
    seen = 0
    for op in program.ops:
        if op.op_type != "fused":
            continue
        for inner in op.subfunctions[0].ops:
            if inner.op_type == "pack":
                (bundle,) = inner.outputs
                assert bundle.type.shape == (sum(v.type.size_bytes for v in inner.inputs),)
                assert bundle.type.size_bytes == sum(v.type.size_bytes for v in inner.inputs)
                seen += 1
    assert seen > 0


@pytest.mark.parametrize("strategy", CASES[:3])
def test_every_result_of_a_fused_op_is_read(strategy):
    """A segment that adds its gradients into their buffers outputs the
    buffers' new values, not also the bare gradients nobody reads (a
    quarter of a GPT-3 program's fused results were such)."""
    program, _, _ = build_program("tiny", "dgx-a100", coarsen=True, **strategy)
    read = {id(v) for op in program.ops for v in op.inputs} | {id(v) for v in program.outputs}
    unread = [v.name for op in program.ops if op.op_type == "fused" for v in op.outputs
              if id(v) not in read]
    assert unread == []


@pytest.mark.parametrize("model", ["gpt2-tiny.onnx", "llama-tiny.onnx"])
def test_bundles_of_an_imported_model_change_nothing_but_the_values(monkeypatch, model):
    from distsim.paths import models_dir
    plain, bundled = (_simulate(monkeypatch, bundle, model=str(models_dir() / model), dp=8,
                                train=True, batch=32, seq=16, microbatches=4)
                      for bundle in (False, True))
    assert _values(bundled.program) < _values(plain.program)
    assert bundled.step_time_s == plain.step_time_s
    assert _curve(bundled.trace) == _curve(plain.trace)
