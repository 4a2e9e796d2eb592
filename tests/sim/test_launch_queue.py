"""The host's launch queue (``host_launch_s``): a kernel starts no earlier
than the host issued it, one kernel every H from time 0. Times by hand,
with H = 10 us and kernel times set by a profile."""
from pathlib import Path

import pytest

import distsim
from distsim.cost import CostModel, DeviceSpec
from distsim.errors import ConfigError
from distsim.cost.device import device_spec_from_dict
from distsim.ir import DType, FunctionBuilder, TensorType
from distsim.sim.simulator import simulate_function
from distsim.topology import load_topology

F16 = DType.F16
US = 1e-6
H = 10 * US


def spec(host_launch_s=H):
    return DeviceSpec(name="t", peak_flops={"f16": 1e12}, memory_bandwidth_Bps=1e12,
                      memory_bytes=10**9, host_launch_s=host_launch_s)


def costs(host_launch_s=H):
    # a matmul takes 1 ms, an add 1 us (on the device, launch included)
    return CostModel(spec(host_launch_s), profile={"matmul": 1e-3, "add": 1 * US})


def program(matmuls, adds):
    b = FunctionBuilder("p")
    x = b.input("x", TensorType((100, 100), F16, 0))
    for _ in range(matmuls):
        x = b.op("matmul", [x, x])
    for _ in range(adds):
        x = b.op("add", [x, x])
    return b.finish([x])


@pytest.fixture(scope="module")
def topo():
    return load_topology("dgx-a100")


def test_launches_hide_behind_a_long_kernel(topo):
    # issued at 10 us (matmul) and 20..110 us (adds); the matmul runs 10 to
    # 1010 us and the adds, long since queued, 1010 to 1020: of eleven
    # launches (110 us) only the first shows
    trace = simulate_function(program(1, 10), topo, costs())
    assert trace.step_time_s == pytest.approx(1020 * US, rel=1e-12)
    starts = [r.start_s for r in trace.ops]
    assert starts == pytest.approx([10 * US] + [(1010 + i) * US for i in range(10)], rel=1e-12)
    # without the queue: 1010 us
    assert simulate_function(program(1, 10), topo, costs(0.0)).step_time_s == \
        pytest.approx(1010 * US, rel=1e-12)


def test_launches_show_behind_short_kernels(topo):
    # the i-th add is issued at 10 i us and runs 1 us: the device waits for
    # the host, 10 x 10 us + 1 us
    trace = simulate_function(program(0, 10), topo, costs())
    assert trace.step_time_s == pytest.approx(101 * US, rel=1e-12)
    assert [r.start_s for r in trace.ops] == pytest.approx([10 * i * US for i in range(1, 11)],
                                                           rel=1e-12)
    assert [r.end_s - r.start_s for r in trace.ops] == pytest.approx([1 * US] * 10, rel=1e-9)


def test_a_fused_segment_carries_the_host_lag_over_its_kernels():
    # kernels of 1, 30 and 1 us issued at 10, 20, 30 us: 10-11, 20-50,
    # 50-51; the segment ends 51 us after the host's origin, lead 19 us
    # (max of 1 x 10 - 0, 2 x 10 - 1, 3 x 10 - 31) plus its 32 us
    b = FunctionBuilder("seg")
    x = b.input("x", TensorType((100, 100), F16, 0))
    y = b.op("add", [x, x])
    y = b.op("matmul", [y, y])
    y = b.op("add", [y, y])
    seg = b.finish([y])
    model = CostModel(spec(), profile={"add": 1 * US, "matmul": 30 * US})
    kernels, lead = model.function_lead(seg)
    assert kernels == 3
    assert lead == pytest.approx(19 * US, rel=1e-12)
    assert model.function_cost(seg).time_s == pytest.approx(32 * US, rel=1e-12)


def test_coarsened_and_whole_programs_agree_under_the_queue(tmp_path):
    # coarsening makes runs of kernels one op; with each segment's lead the
    # step time is the unfused program's, now that short kernels wait for
    # the host
    text = (Path(distsim.__file__).parents[1] / "topologies" / "dgx-a100.yaml").read_text()
    path = tmp_path / "queued.yaml"
    path.write_text(text.replace("\ndevice:\n", "\ndevice:\n  host_launch_s: 2.0e-5\n", 1))
    t = load_topology(str(path))
    assert t.device_spec.host_launch_s == 2.0e-5
    opts = dict(model="gpt2", layers=2, seq=128, micro_batch=1, global_batch=8, dp=2, tp=4,
                topology=t, symmetry=False)
    whole = distsim.simulate(**opts, coarsen=False).step_time_s
    coarse = distsim.simulate(**opts, coarsen=True).step_time_s
    plain = distsim.simulate(**{**opts, "topology": load_topology("dgx-a100")},
                             coarsen=False).step_time_s
    assert coarse == pytest.approx(whole, rel=1e-9)
    assert whole > plain


@pytest.mark.parametrize("raw, message", [
    (-1e-6, "device.host_launch_s: must be >= 0, got -1e-06"),
    ("fast", "device.host_launch_s: expected a number, got 'fast'"),
    (2.0, "device.host_launch_s: must be between 0 and 1, got 2.0"),
])
def test_a_bad_host_launch_time_names_the_field(raw, message):
    data = dict(name="t", peak_flops={"f16": 1e12}, memory_bandwidth_Bps=1e12,
                memory_bytes=1e9, host_launch_s=raw)
    with pytest.raises(ConfigError) as err:
        device_spec_from_dict(data, "x.yaml: device")
    assert str(err.value) == f"x.yaml: {message}"
