"""The MLP under every combination of data, tensor, sequence and pipeline
parallelism, ZeRO and micro-batches, derived from the ``megatron`` plan
by the generic path, updates its weights exactly as the one-device step
does (NumpyExecutor, float64, rtol 1e-9)."""
import itertools

import pytest

from mlp_reference import MLPReference


@pytest.fixture(scope="module")
def reference():
    return MLPReference()


GRID = list(itertools.product([1, 2], [1, 2], [1, 2], [0, 1, 2, 3], [1, 2]))


@pytest.mark.parametrize("dp, tp, pp, zero, microbatches", GRID,
                         ids=[f"dp{d}-tp{t}-pp{p}-zero{z}-m{m}" for d, t, p, z, m in GRID])
def test_every_combination_matches_the_single_device_step(reference, dp, tp, pp, zero,
                                                          microbatches):
    reference.check(dp=dp, tp=tp, pp=pp, zero=zero, microbatches=microbatches,
                    plan="megatron")


@pytest.mark.parametrize("strategy", [
    dict(tp=2, sp=True),
    dict(tp=4, sp=True, dp=2, zero=2, microbatches=2),
    dict(tp=4),
    dict(pp=4, microbatches=4, schedule="gpipe"),
    dict(pp=2, microbatches=4, schedule="interleaved"),
    dict(pp=4, microbatches=4, schedule="zb-h1"),
    dict(dp=2, tp=2, pp=2, zero=2, microbatches=4, schedule="zb-h1"),
    dict(tp=2, pp=2, recompute="full", microbatches=2),
    dict(tp=2, sp=True, recompute="full"),
    dict(dp=2, tp=2, bucket_mb=0.0001),
    dict(dp=2, tp=2, bucket_mb=0),
    dict(dp=2, tp=2, pp=2, zero=3, zero3_unit="layer", prefetch=2),
    dict(dp=2, tp=2, pp=2, microbatches=2, coarsen=True),
    dict(tp=2, pp=2, partition="balanced"),
    dict(dp=2, tp=2, global_batch=16, micro_batch=4),
    dict(dp=2, tp=2, order="dp-tp-pp"),
], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_other_options_match(reference, strategy):
    reference.check(**strategy)


@pytest.mark.parametrize("overrides, strategy", [
    (dict(layers=5), dict(tp=2, pp=2)),           # the odd last layer stays replicated
    (dict(bias=False), dict(tp=2, sp=True, dp=2)),
    (dict(layers=2, hidden=12, batch=12), dict(tp=3, sp=True)),
])
def test_other_shapes_match(overrides, strategy):
    MLPReference(**overrides).check(**strategy)


def test_the_template_is_megatrons(reference):
    """Per column/row pair: one spmd.copy entering it (the backward's
    all-reduce) and one all-reduce leaving it; the loss is computed whole
    on every rank. With sequence parallelism: a reduce-scatter leaving and
    an all-gather entering instead, and the loss's terms summed."""
    from distsim.models.mlp import mlp_forward
    from distsim.transforms.megatron_plan import megatron_plan
    from distsim.transforms.tensor_parallel import TensorParallel

    f = mlp_forward(reference.config, layer_meta=True)
    plan = megatron_plan(f)
    assert [(e.pattern, e.style) for e in plan.entries] == [
        ("w0", "colwise"), ("w1", "rowwise"), ("w2", "colwise"), ("w3", "rowwise")]
    spmd = [op.op_type for op in TensorParallel(plan, 2)(f).ops if op.op_type.startswith("spmd")]
    assert spmd == ["spmd.allreduce", "spmd.copy", "spmd.allreduce"]
    spmd = [op.op_type for op in TensorParallel(plan, 2, sp=True)(f).ops
            if op.op_type.startswith("spmd")]
    assert spmd == ["spmd.reducescatter", "spmd.copy", "spmd.allgather", "spmd.reducescatter",
                    "spmd.copy", "spmd.allreduce"]
    template = TensorParallel(plan, 2)(f)
    assert template.meta["param_shards"] == {"w0": (1, (8,)), "b0": (0, (8,)), "w1": (0, (8,)),
                                             "w2": (1, (8,)), "b2": (0, (8,)), "w3": (0, (8,))}
    assert template.value_by_name("w0").type.shape == (8, 4)


def test_a_plan_file_gives_the_megatron_program(reference, tmp_path):
    plan = tmp_path / "pairs.yaml"
    plan.write_text('parameters:\n  "w[02]": colwise\n  "w[13]": rowwise\n')
    by_file = reference.check(dp=2, tp=2, pp=2, plan=str(plan))
    built_in = reference.lower(dp=2, tp=2, pp=2)
    assert by_file.structural_key() == built_in.structural_key()


@pytest.mark.parametrize("text", [
    # every weight row-wise: the inputs are sliced, each product summed
    'parameters:\n  "w*": rowwise\n',
    # column-wise everywhere: a gather after each layer
    'parameters:\n  "w*": colwise\n',
    # replicated: tensor parallelism computes everything on every rank
    'parameters:\n  "*": replicate\n',
    # pipeline layers from cut points (h1.1: the second op of layer 1)
    'parameters:\n  "w[13]": rowwise\n  "w[02]": colwise\ncuts: [h1, h2, a2]\n',
])
def test_other_plans_match(reference, tmp_path, text):
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    reference.check(dp=2, tp=2, pp=2, microbatches=2, plan=str(plan))
