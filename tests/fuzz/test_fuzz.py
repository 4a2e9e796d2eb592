"""Property tests with hypothesis, bounded so that the whole file runs in
about half a minute on two cores:

- random valid programs print and parse back to the same text, and simulate
  to the end (a verified program never deadlocks);
- random byte mutations of valid text and ONNX files raise nothing but
  DistsimError subclasses (never KeyError, IndexError, RecursionError, ...);
- random topologies (through the YAML loader's dict form, with random
  device blocks: NaN, infinities, huge ints, out-of-range figures) simulate
  a matmul and an all-reduce to the end with finite numbers everywhere in
  the summary, or raise TopologyError / ConfigError naming the file;
- random data-parallel configs of the MLP simulate to the end, and the
  numpy executor gives the single-device updates (random strategies of the
  tiny GPT: ``tests/strategies/test_random_strategies.py``).
"""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from distsim.errors import ConfigError, DistsimError, TopologyError
from distsim.importers.onnx import import_onnx
from distsim.interp import execute, random_inputs
from distsim.ir import DType, FunctionBuilder, TensorType, verify, verify_module
from distsim.models import MLPConfig, mlp_training_step
from distsim.report import summarize
from distsim.sim.simulator import SimulationOptions, simulate_function
from distsim.text import parse_function, parse_module, print_function
from distsim.topology import load_topology
from distsim.topology.loader import topology_from_dict
from distsim.transforms.data_parallel import DataParallel

FAST = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ANALYTICAL = SimulationOptions(network_mode="analytical")


@pytest.fixture(scope="module")
def dgx():
    return load_topology("dgx-a100")


# -- random valid programs --------------------------------------------------

N = 4  # every tensor is [N, N]: any op below applies to any value
UNARY = ["relu", "neg", "exp", "tanh", "sigmoid", "abs", "identity"]
BINARY = ["add", "mul", "sub", "maximum", "matmul"]
COMM = ["comm.allreduce", "comm.allgather", "comm.reducescatter", "comm.alltoall",
        "comm.broadcast", "comm.reduce", "comm.sendrecv"]


@st.composite
def programs(draw):
    """A verified local-view program over devices 0..3 built op by op with
    FunctionBuilder; each step picks a registered op and operands that fit."""
    devices = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([DType.F32, DType.F16, DType.BF16]))
    b = FunctionBuilder("fuzz")
    pool = {d: [b.input(f"x{d}", TensorType((N, N), dtype, d))] for d in range(devices)}
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "scale", "transpose", "comm"]))
        d = draw(st.integers(0, devices - 1))
        pick = lambda dev: draw(st.sampled_from(pool[dev]))  # noqa: E731
        if kind == "unary":
            out = b.op(draw(st.sampled_from(UNARY)), [pick(d)])
        elif kind == "binary":
            out = b.op(draw(st.sampled_from(BINARY)), [pick(d), pick(d)])
        elif kind == "scale":
            out = b.op("scale", [pick(d)], {"factor": draw(st.floats(-1e3, 1e3, allow_nan=False))})
        elif kind == "transpose":
            out = b.op("transpose", [pick(d)], {"perm": (1, 0)})
        else:
            op = draw(st.sampled_from(COMM))
            team = draw(st.permutations(range(devices)).map(
                lambda p: tuple(p[:max(1, draw(st.integers(1, devices)))])))
            if op == "comm.sendrecv":
                if len(team) < 2:
                    continue
                team = team[:2]
            attrs = {"ranks": team}
            if op in ("comm.broadcast", "comm.reduce"):
                attrs["root"] = draw(st.sampled_from(team))
            if op in ("comm.allgather", "comm.reducescatter"):
                attrs["dim"] = draw(st.integers(0, 1))
            if op == "comm.alltoall":
                attrs.update(split_dim=draw(st.integers(0, 1)), concat_dim=draw(st.integers(0, 1)))
            senders = team[:1] if op in ("comm.broadcast", "comm.sendrecv") else team
            if op == "comm.broadcast":
                senders = (attrs["root"],)
            inputs = [pick(r) for r in senders]
            try:
                out = b.op(op, inputs, attrs)
            except DistsimError:      # e.g. a dim of 4 not divisible by 3 ranks
                continue
            outs = out if isinstance(out, tuple) else (out,)
            for v in outs:
                if v.type.shape == (N, N):
                    pool[v.type.device].append(v)
            continue
        pool[d].append(out)
    results = [vs[-1] for vs in pool.values()]
    return verify(b.finish(results))


