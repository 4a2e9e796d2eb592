"""Strategies on imported models: every option of ``distsim simulate`` is
either applied (ZeRO, micro-batches, schedule, buckets, symmetry,
coarsening: checked differentially against the single-device AdamW step
with NumpyExecutor) or refused with a ConfigError naming the option and
the model. None is ignored silently."""
from math import ceil

import numpy as np
import pytest

import distsim
from distsim.cli import main
from distsim.errors import ConfigError
from distsim.importers.onnx import import_onnx, onnx_input_arrays
from distsim.interp import execute
from distsim.ir import verify
from distsim.models.onnx_family import build_onnx, training_step
from distsim.paths import models_dir
from distsim.transforms.adam import AdamHyper
from distsim.transforms.strategy import Strategy
from distsim.transforms.zero_numbers import tp_shard

GPT2 = models_dir() / "gpt2-tiny.onnx"
BATCH, SEQ = 4, 4
# eps = 1 keeps Adam's first step proportional to the gradient (with a tiny
# eps it would be lr * sign(g), blind to a wrong gradient scale)
HYPER = AdamHyper(lr=0.5, eps=1.0, weight_decay=0.1)
CONFIG = {"family": "onnx", "name": "gpt2-tiny", "path": str(GPT2), "train": True,
          "batch": BATCH, "seq": SEQ, "dtype": "f64"}


class Reference:
    """The whole batch on one device, AdamW, float64, of the model exported
    to ``path`` (gpt2-tiny unless told)."""

    def __init__(self, path=GPT2):
        self.config = dict(CONFIG, name=path.stem, path=str(path))
        forward = import_onnx(path, batch=BATCH, seq=SEQ, dtype="f64")
        self.constants = forward.meta["constants"]
        self.step = verify(training_step(forward, hyper=HYPER))
        rng = np.random.default_rng(0)
        roles = self.step.meta["roles"]
        self.params = {p: np.asarray(self.constants[p]) for p in self.step.meta["params"]}
        target = next(v for v in self.step.inputs if v.name == "target")
        self.data = {"input_ids": rng.integers(0, 128, (BATCH, SEQ)),   # vocab 128
                     "target": rng.normal(size=target.type.shape)}
        feeds = dict(self.data)
        for v in self.step.inputs:
            if v.name.endswith(".master"):
                feeds[v.name] = self.params[v.name[:-len(".master")]]
            elif roles.get(v.name) == "optimizer":
                feeds[v.name] = np.zeros(v.type.shape)
        outs = execute(self.step, onnx_input_arrays(self.step, feeds))
        by_name = {v.name: o for v, o in zip(self.step.outputs, outs)}
        self.loss = float(outs[0])
        self.updated = {p: by_name[self.step.meta["updates"][p]] for p in self.params}

    def inputs(self, program):
        """The lowered program's arguments: each rank's micro-batch slice of
        the global data, the model's constants, its tensor-parallel part of
        each parameter (flat shards under ZeRO), master weights equal to
        them and zero optimizer state (moments, momentum, gradient buffers)."""
        io, roles, M = program.meta["io"], program.meta["roles"], program.meta["microbatches"]
        shards, tp = program.meta.get("param_shards", {}), program.meta.get("tp", 1)
        out = []
        for v in program.inputs:
            info = io[v.name]
            name = info["name"]
            if roles[v.name] == "const":  # imported at the micro-batch: its own masks
                value = np.asarray(program.meta["constants"][name])
            elif info["role"] == "data":
                b = v.type.shape[0]
                start = (info["dp_rank"] * M + info["microbatch"]) * b
                value = self.data[name][start:start + b]
            else:
                spec = shards.get(name)
                value = tp_shard(np.asarray(self.params[name]), tuple(spec) if spec else None,
                                 tp, info.get("tp_rank", 0))
                if info.get("state") in ("m", "v", "mom", "grad"):
                    value = np.zeros_like(value)
                if "flat" in info:
                    lo, hi = info["flat"]
                    value = value.reshape(-1)[lo:hi]
            out.append(np.asarray(value, dtype=v.type.dtype.numpy_name))
        return out

    def check(self, strategy):
        program = verify(build_onnx(self.config, strategy, hyper=HYPER))
        outs = execute(program, self.inputs(program))
        io = program.meta["io"]
        losses = [o for v, o in zip(program.outputs, outs) if io[v.name]["role"] == "loss"]
        assert len(losses) == (strategy.dp or 1) * program.meta["microbatches"]
        assert np.mean(losses) == pytest.approx(self.loss, rel=1e-9)
        pieces = {}
        for v, o in zip(program.outputs, outs):
            info = io[v.name]
            if info["role"] == "updated" and info.get("state", "param") == "param":
                pieces.setdefault(info["name"], {})[info["dp_rank"]] = o
        assert sorted(pieces) == sorted(self.updated)
        for name, expected in self.updated.items():
            by_rank = pieces[name]
            if program.meta["strategy"]["zero"] == 3:  # each rank keeps its flat shard
                got = np.concatenate([by_rank[d] for d in sorted(by_rank)]).reshape(expected.shape)
            else:  # every rank holds the whole new parameter, all equal
                got = by_rank[0]
                for other in by_rank.values():
                    np.testing.assert_array_equal(other, got)
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, err_msg=name)
        return program


