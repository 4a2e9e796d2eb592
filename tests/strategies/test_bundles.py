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
    dict(dp=2, tp=2, pp=2, schedule="zb-h1", microbatches=4, zero=2),
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


BUFFER_CASES = [
    dict(dp=2, tp=2, pp=2, zero=1, microbatches=4),
    dict(dp=4, tp=2, microbatches=5, global_batch=20, bucket_mb=0.25),
    dict(dp=2, tp=2, pp=2, microbatches=6, global_batch=12, schedule="interleaved", sp=True),
    dict(dp=2, tp=2, pp=2, microbatches=8, global_batch=16, symmetry=True),
]


def _buffers_simulated(monkeypatch, bundle, **options):
    monkeypatch.setattr(Coarsening, "bundle_buffers", bundle)
    return distsim.simulate(model="tiny", topology="dgx-a100", coarsen=True, **options)


def _accumulating_segments(program):
    return [op for op in program.ops if op.op_type == "fused"
            and any(o.op_type == "unpack" and o.outputs[0].name.endswith(".acc")
                    for o in op.subfunctions[0].ops)]


@pytest.mark.parametrize("strategy", BUFFER_CASES)
def test_bundled_gradient_buffers_change_no_time_and_no_memory_curve(monkeypatch, strategy):
    """Micro-batches 1 .. M-2 carry each segment's gradient buffers as one
    bundle (distsim.transforms.buffer_bundles), an in-place update of the
    buffers: the same step time and memory curve as one value per buffer,
    with fewer values."""
    each = _buffers_simulated(monkeypatch, False, **strategy)
    bundled = _buffers_simulated(monkeypatch, True, **strategy)
    assert _accumulating_segments(bundled.program)
    assert not _accumulating_segments(each.program)
    assert _values(bundled.program) < _values(each.program)
    assert bundled.step_time_s == each.step_time_s
    assert bundled.trace.peak_memory() == each.trace.peak_memory()
    assert _curve(bundled.trace) == _curve(each.trace)
    assert bundled.summary()["total_flops"] == each.summary()["total_flops"]


def test_bundled_gradient_buffers_compute_the_same_numbers(monkeypatch):
    """The gradients summed through the bundles over 5 micro-batches are
    those summed buffer by buffer, to the bit."""
    programs = []
    for bundle in (False, True):
        monkeypatch.setattr(Coarsening, "bundle_buffers", bundle)
        program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, dtype="f32",
                                      coarsen=True, microbatches=5, global_batch=10)
        programs.append(program)
    each, bundled = programs
    assert _accumulating_segments(bundled)
    inputs = [np.abs(x) if x.dtype.kind == "f" else x for x in random_inputs(each, seed=4)]
    for x, y in zip(execute(each, inputs), execute(bundled, inputs)):
        np.testing.assert_array_equal(x, y)


def test_each_bundled_buffer_chain_is_packed_once_and_unpacked_once():
    """Per segment and rank: one pack before the first accumulating
    micro-batch, one unpack at the last, and each bundle in between an
    in-place update of the one before (so it holds no bytes)."""
    program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, coarsen=True,
                                  microbatches=6, global_batch=12)
    updates = program.meta["updates"]
    packs = [op for op in program.ops if op.op_type == "pack"]
    unpacks = [op for op in program.ops if op.op_type == "unpack"]
    assert packs and len(packs) == len(unpacks)
    for pack in packs:
        # micro-batches 1..4 accumulate: the pack, then four bundles
        chain = [pack.outputs[0].name]
        while chain[-1] in updates and len(chain) < 10:
            chain.append(updates[chain[-1]])
        assert pack.inputs[0].name in updates and updates[pack.inputs[0].name] == chain[0]
        bundles, unpacked = chain[1:5], chain[5]
        assert all("_m" in b for b in bundles)
        assert [b.split("_m")[-1].split("_")[0] for b in bundles] == ["1", "2", "3", "4"]
        (unpack,) = [op for op in unpacks if op.outputs[0].name == unpacked]
        assert unpack.inputs[0].name == chain[4]
        assert unpack.meta["microbatch"] == 5
        # the other buffers come back as updates of the values packed
        for packed, out in zip(pack.inputs[1:], unpack.outputs[1:]):
            assert updates[packed.name] == out.name


@pytest.mark.parametrize("microbatches", [4, 8])
def test_buffers_are_bundled_only_where_that_makes_fewer_values(microbatches):
    """A bundle costs a pack, a value per accumulating micro-batch (M - 2)
    and an unpack of all G buffers; one value per buffer costs G (M - 2):
    bundled exactly where (G - 1)(M - 3) > 2."""
    program, _, _ = build_program("tiny", "dgx-a100", dp=2, tp=2, pp=2, coarsen=True,
                                  microbatches=microbatches, global_batch=2 * microbatches)
    bundled, each = [], []
    for op in program.ops:
        if op.op_type != "fused":
            continue
        fn = op.subfunctions[0]
        unpacks = [o for o in fn.ops
                   if o.op_type == "unpack" and o.outputs[0].name.endswith(".acc")]
        if unpacks:
            bundled.append(len(unpacks[0].outputs))
        elif any(v.name.endswith(".acc") for v in fn.inputs):
            each.append(sum(v.name.endswith(".acc") for v in fn.inputs))
    assert bundled and all((g - 1) * (microbatches - 3) > 2 for g in bundled)
    assert all((g - 1) * (microbatches - 3) <= 2 for g in each)
    if microbatches == 4:
        assert each     # tiny's 2- and 3-gradient segments stay one value per buffer
