"""The adversarial catalogue: bad inputs for every entry point, each with the
error class it must raise, a piece of the message, and the CLI arguments that
feed the same input to ``distsim`` (exit status 2, one stderr line).

``README.md`` in this folder shows the same table; ``test_catalogue.py`` runs
every row and checks that the README lists it.

Each :class:`Case` has
- ``python(tmp)``: the Python entry point (raises the error), or None when the
  input only exists on the command line (argparse usage errors);
- ``cli``: the ``distsim`` arguments, with ``{cases}`` (this folder), ``{tmp}``
  (a scratch folder holding generated files) and ``{out}`` (an output folder
  that must not appear), or None for Python-only inputs (programs built in
  memory: the simulator has no CLI for unverified programs);
- ``error``: the exact class (``None``: an argparse usage error, exit 2;
  ``OSError``: the system refused a write, which the CLI reports);
- ``message``: a substring of ``str(error)`` and of the CLI's stderr line;
- ``stdout``: where the CLI's stdout goes: ``None`` (captured) or
  ``"full"`` (a device that refuses every write, as ``> /dev/full``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from distsim.errors import (ConfigError, ParseError, PassPreconditionError, SimulationError,
                            TopologyError, UnsupportedOpError, VerifyError)

CASES_DIR = Path(__file__).resolve().parent / "cases"


@dataclass(frozen=True)
class Case:
    id: str
    entry: str                     # which entry point (a column of the README)
    what: str                      # the bad input, in words
    python: Optional[Callable[[Path], object]]
    cli: Optional[Sequence[str]]
    error: Optional[type]
    message: str
    stdout: Optional[str] = None


# -- Python entry points -------------------------------------------------

def _simulate(**kwargs):
    def run(tmp: Path):
        import distsim
        kwargs.setdefault("network_mode", "analytical")
        return distsim.simulate(**kwargs)
    return run


def _simulate_file(kind: str, name: str, **kwargs):
    def run(tmp: Path):
        import distsim
        path = str(CASES_DIR / name)
        opts = dict(model="mlp", topology="dgx-a100", network_mode="analytical", **kwargs)
        opts[kind] = path
        return distsim.simulate(**opts)
    return run


def _write_outputs(out: str):
    """A tiny run written into ``out`` (a folder that cannot be created)."""
    def run(tmp: Path):
        import distsim
        result = distsim.simulate(layers=1, hidden=64, batch=64, network_mode="analytical")
        return result.write_outputs(out, plots=False)
    return run


def _search_keep_zero(tmp: Path):
    from distsim.sweep import search
    return search("tiny", "dgx-a100", 8, keep=0)


def _load_topology(name: str):
    def run(tmp: Path):
        from distsim.topology import load_topology
        return load_topology(str(CASES_DIR / name))
    return run


def _load_sweep(name: str, **kwargs):
    def run(tmp: Path):
        from distsim.sweep.spec import load_spec
        return load_spec(CASES_DIR / name, **kwargs).points()
    return run


def _read_text(name: str):
    def run(tmp: Path):
        from distsim.ir import verify_module
        from distsim.text import parse_module
        path = CASES_DIR / name
        return verify_module(parse_module(path.read_text(encoding="utf-8"), source=str(path)))
    return run


def _import_onnx(kind: str):
    def run(tmp: Path):
        from distsim.importers.onnx import import_onnx
        return import_onnx(str(write_onnx(tmp, kind)))
    return run


def _collective(kind: str, nbytes: float = 1e6, ranks=None, root=None, algorithm="auto"):
    def run(tmp: Path):
        from distsim.ir.comm import CollectiveType
        from distsim.sim.collectives import run_collective
        from distsim.sim.network import Network
        from distsim.topology import load_topology
        import simpy
        topo = load_topology("dgx-a100")
        env = simpy.Environment()
        net = Network(env, topo, mode="analytical")
        kinds = {k.name.lower().replace("_", ""): k for k in CollectiveType}
        if kind not in kinds:
            raise ConfigError(f"unknown collective '{kind}'")
        env.process(run_collective(env, net, kinds[kind], tuple(ranks or topo.ranks), nbytes,
                                   root=root, algorithm=algorithm))
        env.run()
    return run


def _simulate_program(build: Callable[[], object]):
    def run(tmp: Path):
        from distsim.sim.simulator import simulate_function
        from distsim.topology import load_topology
        return simulate_function(build(), load_topology("dgx-a100"))
    return run


# -- ONNX files, generated (no binaries committed) -----------------------

F = TensorProto.FLOAT


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _relu_model(shape=(2, 3), elem=F, out_shape=None, opset=17):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="act")],
                  [_vi("x", list(shape), elem)], [_vi("y", out_shape)], opset=opset)


def _negative_initializer():
    """A [3, 4] float initializer 'w' whose dims say [3, -4]."""
    t = numpy_helper.from_array(np.zeros((3, 4), dtype=np.float32), "w")
    t.dims[1] = -4
    return t


def onnx_bytes(kind: str) -> bytes:
    """The bytes of the bad ONNX file ``kind``."""
    good = _relu_model().SerializeToString()
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "wrong_magic":
        return b"PK\x03\x04" + good           # a zip header in front
    if kind == "empty":
        return b""
    models = {
        "cyclic": lambda: _model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                                  helper.make_node("Relu", ["a"], ["b"], name="second")],
                                 [_vi("x", [2])], [_vi("b", [2])]),
        "dangling": lambda: _model([helper.make_node("Add", ["x", "nowhere"], ["y"],
                                                     name="adder")],
                                   [_vi("x", [2])], [_vi("y", [2])]),
        "contradicting_shapes": lambda: _relu_model(out_shape=[2, 4]),
        "contradicting_matmul": lambda: _model(
            [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
            [_vi("x", [2, 3]), _vi("w", [4, 5])], [_vi("y", None)]),
        "huge_dims": lambda: _relu_model(shape=(2 ** 62, 2 ** 62)),
        "negative_dims": lambda: _relu_model(shape=(-3, 3)),
        "unknown_dtype": lambda: _relu_model(elem=TensorProto.STRING),
        "dtype_99": lambda: _relu_model(elem=99),
        "unsupported_op": lambda: _model([helper.make_node("FooBar", ["x"], ["y"], name="foo")],
                                         [_vi("x", [2, 3])], [_vi("y", None)]),
        "old_opset": lambda: _relu_model(opset=1),
        "negative_initializer": lambda: _model(
            [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
            [_vi("x", [3, 4])], [_vi("y", None)], [_negative_initializer()]),
        "bad_reshape": lambda: _model(
            [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshaper")],
            [_vi("x", [2, 3])], [_vi("y", None)],
            [numpy_helper.from_array(np.array([-1, -1]), "s")]),
    }
    return models[kind]().SerializeToString()


def write_onnx(folder: Path, kind: str) -> Path:
    path = Path(folder) / f"{kind}.onnx"
    path.write_bytes(onnx_bytes(kind))
    return path


ONNX_KINDS = ("truncated", "wrong_magic", "empty", "cyclic", "dangling", "contradicting_shapes",
              "contradicting_matmul", "huge_dims", "negative_dims", "negative_initializer",
              "unknown_dtype", "dtype_99", "unsupported_op", "old_opset", "bad_reshape")

#: A node count of 5000 digits (Python's int() refuses more than 4300).
HUGE_NODES = "9" * 5000


# -- programs built in memory (the simulator's own input) ----------------

def _t(device, shape=(4,)):
    from distsim.ir import DType, TensorType
    return TensorType(shape, DType.F16, device)


def deadlock_member_never_reaches():
    """Rank 1 feeds all-reduce A from a value computed after all-reduce B,
    which rank 0 reaches only after A: neither collective can start."""
    from distsim.ir import Function, Op, Value
    a0, a1 = Value("a0", _t(0)), Value("a1", _t(1))
    o0, o1, p1 = Value("o0", _t(0)), Value("o1", _t(1)), Value("p1", _t(1))
    q0, q1 = Value("q0", _t(0)), Value("q1", _t(1))
    ops = [Op("comm.allreduce", [a0, p1], [o0, o1], {"ranks": (0, 1), "reduce_op": "sum"}),
           Op("relu", [q1], [p1]),
           Op("comm.allreduce", [a0, a1], [q0, q1], {"ranks": (0, 1), "reduce_op": "sum"})]
    return Function("member_never_reaches", [a0, a1], ops, [o0, o1])


def deadlock_sendrecv_own_output():
    """A send 0 -> 1 whose input is computed from what comes back 1 -> 0
    after it: the sender waits on its own output."""
    from distsim.ir import Function, Op, Value
    a0, b1, c0, x0 = Value("a0", _t(0)), Value("b1", _t(1)), Value("c0", _t(0)), Value("x0", _t(0))
    ops = [Op("comm.sendrecv", [a0], [b1], {"ranks": (0, 1)}),
           Op("comm.sendrecv", [b1], [c0], {"ranks": (1, 0)}),
           Op("relu", [c0], [a0])]
    return Function("sendrecv_own_output", [x0], ops, [c0])


def deadlock_circular_wait():
    """Three all-reduces over the pairs of ranks 0, 1, 2; each one's input is
    computed from the output of the one before it in the cycle A <- C <- B <- A."""
    from distsim.ir import Function, Op, Value
    x0, x1, x2 = (Value(f"x{r}", _t(r)) for r in range(3))
    f0, f1, f2 = (Value(f"f{r}", _t(r)) for r in range(3))
    a0, a1 = Value("a0", _t(0)), Value("a1", _t(1))
    b1, b2 = Value("b1", _t(1)), Value("b2", _t(2))
    c0, c2 = Value("c0", _t(0)), Value("c2", _t(2))
    sum_ = {"reduce_op": "sum"}
    ops = [Op("comm.allreduce", [f0, x1], [a0, a1], {"ranks": (0, 1), **sum_}),
           Op("comm.allreduce", [f1, x2], [b1, b2], {"ranks": (1, 2), **sum_}),
           Op("comm.allreduce", [x0, f2], [c0, c2], {"ranks": (0, 2), **sum_}),
           Op("relu", [c0], [f0]), Op("relu", [a1], [f1]), Op("relu", [b2], [f2])]
    return Function("circular_wait", [x0, x1, x2], ops, [a0, b1, c2])


def value_on_missing_device():
    from distsim.ir import FunctionBuilder
    b = FunctionBuilder("far")
    x = b.input("x", _t(12, (8, 8)))
    return b.finish([b.op("relu", [x])])


def team_rank_missing():
    from distsim.ir import Function, Op, Value
    x0, x9 = Value("x0", _t(0)), Value("x9", _t(9))
    y0, y9 = Value("y0", _t(0)), Value("y9", _t(9))
    return Function("team", [x0, x9],
                    [Op("comm.allreduce", [x0, x9], [y0, y9],
                        {"ranks": (0, 9), "reduce_op": "sum"})],
                    [y0, y9])


# -- the catalogue ---------------------------------------------------------

OUT = "{out}"
S = ["simulate", "--no-plots", "--network-mode", "analytical", "--out", OUT]


def _c(id, entry, what, python, cli, error, message, stdout=None):
    return Case(id, entry, what, python, tuple(cli) if cli is not None else None, error, message,
                stdout)


CASES: List[Case] = [
    # command-line flags
    _c("dp-zero", "CLI flags", "`simulate --dp 0`", _simulate(dp=0), S + ["--dp", "0"],
       ConfigError, "--dp: must be a positive integer, got 0"),
    _c("dp-not-dividing-batch", "CLI flags", "`simulate --dp 3` (batch 2048)", _simulate(dp=3),
       S + ["--dp", "3"], PassPreconditionError, "is not divisible by the data-parallel degree 3"),
    _c("dp-more-than-devices", "CLI flags", "`simulate --dp 16` on 8 GPUs", _simulate(dp=16),
       S + ["--dp", "16"], ConfigError, "the strategy needs 16 devices"),
    _c("tp-not-dividing-mlp", "CLI flags", "`simulate --tp 3 --dp 1` on the MLP (hidden 4096)",
       _simulate(tp=3, dp=1), S + ["--tp", "3", "--dp", "1"], ConfigError,
       "--tp 3 does not divide dim 1 of %w0 (size 4096)"),
    _c("plan-naming-nothing", "CLI flags", "`simulate --tp 2 --plan` a plan naming no parameter",
       _simulate_file("plan", "plan_no_tensor.yaml", tp=2),
       S + ["--tp", "2", "--plan", "{cases}/plan_no_tensor.yaml"], ConfigError,
       "parameters: 'wq*': names no parameter of model 'mlp'"),
    _c("negative-layers", "CLI flags", "`simulate --layers -1`", _simulate(layers=-1),
       S + ["--layers", "-1"], ConfigError, "mlp.layers: must be a positive integer, got -1"),
    _c("unknown-model", "CLI flags", "`simulate --model nope`", _simulate(model="nope"),
       S + ["--model", "nope"], ConfigError, "unknown model 'nope'"),
    _c("unknown-topology", "CLI flags", "`simulate --topology nope`", _simulate(topology="nope"),
       S + ["--topology", "nope"], ConfigError, "unknown topology 'nope'"),
    _c("zero-node-cluster", "CLI flags", "`simulate --topology dgx-a100-x0`",
       _simulate(topology="dgx-a100-x0"), S + ["--topology", "dgx-a100-x0"], ConfigError,
       "the node count must be at least 1"),
    _c("missing-model-file", "CLI flags", "`simulate --model missing.yaml`",
       _simulate(model="/nonexistent/missing.yaml"), S + ["--model", "/nonexistent/missing.yaml"],
       ConfigError, "missing.yaml: model file not found"),
    _c("unknown-collective-algo", "CLI flags", "`simulate --collective-algo foo`",
       _simulate(collective_algo="foo", layers=1, hidden=64, batch=64),
       S + ["--collective-algo", "foo", "--layers", "1", "--hidden", "64", "--batch", "64"],
       ConfigError, "unknown algorithm 'foo'"),
    _c("out-is-a-file", "CLI flags", "`simulate --out FILE` (an existing file)", None,
       ["simulate", "--no-plots", "--layers", "1", "--hidden", "64", "--batch", "64",
        "--out", "{cases}/model_not_mapping.yaml"],
       ConfigError, "exists and is not a directory"),
    _c("out-cannot-create", "CLI flags", "`simulate --out FILE/out` (a folder under a file)",
       _write_outputs(str(CASES_DIR / "model_not_mapping.yaml" / "out")),
       ["simulate", "--no-plots", "--layers", "1", "--hidden", "64", "--batch", "64",
        "--out", "{cases}/model_not_mapping.yaml/out"],
       ConfigError, "model_not_mapping.yaml/out: cannot create the output folder"),
    _c("max-wall-s-nan", "CLI flags", "`simulate --max-wall-s nan`",
       _simulate(max_wall_s=float("nan")),
       S + ["--max-wall-s", "nan"], ConfigError,
       "--max-wall-s: must be a finite number of seconds >= 0 (0: no limit), got nan"),
    _c("max-wall-s-negative", "CLI flags", "`simulate --max-wall-s -1`", _simulate(max_wall_s=-1.0),
       S + ["--max-wall-s", "-1"], ConfigError,
       "--max-wall-s: must be a finite number of seconds >= 0 (0: no limit), got -1.0"),
    _c("bucket-mb-nan", "CLI flags", "`simulate --bucket-mb nan`",
       _simulate(bucket_mb=float("nan")),
       S + ["--bucket-mb", "nan"], ConfigError,
       "--bucket-mb: must be a finite non-negative number, got nan"),
    _c("bucket-mb-inf", "CLI flags", "`simulate --bucket-mb inf`",
       _simulate(bucket_mb=float("inf")),
       S + ["--bucket-mb", "inf"], ConfigError,
       "--bucket-mb: must be a finite non-negative number, got inf"),
    _c("dp-not-an-int", "CLI flags", "`simulate --dp abc`", None, S + ["--dp", "abc"], None,
       "argument --dp: invalid int value: 'abc'"),
    _c("unknown-flag", "CLI flags", "`simulate --bogus`", None, S + ["--bogus"], None,
       "unrecognized arguments: --bogus"),
    _c("unknown-collective", "CLI flags", "`collective allfoo`", _collective("allfoo"),
       ["collective", "allfoo"], ConfigError, "unknown collective 'allfoo'"),
    _c("collective-rank-off-topology", "CLI flags", "`collective allreduce --devices 0-99`",
       _collective("allreduce", ranks=range(100)), ["collective", "allreduce", "--devices", "0-99"],
       TopologyError, "team rank 8 is not a device of topology 'dgx-a100'"),
    _c("collective-root-off-team", "CLI flags", "`collective broadcast --root 9 --devices 0-3`",
       _collective("broadcast", ranks=range(4), root=9),
       ["collective", "broadcast", "--root", "9", "--devices", "0-3"], ConfigError,
       "root 9 is not in the team"),
    _c("collective-negative-bytes", "CLI flags", "`collective allreduce --bytes -5`", None,
       ["collective", "allreduce", "--bytes", "-5"], ConfigError, "bad size '-5'"),
    _c("import-negative-shape", "CLI flags", "`import --input-shape x=-2x3`", None,
       ["import", "{tmp}/negative_dims.onnx", "--input-shape", "x=-2x3"], ConfigError,
       "bad shape '-2x3' (dims must be positive)"),
    _c("million-node-cluster", "CLI flags", "`simulate --topology dgx-a100-x1000000` (8M GPUs)",
       _simulate(topology="dgx-a100-x1000000"), S + ["--topology", "dgx-a100-x1000000"],
       ConfigError, "8,000,000 devices (nodes 1000000 x gpus_per_node 8) is more than the "
                    "65,536 devices distsim simulates"),
    _c("5000-digit-cluster", "CLI flags", "`simulate --topology dgx-a100-x999...9` (5000 digits)",
       _simulate(topology=f"dgx-a100-x{HUGE_NODES}"),
       S + ["--topology", f"dgx-a100-x{HUGE_NODES}"], ConfigError,
       "(5000 characters) nodes is more than the 65,536 devices distsim simulates"),
    _c("ten-million-layers", "CLI flags", "`simulate --layers 10000000` (~640M ops)",
       _simulate(layers=10_000_000), S + ["--layers", "10000000"], ConfigError,
       "about 640,000,000 ops to build (10,000,000 layers x 1 micro-batches x 8 devices per "
       "stage), more than --max-ops 50,000,000"),
    _c("ten-million-microbatches", "CLI flags",
       "`simulate --model tiny --dp 8 --microbatches 10000000`",
       _simulate(model="tiny", dp=8, microbatches=10_000_000),
       S + ["--model", "tiny", "--dp", "8", "--microbatches", "10000000"], ConfigError,
       "10,000,000 micro-batches x 8 devices per stage), more than --max-ops"),
    _c("max-ops-negative", "CLI flags", "`simulate --max-ops -1`", _simulate(max_ops=-1),
       S + ["--max-ops", "-1"], ConfigError, "--max-ops: must be an integer >= 0 (0: no limit)"),
    _c("max-trace-records-negative", "CLI flags", "`simulate --max-trace-records -5`",
       _simulate(max_trace_records=-5), S + ["--max-trace-records", "-5"], ConfigError,
       "--max-trace-records: must be an integer >= 0 (0: no limit), got -5"),
    _c("max-points-negative", "CLI flags", "`sweep SPEC --max-points -1`",
       _load_sweep("sweep_four_points.yaml", max_points=-1),
       ["sweep", "{cases}/sweep_four_points.yaml", "--max-points", "-1", "--workers", "1",
        "--quiet", "--out", OUT], ConfigError, "--max-points: must be an integer >= 0"),
    _c("max-points-exceeded", "CLI flags", "`sweep SPEC --max-points 3` on a 4-point grid",
       _load_sweep("sweep_four_points.yaml", max_points=3),
       ["sweep", "{cases}/sweep_four_points.yaml", "--max-points", "3", "--workers", "1",
        "--quiet", "--out", OUT], ConfigError,
       "grid: expands to 4 points (4), more than max_points 3"),

    # topology YAML
    *[_c(f"topology-{name}", "topology YAML", what, _load_topology(f"topo_{file}.yaml"),
         S + ["--topology", f"{{cases}}/topo_{file}.yaml"], error, message)
      for name, file, what, error, message in [
          ("not-a-mapping", "not_mapping", "a list instead of a mapping", ConfigError,
           "topo_not_mapping.yaml: a topology file must be a mapping"),
          ("tab", "tab", "a tab character (malformed YAML)", ConfigError,
           "found character '\\t' that cannot start any token"),
          ("binary", "binary", "binary junk", ConfigError, "topo_binary.yaml"),
          ("no-device", "no_device", "no `device:` block", ConfigError,
           "device: missing required field"),
          ("unknown-field", "unknown_field", "an unknown top-level field `colour`", ConfigError,
           "colour: unknown field"),
          ("negative-memory", "negative_memory", "`memory_bytes: -1`", ConfigError,
           "device.memory_bytes: must be positive, got -1"),
          ("unknown-builder", "unknown_builder", "`builder: hypercube`", ConfigError,
           "builder: unknown builder 'hypercube'"),
          ("builder-list", "builder_list", "`builder: [dgx]` (a list)", ConfigError,
           "builder: unknown builder ['dgx']"),
          ("negative-param", "negative_param", "`params: {gpus_per_node: -2}`", ConfigError,
           "params.gpus_per_node: must be a positive integer, got -2"),
          ("zero-bandwidth", "zero_bandwidth", "a link of 0 GB/s", ConfigError,
           "links[0].bandwidth_GBps: must be positive, got 0"),
          ("nan-bandwidth", "nan_bandwidth", "a link of NaN GB/s", ConfigError,
           "links[0].bandwidth_GBps: must be a finite number, got nan"),
          ("tiny-link", "tiny_link", "a link of 1.0e-300 GB/s (its routing cost overflows)",
           TopologyError, "link g0 -> g1: bandwidth_Bps 1e-291 is below the minimum of 10 B/s"),
          ("tiny-builder-link", "tiny_builder_link", "`builder: star` with `link_GBps: 1.0e-300`",
           TopologyError, "link switch0 -> gpu0: bandwidth_Bps 1e-291 is below the minimum"),
          ("nan-peak", "nan_peak", "`peak_flops: {f16: .nan}`", ConfigError,
           "device.peak_flops.f16: must be a finite number, got nan"),
          ("inf-peak", "inf_peak", "`peak_flops: {f16: .inf}`", ConfigError,
           "device.peak_flops.f16: must be a finite number, got inf"),
          ("nan-memory-bandwidth", "nan_memory_bandwidth", "`memory_bandwidth_Bps: .nan`",
           ConfigError, "device.memory_bandwidth_Bps: must be a finite number, got nan"),
          ("inf-memory", "inf_memory", "`memory_bytes: .inf`", ConfigError,
           "device.memory_bytes: must be a finite number, got inf"),
          ("inf-launch-overhead", "inf_launch_overhead", "`launch_overhead_s: .inf`", ConfigError,
           "device.launch_overhead_s: must be a finite number, got inf"),
          ("unknown-node", "unknown_node", "a link to an undeclared node", TopologyError,
           "links[0].dst: unknown node 'g9'"),
          ("disconnected", "disconnected", "a device no link reaches", TopologyError,
           "devices g0 and g2 cannot reach each other"),
          ("huge-count", "huge_count", "`devices: {count: 100000000}`", ConfigError,
           "devices.count: 100,000,000 devices is more than the 65,536 devices distsim "
           "simulates"),
          ("huge-range", "huge_range", "`devices: gpu{0..99999999}`", ConfigError,
           "devices: gpu{0..99999999} names 100,000,000 nodes, more than the 262,144"),
          ("huge-torus", "huge_torus", "`builder: torus` with `dims: [1000, 1000]`", ConfigError,
           "params.dims: 1,000,000 devices (1000x1000) is more than the 65,536 devices"),
          ("duplicate-device", "duplicate_device", "`devices: [g0, g1, g0]`", ConfigError,
           "devices: name 'g0' is used twice"),
          ("duplicate-node", "duplicate_node", "a switch named like a device", ConfigError,
           "switches: name 'g1' is used twice"),
          ("count-same-name", "count_same_name", "`devices: {count: 4, name: gpu}` (no `{i}`)",
           ConfigError, "devices.name: 'gpu' has no {i}, so all 4 devices would have the same "
                        "name"),
          ("conflicting-link", "conflicting_link", "link g0 -> g1 declared at 1 and 2 GB/s",
           ConfigError, "links[1]: link g0 -> g1 is declared twice with different bandwidth "
                        "or latency (also by links[0])"),
          ("self-link", "self_link", "a link from g0 to g0", ConfigError,
           "links[1]: a link from 'g0' to itself"),
      ]],

    # model YAML
    *[_c(f"model-{name}", "model YAML", what, _simulate_file("model", f"model_{file}.yaml", **kw),
         S + ["--model", f"{{cases}}/model_{file}.yaml"] + cli_extra, error, message)
      for name, file, what, kw, cli_extra, error, message in [
          ("not-a-mapping", "not_mapping", "a list instead of a mapping", {}, [], ConfigError,
           "model_not_mapping.yaml: a model file must be a mapping of fields"),
          ("unknown-family", "unknown_family", "`family: rnn`", {}, [], ConfigError,
           "family: unknown model family 'rnn'"),
          ("family-list", "family_list", "`family: [mlp]` (a list)", {}, [], ConfigError,
           "family: unknown model family ['mlp']"),
          ("layers-string", "layers_string", "`layers: two`", {}, [], ConfigError,
           "mlp.layers: must be a positive integer, got 'two'"),
          ("unknown-field", "unknown_field", "a misspelt field `layerz`", {}, [], ConfigError,
           "unknown field 'layerz'"),
          ("bias-not-bool", "bias_not_bool", "`bias: maybe`", {}, [], ConfigError,
           "mlp.bias: must be true or false, got 'maybe'"),
          ("gpt-heads", "gpt_heads", "GPT: 4 heads, hidden 30", {"dp": 8}, ["--dp", "8"],
           ConfigError, "heads: 4 heads do not divide hidden size 30"),
          ("gpt-kv-heads", "gpt_kv_heads", "GPT: 3 kv heads for 4 heads", {"dp": 8},
           ["--dp", "8"], ConfigError, "kv_heads: 3 must divide heads (4)"),
          ("gpt-micro-batch", "gpt_micro_batch", "GPT: global batch 8, micro batch 3",
           {"dp": 8}, ["--dp", "8"], ConfigError,
           "global_batch: 8 is not a multiple of micro_batch 3"),
      ]],

    # sweep specs
    *[_c(f"sweep-{name}", "sweep spec", what, _load_sweep(f"sweep_{file}.yaml"),
         ["sweep", f"{{cases}}/sweep_{file}.yaml", "--workers", "1", "--quiet", "--out", OUT],
         ConfigError, message)
      for name, file, what, message in [
          ("no-grid", "no_grid", "no `grid:`", "grid: missing"),
          ("grid-scalar", "grid_scalar", "`grid: {dp: 4}` (not a list)",
           "grid.dp: must be a list of values, got 4"),
          ("unknown-option", "unknown_option", "`grid: {dpp: [1, 2]}`",
           "grid.dpp: unknown parameter 'dpp'"),
          ("bad-value", "bad_value", "`grid: {dp: [one, two]}`",
           "grid.dp[0]: dp must be an integer, got 'one'"),
          ("constraint-code", "constraint_code", "a constraint calling `__import__`",
           "only min, max, abs, int, float, len may be called"),
          ("constraint-syntax", "constraint_syntax", "a constraint `dp <<< 3`",
           "constraint 'dp <<< 3' is not a valid expression"),
          ("unknown-model", "unknown_model", "`base: {model: nope}`", "unknown model 'nope'"),
          ("too-many-points", "too_many_points", "a grid of 4 x 50 x 10 x 18 x 10 points",
           "grid: expands to 360,000 points (4 x 50 x 10 x 18 x 10), more than max_points "
           "100,000"),
      ]],

    # the text format
    *[_c(f"text-{name}", "text format", what, _read_text(f"text_{file}.dir"),
         ["print", f"{{cases}}/text_{file}.dir"], error, message)
      for name, file, what, error, message in [
          ("undefined-value", "undefined_value", "use of an undefined value", ParseError,
           "text_undefined_value.dir:2:13: use of undefined value %z"),
          ("unknown-dtype", "unknown_dtype", "dtype `f99`", ParseError,
           "text_unknown_dtype.dir:2:20: unknown dtype 'f99'"),
          ("negative-dim", "negative_dim", "`f32[-4]`", ParseError,
           "text_negative_dim.dir:1:17: negative dimension -4"),
          ("huge-dim", "huge_dim", "`f32[10^12,10^12]` (4 * 10^24 bytes)", VerifyError,
           "a dimension is absurdly large"),
          ("deep-nesting", "deep_nesting", "an attribute nested 100 lists deep", ParseError,
           "attribute value nested deeper than 64 lists"),
          ("bad-escape", "bad_escape", "a string attribute `\"\\q\"`", ParseError,
           "text_bad_escape.dir:2:29: bad string"),
          ("long-integer", "long_integer", "a 5000-digit integer attribute", ParseError,
           "text_long_integer.dir:2:29: expected an integer attribute"),
          ("unexpected-character", "unexpected_character", "a `$` in an op line", ParseError,
           "text_unexpected_character.dir:2:31: unexpected character '$'"),
          ("missing-return", "missing_return", "a function without `return`", ParseError,
           "missing 'return' before end of input"),
          ("unknown-op", "unknown_op", "op `frobnicate`", VerifyError,
           "op %y = frobnicate: unknown op type 'frobnicate'"),
          ("wrong-result-type", "wrong_result_type", "a result declared with the wrong shape",
           VerifyError, "result %y is declared f32[4,5]@0 but the op produces f32[4,4]@0"),
          ("ranks-not-a-list", "ranks_not_list", "`ranks = 5`", VerifyError,
           "op %y = comm.broadcast: malformed attributes {ranks = 5"),
          ("wrong-device", "wrong_device", "a matmul of values on devices 0 and 1", VerifyError,
           "op %y = matmul: inputs on different devices [0, 1]"),
          ("mismatched-team", "mismatched_team",
           "an all-reduce over ranks [0, 1] fed from device 2",
           VerifyError, "input on device 2 where team rank 1 was expected"),
          ("send-without-receive", "send_without_receive", "a sendrecv with only a sender",
           VerifyError, "sendrecv needs ranks [src, dst], got (0,)"),
      ]],

    # ONNX files
    *[_c(f"onnx-{kind.replace('_', '-')}", "ONNX file", what, _import_onnx(kind),
         ["import", f"{{tmp}}/{kind}.onnx"], error, message)
      for kind, what, error, message in [
          ("truncated", "the first half of a valid file", ParseError,
           "truncated.onnx: not an ONNX model, or truncated"),
          ("wrong_magic", "a zip header in front of a model", ParseError,
           "wrong_magic.onnx: not an ONNX model, or truncated"),
          ("empty", "an empty file", ParseError, "empty.onnx: not an ONNX model"),
          ("cyclic", "two nodes feeding each other", ParseError, "cycle through node"),
          ("dangling", "a node reading an undefined tensor", ParseError,
           "node 'adder' (Add): input 'nowhere' is dangling"),
          ("contradicting_shapes", "an output declared [2,4] for a [2,3] Relu", VerifyError,
           "node 'act' (Relu): 'y' is declared with shape (2, 4)"),
          ("contradicting_matmul", "MatMul of [2,3] by [4,5]", VerifyError,
           "node 'mm' (MatMul): contraction dims differ"),
          ("huge_dims", "an input of 2^62 x 2^62", VerifyError, "a dimension is absurdly large"),
          ("negative_dims", "an input dim of -3", ConfigError,
           "graph input 'x': dimension 0 is negative (-3)"),
          ("negative_initializer", "an initializer with dims [3, -4]", ConfigError,
           "initializer 'w': dimension 1 is negative (-4)"),
          ("unknown_dtype", "a STRING input", UnsupportedOpError,
           "graph input 'x': element type STRING is not supported"),
          ("dtype_99", "element type 99", UnsupportedOpError, "element type 99 is not supported"),
          ("unsupported_op", "an op type `FooBar`", UnsupportedOpError,
           "unsupported op types: FooBar"),
          ("old_opset", "opset 1", UnsupportedOpError,
           "opset 1 is older than the oldest supported"),
          ("bad_reshape", "Reshape to [-1, -1]", VerifyError, "has more than one -1"),
      ]],

    # programs (the simulator's input, built in memory without the verifier)
    _c("program-member-never-reaches", "program", "an all-reduce one member never reaches",
       _simulate_program(deadlock_member_never_reaches), None, SimulationError,
       "device 1 compute: %p1 (relu) waiting for input %q1"),
    _c("program-sendrecv-own-output", "program",
       "a sendrecv whose input is computed from its own output",
       _simulate_program(deadlock_sendrecv_own_output), None, SimulationError,
       "device 0 compute: %a0 (relu) waiting for input %c0"),
    _c("program-circular-wait", "program", "three all-reduces waiting on each other in a ring",
       _simulate_program(deadlock_circular_wait), None, SimulationError, "6 stream(s) blocked"),
    _c("program-value-off-topology", "program", "a value on device 12 of an 8-GPU topology",
       _simulate_program(value_on_missing_device), None, TopologyError,
       "value %x is on device 12, but topology 'dgx-a100' has devices 0..7"),
    _c("program-team-off-topology", "program", "an all-reduce with team rank 9 on 8 GPUs",
       _simulate_program(team_rank_missing), None, TopologyError, "is on device 9"),
]


# -- imported ONNX models under a strategy (appended by the ONNX importer work) --

def _missing_external_data(tmp: Path):
    """A model whose int64 shape initializer lives in 'absent.bin', which
    is not there (integer tensors are read at import time)."""
    from distsim.importers.onnx import import_onnx
    shape = numpy_helper.from_array(np.array([3, 2], dtype=np.int64), "s")
    shape.ClearField("raw_data")
    shape.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "absent.bin"), ("offset", "0"), ("length", "16")):
        entry = shape.external_data.add()
        entry.key, entry.value = key, value
    m = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshaper")],
               [_vi("x", [2, 3])], [_vi("y", None)], [shape])
    path = Path(tmp) / "missing_external.onnx"
    path.write_bytes(m.SerializeToString())
    return import_onnx(str(path))


_ONNX_TRAIN = ["--model", "gpt2-tiny", "--train", "--batch", "8", "--seq", "8"]
CASES.extend([
    _c("onnx-recompute-without-train", "CLI flags",
       "`simulate --model gpt2-tiny --recompute full` (no --train)",
       _simulate(model="gpt2-tiny", batch=8, seq=8, recompute="full"),
       S + ["--model", "gpt2-tiny", "--batch", "8", "--seq", "8", "--recompute", "full"],
       ConfigError, "--recompute full: the imported ONNX model 'gpt2-tiny' is forward-only here"),
    _c("onnx-zero-without-train", "CLI flags", "`simulate --model gpt2-tiny --zero 1` (no --train)",
       _simulate(model="gpt2-tiny", batch=8, seq=8, zero=1),
       S + ["--model", "gpt2-tiny", "--batch", "8", "--seq", "8", "--zero", "1"], ConfigError,
       "--zero 1: the imported ONNX model 'gpt2-tiny' is forward-only"),
    _c("onnx-dp-not-all-devices", "CLI flags",
       "`simulate --model gpt2-tiny --train --dp 2` on 8 GPUs",
       _simulate(model="gpt2-tiny", train=True, batch=8, seq=8, dp=2),
       S + _ONNX_TRAIN + ["--dp", "2"], ConfigError,
       "dp x tp x pp = 2 x 1 x 1 = 2 does not match the 8 devices"),
    _c("onnx-seq-past-positions", "ONNX file",
       "bert-tiny (64 positions) with `--input-shape input_ids=8x128`",
       _simulate(model="bert-tiny", input_shapes={"input_ids": (8, 128)}),
       S + ["--model", "bert-tiny", "--input-shape", "input_ids=8x128"], VerifyError,
       "the sequence length 128 (input 'input_ids' 1x128) exceeds the model's 64 positions"),
    _c("onnx-missing-external-data", "ONNX file",
       "an int64 initializer stored in an external file that is absent",
       _missing_external_data, None, ConfigError,
       "is stored in the external file 'absent.bin', which is missing"),
    _c("collective-nodes-past-cluster", "CLI flags",
       "`collective allreduce --topology dgx-a100-x2 --nodes 4`", None,
       ["collective", "allreduce", "--topology", "dgx-a100-x2", "--nodes", "4"], ConfigError,
       "topology 'dgx-a100-x2' has 2 node(s); pass a cluster with enough servers, "
       "e.g. --topology dgx-a100-x4"),
])


def _shard_file(name: str):
    def run(tmp: Path):
        from distsim.cli.files import read_program
        from distsim.transforms.sharding import shard_program
        return shard_program(read_program(str(CASES_DIR / name)))
    return run


CASES.extend([
    _c("sharding-nested-uneven", "text format",
       "`f32[5,4]` as `[S(0), S(0)]` on a 2 x 3 mesh (the 2-row piece over 3 devices)",
       _shard_file("shard_nested_uneven.dir"), ["check", "{cases}/shard_nested_uneven.dir"],
       VerifyError, "value %y: dim 0 of size 5 has a piece of size 2 (after axes 'a') that is "
                    "sharded over axis 'b'"),
])

def _simulate_tiny_with(**fields):
    def run(tmp: Path):
        import distsim
        from distsim.models import load_model_config
        return distsim.simulate(model={**load_model_config("tiny"), **fields},
                                network_mode="analytical")
    return run


CASES.extend([
    _c("prefetch-negative", "CLI flags", "`simulate --model tiny --zero 3 --prefetch -1`",
       _simulate(model="tiny", zero=3, prefetch=-1),
       S + ["--model", "tiny", "--zero", "3", "--prefetch", "-1"], ConfigError,
       "--prefetch: must be a non-negative integer, got -1"),
    _c("order-not-a-permutation", "CLI flags", "`simulate --model tiny --order tp-tp-pp`",
       _simulate(model="tiny", order="tp-tp-pp"),
       S + ["--model", "tiny", "--order", "tp-tp-pp"], ConfigError,
       "--order: must be one of tp-dp-pp, tp-pp-dp, dp-tp-pp, dp-pp-tp, pp-tp-dp, pp-dp-tp, "
       "got 'tp-tp-pp'"),
    _c("optimizer-unknown", "Python API", "`simulate(model='tiny', optimizer='adam')`",
       _simulate(model="tiny", optimizer="adam"), None, ConfigError,
       "--optimizer: must be one of adamw, sgd, got 'adam'"),
    _c("momentum-out-of-range", "model YAML", "a GPT config with `momentum: 1.5`",
       _simulate_tiny_with(momentum=1.5), None, ConfigError,
       "momentum: must be in [0, 1), got 1.5"),
    _c("batch-sizes-disagree", "CLI flags",
       "`simulate --model tiny --dp 8 --microbatches 2 --micro-batch 3` (global batch 8)",
       _simulate(model="tiny", dp=8, microbatches=2, micro_batch=3),
       S + ["--model", "tiny", "--dp", "8", "--microbatches", "2", "--micro-batch", "3"],
       ConfigError, "--global-batch 8 differs from dp x microbatches x micro-batch = "
       "8 x 2 x 3 = 48"),
    _c("microbatches-not-dividing", "CLI flags",
       "`simulate --model tiny --dp 8 --microbatches 3` (global batch 8)",
       _simulate(model="tiny", dp=8, microbatches=3),
       S + ["--model", "tiny", "--dp", "8", "--microbatches", "3"], ConfigError,
       "--global-batch 8 is not a multiple of dp x microbatches = 8 x 3"),
    _c("sweep-check-simulated", "sweep spec", "`check: 2` on a grid that is not estimated",
       _load_sweep("sweep_check_simulated.yaml"),
       ["sweep", "{cases}/sweep_check_simulated.yaml", "--workers", "1", "--quiet",
        "--out", OUT], ConfigError, "check: 2 needs estimated points"),
    _c("search-keep-zero", "CLI flags", "`search --model tiny --topology dgx-a100 --keep 0`",
       _search_keep_zero, ["search", "--model", "tiny", "--topology", "dgx-a100", "--keep", "0"],
       ConfigError, "--keep: must be a positive integer, got 0"),
])


def _onnx_lr_nan(tmp: Path):
    import distsim
    path = Path(__file__).resolve().parents[2] / "models" / "bert-tiny.onnx"
    return distsim.simulate(model={"family": "onnx", "path": str(path), "batch": 8, "seq": 16,
                                   "lr": float("nan")}, network_mode="analytical")


def _sweep_bytes(text: str):
    def run(tmp: Path):
        from distsim.sim.collective_bench import parse_sweep
        return parse_sweep(text)
    return run


CASES.extend([
    _c("onnx-lr-nan", "model YAML", "an ONNX model config with `lr: .nan` (no family checks it)",
       _onnx_lr_nan, None, ConfigError, "model 'onnx': lr: must be a finite number, got nan"),
    _c("batch-and-global-batch-differ", "CLI flags",
       "`simulate --model tiny --batch 16 --global-batch 32`",
       _simulate(model="tiny", batch=16, global_batch=32),
       S + ["--model", "tiny", "--batch", "16", "--global-batch", "32"], ConfigError,
       "--batch 16 and --global-batch 32 differ (both are the global batch: give one)"),
    _c("mlp-optimizer-adamw", "CLI flags", "`simulate --optimizer adamw` on the MLP (SGD)",
       _simulate(optimizer="adamw"), S + ["--optimizer", "adamw"], ConfigError,
       "--optimizer adamw: not supported by model 'mlp'"),
    _c("collective-sweep-too-many-sizes", "CLI flags",
       "`collective allreduce --sweep-bytes 1:1e30:1.0000001` (~7e8 sizes)",
       _sweep_bytes("1:1e30:1.0000001"),
       ["collective", "allreduce", "--sweep-bytes", "1:1e30:1.0000001"], ConfigError,
       "690,775,563 sizes, more than 1,000"),
    _c("collective-sweep-nan-factor", "CLI flags",
       "`collective allreduce --sweep-bytes 1KB:1MB:nan`",
       _sweep_bytes("1KB:1MB:nan"), ["collective", "allreduce", "--sweep-bytes", "1KB:1MB:nan"],
       ConfigError, "the factor must be a finite number > 1, got 'nan'"),
    _c("input-shape-twice", "CLI flags", "`import --input-shape x=2x3 --input-shape x=4x3`", None,
       ["import", "{tmp}/negative_dims.onnx", "--input-shape", "x=2x3", "--input-shape", "x=4x3"],
       ConfigError, "--input-shape: input 'x' is given twice (x=2x3 and x=4x3): give it once"),
])


CASES.extend([
    # YAML that expands or nests past what a loader should walk, and values quoted in errors
    *[_c(f"topology-{name}", "topology YAML", what, _load_topology(f"topo_{file}.yaml"),
         S + ["--topology", f"{{cases}}/topo_{file}.yaml"], ConfigError, message)
      for name, file, what, message in [
          ("alias-bomb", "alias_bomb",
           "an alias bomb: 8 levels of 9 aliases (43 million strings in 12 lines)",
           "topo_alias_bomb.yaml: its aliases expand to more than 100,000 nodes"),
          ("alias-cycle", "alias_cycle", "an alias inside the list it names (`&a [1, *a]`)",
           "topo_alias_cycle.yaml: an alias refers to a node that contains it"),
          ("deep-nesting", "deep_nesting", "lists nested 400 deep",
           "topo_deep_nesting.yaml: nested deeper than 100 levels"),
          ("long-value", "long_value", "2,916 strings (by aliases) where a peak belongs",
           "device.peak_flops.f16: must be a positive number, got [[[['a-long-string'"),
          ("device-name-list", "device_name_list", "`device: {name: [a, b]}`",
           "device.name: must be a name, got a list"),
          ("no-devices", "no_devices", "`devices: []`",
           "topo_no_devices.yaml: devices: is empty (a topology needs at least one device)"),
      ]],
    _c("topology-no-peak-for-dtype", "topology YAML",
       "`peak_flops: {f32: ...}` only, for the MLP (f16)",
       _simulate_file("topology", "topo_f32_peak_only.yaml"),
       S + ["--topology", "{cases}/topo_f32_peak_only.yaml"], ConfigError,
       "device.peak_flops: no entry for f16, the compute dtype of model 'mlp' (it lists f32)"),
    _c("model-layers-true", "model YAML", "`layers: true`",
       _simulate_file("model", "model_layers_true.yaml"),
       S + ["--model", "{cases}/model_layers_true.yaml"], ConfigError,
       "model_layers_true.yaml: mlp.layers: must be a positive integer, got True"),
    _c("draw-missing-folder", "CLI flags", "`topology dgx-a100 --draw nowhere/dir/g.png`", None,
       ["topology", "dgx-a100", "--draw", "nowhere/dir/g.png"], ConfigError,
       "--draw nowhere/dir/g.png: the folder nowhere/dir does not exist"),
    _c("draw-not-png", "CLI flags", "`topology dgx-a100 --draw g.txt`", None,
       ["topology", "dgx-a100", "--draw", "g.txt"], ConfigError,
       "--draw g.txt: the drawing is a PNG image; name a .png file"),
    _c("max-wall-s-shorter-than-the-build", "CLI flags",
       "`simulate --model gpt2 --max-wall-s 0.01`",
       _simulate(model="gpt2", max_wall_s=0.01),
       S + ["--model", "gpt2", "--max-wall-s", "0.01"], SimulationError,
       "stopped while building the program"),
    _c("collective-nodes-zero", "CLI flags", "`collective allreduce --nodes 0`", None,
       ["collective", "allreduce", "--nodes", "0"], ConfigError,
       "--nodes: must be a positive integer, got 0"),
    _c("stdout-full", "CLI flags", "`simulate --json --no-plots > /dev/full`", None,
       ["simulate", "--json", "--no-plots", "--layers", "1", "--hidden", "64", "--batch", "64",
        "--out", OUT], OSError,
       "cannot write <stdout>: No space left on device (the output files were removed)",
       stdout="full"),
])


def readme_table() -> str:
    """The catalogue as the Markdown table of README.md
    (``python tests/adversarial/catalogue.py`` prints it)."""
    lines = ["| id | entry point | bad input | error class | message contains | CLI exit |",
             "|---|---|---|---|---|---|"]
    for c in CASES:
        cls = c.error.__name__ if c.error is not None else "usage error (argparse)"
        message = c.message.replace("|", "\\|")
        tick = "`" if "`" not in message else "``"
        lines.append(f"| `{c.id}` | {c.entry} | {c.what} | `{cls}` | {tick}{message}{tick} | "
                     f"{'2' if c.cli is not None else '—'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(readme_table())