@pytest.fixture(scope="module")
def reference():
    return Reference()


STRATEGIES = {
    "one device": {"dp": 1},
    "dp2": {"dp": 2},
    "dp2 zero1": {"dp": 2, "zero": 1},
    "dp2 zero2": {"dp": 2, "zero": 2},
    "dp2 zero3": {"dp": 2, "zero": 3},
    "dp1 microbatches2": {"dp": 1, "microbatches": 2},
    "dp2 microbatches2 gpipe": {"dp": 2, "microbatches": 2, "schedule": "gpipe"},
    "dp2 zero3 micro-batch1": {"dp": 2, "zero": 3, "micro_batch": 1},
    "dp4 bucket0": {"dp": 4, "bucket_mb": 0.0},
    "dp2 global-batch coarsen": {"dp": 2, "global_batch": BATCH, "coarsen": True},
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_lowered_step_equals_single_device_adamw(reference, name):
    program = reference.check(Strategy(**STRATEGIES[name]))
    s = STRATEGIES[name]
    dp = s["dp"]
    m = s.get("microbatches") or (BATCH // (dp * s["micro_batch"]) if "micro_batch" in s else 1)
    assert program.meta["microbatches"] == m
    ids = [v for v in program.inputs if program.meta["io"][v.name].get("name") == "input_ids"]
    assert len(ids) == dp * m and all(v.type.shape == (BATCH // (dp * m), SEQ) for v in ids)


def _rank0_state_bytes(program):
    roles = program.meta["roles"]
    return sum(v.type.size_bytes for v in program.inputs
               if v.type.device == 0 and roles[v.name] in ("master", "optimizer"))


def test_zero_shards_the_optimizer_state_over_dp():
    """Master weights, m and v in f32: 12 bytes per parameter on every rank
    under ZeRO 0, rank 0's array_split shard (ceil(n / 8) of each
    parameter of n elements) under ZeRO 1-3."""
    forward = import_onnx(GPT2, batch=1, seq=SEQ)
    sizes = [forward.value_by_name(p).type.numel for p in forward.meta["params"]]
    assert sum(sizes) == 31_616
    config = dict(CONFIG, dtype=None, batch=8)
    programs = {z: build_onnx(config, Strategy(dp=8, zero=z)) for z in (0, 1, 2, 3)}
    assert _rank0_state_bytes(programs[0]) == 12 * 31_616
    for z in (1, 2, 3):
        assert _rank0_state_bytes(programs[z]) == 12 * sum(ceil(n / 8) for n in sizes)
    kinds = {z: {op.op_type for op in p.ops} for z, p in programs.items()}
    assert "comm.allreduce" in kinds[0] and "comm.reducescatter" not in kinds[0]
    assert "comm.allgather" in kinds[1] and "comm.reducescatter" not in kinds[1]
    assert "comm.reducescatter" in kinds[2] and "comm.reducescatter" in kinds[3]
    # ZeRO 3 keeps only the shard of each parameter as an input
    params3 = [v for v in programs[3].inputs if programs[3].meta["roles"][v.name] == "param"
               and v.type.device == 0]
    assert sum(v.type.numel for v in params3) == sum(ceil(n / 8) for n in sizes)


def test_strategy_options_change_the_simulation():
    """The audit's case: --zero and --microbatches used to give identical
    step time and memory."""
    def run(**kw):
        r = distsim.simulate(model=str(GPT2), topology="dgx-a100", dp=8, train=True, batch=16,
                             seq=16, **kw)
        s = r.summary()
        return r.step_time_s, max(d["peak_memory_bytes"] for d in s["devices"]), s["config"]

    base = run()
    zero3 = run(zero=3)
    micro = run(microbatches=2)
    assert zero3[2]["zero"] == 3 and micro[2]["microbatches"] == 2
    assert zero3[1] < base[1]  # parameters, gradients and optimizer state sharded
    assert zero3[0] != base[0] and micro[0] != base[0]


@pytest.mark.parametrize("options,flag", [
    ({"recompute": "full"}, "--recompute full"),
    ({"recompute": "selective"}, "--recompute selective"),
    ({"tp": 2, "dp": 4}, "--tp 2"),
    ({"pp": 2, "dp": 4}, "--pp 2"),
    ({"plan": "megatron"}, "--plan megatron"),
])
def test_model_parallel_options_need_train(options, flag):
    """They apply to the training step (tests/plans/test_onnx_parallel.py);
    a forward-only import refuses them, naming the option and the model."""
    with pytest.raises(ConfigError) as e:
        distsim.simulate(model=str(GPT2), topology="dgx-a100", batch=8, seq=8, **options)
    assert flag in str(e.value) and "gpt2-tiny" in str(e.value) and "--train" in str(e.value)


@pytest.mark.parametrize("options,flag", [({"zero": 1}, "--zero 1"),
                                          ({"bucket_mb": 1.0}, "--bucket-mb 1.0")])
def test_training_options_need_train(options, flag):
    with pytest.raises(ConfigError) as e:
        distsim.simulate(model=str(GPT2), topology="dgx-a100", batch=8, seq=8, **options)
    assert flag in str(e.value) and "gpt2-tiny" in str(e.value) and "--train" in str(e.value)


def test_forward_only_microbatches_run_one_after_the_other():
    r = distsim.simulate(model=str(GPT2), topology="dgx-a100", batch=16, seq=8, microbatches=2)
    ids = [v for v in r.program.inputs if r.program.meta["io"][v.name].get("name") == "input_ids"]
    assert len(ids) == 16 and all(v.type.shape == (1, 8) for v in ids)


@pytest.mark.parametrize("options,message", [
    ({"batch": 6, "seq": 8}, "--batch 6 is not divisible by --dp 8"),
    ({"batch": 8, "seq": 8, "microbatches": 2}, "batch 8 is not divisible by dp x microbatches"),
    ({"batch": 16, "seq": 8, "microbatches": 2, "micro_batch": 2},
     "batch 16 differs from dp x microbatches x micro-batch = 8 x 2 x 2 = 32"),
    ({"batch": 16, "global_batch": 8, "seq": 8}, "--batch 16 and --global-batch 8 differ"),
    ({"seq": 8}, "batch dimension is symbolic"),
])
def test_batches_that_do_not_split(options, message):
    with pytest.raises(ConfigError, match=message):
        distsim.simulate(model=str(GPT2), topology="dgx-a100", train=True, **options)


def test_input_shape_batch_is_the_global_batch():
    """--input-shape gives the global shape, as --batch does: split over dp."""
    r = distsim.simulate(model=str(GPT2), topology="workstation-4gpu-pcie", dp=4, train=True,
                         input_shapes={"input_ids": (8, 16)})
    ids = [v for v in r.program.inputs if r.program.meta["io"][v.name].get("name") == "input_ids"]
    assert [v.type.shape for v in ids] == [(2, 16)] * 4


def test_dp_must_use_every_device_as_for_the_built_in_transformers(capsys):
    with pytest.raises(ConfigError, match="does not match the 8 devices"):
        distsim.simulate(model=str(GPT2), topology="dgx-a100", dp=2, train=True, batch=8, seq=8)
    code = main(["simulate", "--model", str(GPT2), "--train", "--dp", "2", "--batch", "8",
                 "--seq", "8", "--out", "/tmp/distsim-never-written"])
    assert code == 2
    assert "dp x tp x pp = 2 x 1 x 1 = 2 does not match the 8 devices" in capsys.readouterr().err


def test_train_help_and_behaviour_agree(capsys):
    """--train appends the update of --optimizer (AdamW by default, SGD on
    request) on one device and on many; it was documented as SGD only."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    start = help_text.index("--train append")
    train_help = help_text[start:help_text.index("--input-shape", start)]
    assert "--optimizer, AdamW by default" in train_help
    for topology, dp in (("workstation-4gpu-pcie", 4), ("dgx-a100", 8)):
        r = distsim.simulate(model=str(GPT2), topology=topology, dp=dp, train=True, batch=8,
                             seq=8)
        assert r.program.meta["optimizer"] == "adamw"
        assert "adamw" in {op.op_type for op in r.program.ops}
    sgd = distsim.simulate(model=str(GPT2), topology="dgx-a100", dp=8, train=True, batch=8,
                           seq=8, optimizer="sgd")
    assert sgd.program.meta["optimizer"] == "sgd"
    assert "adamw" not in {op.op_type for op in sgd.program.ops}
    one = build_onnx(dict(CONFIG, dtype=None), Strategy(dp=1))
    assert one.meta["optimizer"] == "adamw" and one.devices() == [0]


# the other two exports (models/export_hf.py): Llama (RMSNorm, SwiGLU, rotary
# frequencies frozen as a constant by default) and BERT (encoder, GELU,
# token types), under the strategies whose shards split their parameters
# unevenly or not at all
OTHER_EXPORTS = ["llama-tiny", "bert-tiny"]
OTHER_STRATEGIES = {
    "dp2 zero3": {"dp": 2, "zero": 3},
    "dp2 zero2 microbatches2": {"dp": 2, "zero": 2, "microbatches": 2},
    "dp4 bucket0 coarsen": {"dp": 4, "bucket_mb": 0.0, "coarsen": True},
}


@pytest.fixture(scope="module", params=OTHER_EXPORTS)
def other_reference(request):
    return Reference(models_dir() / f"{request.param}.onnx")


@pytest.mark.parametrize("name", sorted(OTHER_STRATEGIES))
def test_other_exports_lowered_equal_single_device_adamw(other_reference, name):
    other_reference.check(Strategy(**OTHER_STRATEGIES[name]))