@settings(FAST, max_examples=500)
@given(programs())
def test_random_programs_round_trip_and_simulate(program):
    text = print_function(program)
    again = verify(parse_function(text))
    assert print_function(again) == text
    trace = simulate_function(again, load_topology("dgx-a100"), options=ANALYTICAL)
    assert math.isfinite(trace.step_time_s) and trace.step_time_s >= 0
    assert len([r for r in trace.ops if r.category == "compute"]) == sum(
        1 for op in again.ops if not op.op_type.startswith("comm."))


# -- byte mutations ---------------------------------------------------------

def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, pos, payload in edits:
        if not buf:
            buf = bytearray(payload)
            continue
        pos %= len(buf)
        if kind == 0:
            buf[pos] = payload[0]
        elif kind == 1:
            del buf[pos:pos + len(payload)]
        elif kind == 2:
            buf[pos:pos] = payload
        else:                     # duplicate a slice (repeats structure)
            buf[pos:pos] = buf[pos:pos + 4 * len(payload)]
    return bytes(buf)


EDITS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20),
                           st.binary(min_size=1, max_size=8)), min_size=1, max_size=6)
PUNCT = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 20),
                           st.text("[]{}()%@:,=-0123456789\"\\e.x", min_size=1, max_size=6)
                           .map(str.encode)), min_size=1, max_size=6)


def _valid_text() -> bytes:
    step = mlp_training_step(MLPConfig(layers=2, hidden=8, batch=4, dtype="f32"))
    return print_function(DataParallel(2)(step)).encode()


TEXT = _valid_text()


