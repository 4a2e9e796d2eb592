"""Memory inside fused segments (distsim.sim.segment_bodies): a fused op's
values are allocated and freed where its inner ops would, as in the
program with those ops unfused. Curves by hand: every tensor is 200 bytes
(f16 10 x 10), an add takes 1 us and a matmul 30 us (a profile)."""
import pytest

from distsim.cost import CostModel, DeviceSpec
from distsim.ir import DType, Function, Op, TensorType, Value
from distsim.ir.ops_bundle import PACK, UNPACK, bundle_type, unpack_attrs
from distsim.ir.ops_fused import FUSED
from distsim.sim.simulator import simulate_function
from distsim.topology import load_topology

US = 1e-6
B = 200     # bytes of each tensor


def _t(device=0):
    return TensorType((10, 10), DType.F16, device)


def _costs():
    spec = DeviceSpec(name="t", peak_flops={"f16": 1e12}, memory_bandwidth_Bps=1e12,
                      memory_bytes=10**9)
    return CostModel(spec, profile={"add": 1 * US, "matmul": 30 * US})


@pytest.fixture(scope="module")
def topo():
    return load_topology("dgx-a100")


def _segment(name, inputs, body):
    """A device-free segment function: ``body(inputs) -> (ops, outputs)``
    on fresh inputs of the given types."""
    fn = Function(name, list(inputs))
    fn.ops, fn.outputs = body(fn.inputs)
    return fn


def _fused(fn, inputs, names):
    outs = [Value(n, TensorType(v.type.shape, v.type.dtype, 0))
            for n, v in zip(names, fn.outputs)]
    return Op(FUSED, inputs, outs, {"segment": fn.name, "ops": len(fn.ops)}, (fn,)), outs


def _curve(trace):
    return [(round(s.time_s / US, 6), s.live_bytes) for s in trace.memory if s.rank == 0]


def _one_segment():
    """a = x + x; b = a @ x; c = b + a, once as three ops, once fused."""
    x = Value("x", _t())
    a, b, c = Value("a", _t()), Value("b", _t()), Value("c", _t())
    full = Function("full", [x])
    full.ops = [Op("add", [x, x], [a]), Op("matmul", [a, x], [b]), Op("add", [b, a], [c])]
    full.outputs = [c]

    def body(ins):
        (sx,) = ins
        sa, sb, sc = Value("a", _t(None)), Value("b", _t(None)), Value("c", _t(None))
        return [Op("add", [sx, sx], [sa]), Op("matmul", [sa, sx], [sb]),
                Op("add", [sb, sa], [sc])], [sc]

    fused = Function("fused", [x])
    op, outs = _fused(_segment("s", [Value("x", _t(None))], body), [x], ["c"])
    fused.ops, fused.outputs = [op], outs
    return full, fused


def test_a_segment_allocates_and_frees_as_its_ops_would(topo):
    # 0: x, a (400); 1 us: b (600); 31 us: x freed (its last reader, the
    # matmul, ends), c made (600); 32 us: a and b freed (200: c, returned).
    # Fused as one op of 32 us, it used to hold x and c only (peak 400)
    full, fused = _one_segment()
    expected = [(0.0, 2 * B), (1.0, 3 * B), (31.0, 3 * B), (32.0, B)]
    for program in (full, fused):
        trace = simulate_function(program, topo, _costs())
        assert trace.step_time_s == pytest.approx(32 * US, rel=1e-12)
        assert _curve(trace) == expected
        assert trace.peak_memory()[0] == 3 * B
        assert trace.meta["peak_memory_by_category"][0] == {"activations": 3 * B}


def _bundled():
    """Segment 1 makes a (add) and b (matmul) and packs them; segment 2
    unpacks them and makes c = b + b, then d = a + a."""
    x = Value("x", _t())
    a, b, c, d = (Value(n, _t()) for n in "abcd")
    full = Function("full", [x])
    full.ops = [Op("add", [x, x], [a]), Op("matmul", [a, x], [b]), Op("add", [b, b], [c]),
                Op("add", [a, a], [d])]
    full.outputs = [c, d]

    def first(ins):
        (sx,) = ins
        sa, sb = Value("a", _t(None)), Value("b", _t(None))
        pack = Value("ab", bundle_type([sa.type, sb.type]))
        return [Op("add", [sx, sx], [sa]), Op("matmul", [sa, sx], [sb]),
                Op(PACK, [sa, sb], [pack])], [pack]

    def second(ins):
        (bundle,) = ins
        sa, sb = Value("a", _t(None)), Value("b", _t(None))
        sc, sd = Value("c", _t(None)), Value("d", _t(None))
        return [Op(UNPACK, [bundle], [sa, sb], unpack_attrs([sa.type, sb.type])),
                Op("add", [sb, sb], [sc]), Op("add", [sa, sa], [sd])], [sc, sd]

    s1 = _segment("s1", [Value("x", _t(None))], first)
    s2 = _segment("s2", [Value("ab", bundle_type([_t(None), _t(None)]))], second)
    op1, (ab,) = _fused(s1, [x], ["ab"])
    op2, outs = _fused(s2, [ab], ["c", "d"])
    fused = Function("fused", [x])
    fused.ops, fused.outputs = [op1, op2], outs
    return full, fused


def test_a_bundle_is_counted_part_by_part(topo):
    # 0: x, a (400); 1: b (600); 31: x freed, c made (600); 32: b freed
    # (its last reader ends), d made (600); 33: a freed (400: c and d).
    # The bundle as one value was made at 0 and freed at 33 (peak 800 at
    # 31: the bundle, c and d, x gone)
    full, fused = _bundled()
    expected = [(0.0, 2 * B), (1.0, 3 * B), (31.0, 3 * B), (32.0, 3 * B), (33.0, 2 * B)]
    for program in (full, fused):
        trace = simulate_function(program, topo, _costs())
        assert trace.step_time_s == pytest.approx(33 * US, rel=1e-12)
        assert _curve(trace) == expected
        assert trace.peak_memory()[0] == 3 * B