def _parse_only_distsim_errors(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        verify_module(parse_module(text, source="fuzz.dir"))
    except DistsimError as e:
        assert "\n" not in str(e)


@settings(FAST, max_examples=2000)
@given(st.one_of(EDITS, PUNCT))
def test_mutated_text_raises_only_distsim_errors(edits):
    _parse_only_distsim_errors(_mutate(TEXT, edits))


def _valid_onnx() -> bytes:
    f = TensorProto.FLOAT
    w = numpy_helper.from_array(np.ones((3, 4), dtype=np.float32), "w")
    s = numpy_helper.from_array(np.array([4, 2], dtype=np.int64), "s")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="rs")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [2, 3])],
                              [helper.make_tensor_value_info("y", f, [4, 2])], [w, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


ONNX = _valid_onnx()


@settings(FAST, max_examples=1500)
@given(EDITS)
# a mutated opset number past the newest checked is warned about (tested in
# tests/importers); here only what is raised matters
@pytest.mark.filterwarnings("ignore::distsim.importers.onnx_model.OnnxOpsetWarning")
def test_mutated_onnx_raises_only_distsim_errors(tmp_path_factory, edits):
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    path.write_bytes(_mutate(ONNX, edits))
    try:
        import_onnx(str(path))
    except DistsimError as e:
        assert "\n" not in str(e)


def test_the_unmutated_files_are_valid(tmp_path):
    _parse_only_distsim_errors(TEXT)
    verify_module(parse_module(TEXT.decode()))
    (tmp_path / "m.onnx").write_bytes(ONNX)
    import_onnx(str(tmp_path / "m.onnx"))


# -- random topologies -------------------------------------------------------

DEVICE = {"name": "t", "peak_flops": {"f16": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
BANDWIDTHS = st.one_of(st.floats(0.1, 1000), st.sampled_from([0, -1, float("nan"),
                                                              float("inf"), "fast", None,
                                                              1e-300, 1e300, 10 ** 400]))
#: Bad device figures of every kind: NaN, infinities, zero, negatives, text,
#: ints too large for a float, and finite numbers far outside any range.
BAD_FIGURES = st.sampled_from([float("nan"), float("inf"), -float("inf"), 0, -1, "fast", None,
                               True, 10 ** 400, 1e-300, 1e300, 2.0])


def figure(good):
    """Mostly a valid figure (``good``), sometimes a bad one."""
    return st.one_of(good, good, good, BAD_FIGURES)


@st.composite
def device_blocks(draw):
    """A device block whose figures are valid, at the edges of their
    ranges, or bad; a field may be missing or unknown."""
    device = {
        "name": "t",
        "peak_flops": {draw(st.sampled_from(["f16", "bf16", "f32", "f99"])):
                       draw(figure(st.floats(1.0, 1e18)))},
        "memory_bandwidth_Bps": draw(figure(st.floats(1.0, 1e15))),
        "memory_bytes": draw(figure(st.one_of(st.floats(1.0, 1e18), st.integers(1, 10 ** 18)))),
    }
    for key in ("launch_overhead_s", "matmul_efficiency", "vector_efficiency",
                "memory_efficiency"):
        if draw(st.booleans()):
            good = st.floats(0.0, 1.0) if key == "launch_overhead_s" else st.floats(1e-3, 1.0)
            device[key] = draw(figure(good))
    if draw(st.integers(0, 19)) == 0:
        del device[draw(st.sampled_from(sorted(device)))]
    if draw(st.integers(0, 19)) == 0:
        device["colour"] = "red"
    return device


@st.composite
def topology_dicts(draw):
    n_dev = draw(st.integers(1, 6))
    n_sw = draw(st.integers(0, 2))
    nodes = [f"g{i}" for i in range(n_dev)] + [f"s{i}" for i in range(n_sw)]
    links = []
    for _ in range(draw(st.integers(0, 10))):
        link = {"src": draw(st.sampled_from(nodes + ["ghost"])),
                "dst": draw(st.sampled_from(nodes)),
                draw(st.sampled_from(["bandwidth_GBps", "bandwidth_Gbps"])): draw(BANDWIDTHS),
                "latency_us": draw(st.one_of(st.floats(0, 10), st.just(-1)))}
        if draw(st.booleans()):
            link["duplex"] = draw(st.sampled_from([True, False, "yes"]))
        links.append(link)
    device = draw(device_blocks()) if draw(st.booleans()) else DEVICE
    data = {"name": "fuzz", "device": device, "devices": nodes[:n_dev],
            "switches": nodes[n_dev:], "links": links}
    if draw(st.integers(0, 9)) == 0:
        data = {"name": "fuzz", "device": device, "builder": "torus",
                "params": {"dims": draw(st.lists(st.integers(-1, 3), max_size=4)),
                           "link_GBps": draw(BANDWIDTHS)}}
    return data


def _matmul_allreduce_over(n):
    """A matmul on every device (exercising the device figures), then an
    all-reduce of the products (exercising the links)."""
    b = FunctionBuilder("ar")
    xs = [b.input(f"x{r}", TensorType((32, 32), DType.F16, r)) for r in range(n)]
    ys = [b.op("matmul", [x, x]) for x in xs]
    out = b.op("comm.allreduce", ys, {"ranks": tuple(range(n))})
    return b.finish(list(out) if isinstance(out, tuple) else [out])


@settings(FAST, max_examples=600)
@given(topology_dicts(), st.sampled_from(["flow", "analytical"]))
def test_random_topologies_simulate_or_raise_topology_errors(data, mode):
    try:
        topo = topology_from_dict(data, "fuzz.yaml")
    except (ConfigError, TopologyError) as e:
        text = str(e)
        assert text.startswith("fuzz.yaml") and "\n" not in text and len(text) < 1000
        return
    try:
        trace = simulate_function(_matmul_allreduce_over(topo.num_devices), topo,
                                  options=SimulationOptions(network_mode=mode))
    except TopologyError:
        return
    assert math.isfinite(trace.step_time_s) and trace.step_time_s > 0
    summary = summarize(trace)
    json.dumps(summary, allow_nan=False)        # every number finite: no NaN, no inf
    assert all(d["compute_s"] > 0 for d in summary["devices"])


# -- random strategies on a tiny model ---------------------------------------

@settings(FAST, max_examples=60)
@given(layers=st.integers(1, 3), hidden=st.sampled_from([2, 4, 6]),
       per_rank=st.integers(1, 3), dp=st.sampled_from([1, 2, 4, 8]), bias=st.booleans())
def test_random_data_parallel_configs_simulate_and_match(layers, hidden, per_rank, dp, bias):
    step = mlp_training_step(MLPConfig(layers=layers, hidden=hidden, batch=per_rank * dp,
                                       dtype="f64", bias=bias))
    program = verify(DataParallel(dp)(step))
    trace = simulate_function(program, load_topology("dgx-a100"), options=ANALYTICAL)
    assert trace.step_time_s > 0 and len(trace.devices) == dp
    inputs = random_inputs(step, seed=layers * 100 + hidden)
    reference = execute(step, inputs)
    split = []
    for v, a in zip(step.inputs, inputs):
        split += np.split(a, dp) if v.name in step.meta["batch_inputs"] else [a] * dp
    results = execute(program, split)
    for j in range(1, len(reference)):          # the updated parameters, on every rank
        for r in range(dp):
            np.testing.assert_allclose(results[j * dp + r], reference[j], rtol=1e-9, atol=1e-12)
