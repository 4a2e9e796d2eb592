"""The calibrated blocks of a device (gemm, attention,
memory_efficiency_by_class): a bad figure is one ConfigError naming the
file and the field."""
import pytest

from distsim.cost.device import device_spec_from_dict
from distsim.errors import ConfigError

DEVICE = {"name": "t", "peak_flops": {"bf16": 1e12}, "memory_bandwidth_Bps": 1e12,
          "memory_bytes": 1e9}
GEMM = {"sms": 4, "efficiency": {"bf16": 0.7}}


@pytest.mark.parametrize("block, message", [
    ({"gemm": {**GEMM, "efficiency": {"bf16": 1.2}}},
     "device.gemm.efficiency.bf16: must be in (0, 1], got 1.2"),
    ({"gemm": {"efficiency": {"bf16": 0.7}}}, "device.gemm.sms: missing required field"),
    ({"gemm": {**GEMM, "sms": 2.5}}, "device.gemm.sms: expected an integer, got 2.5"),
    ({"gemm": {**GEMM, "tiles": [[0, 128]]}}, "device.gemm.tiles[0].rows: must be in [1, 4096], "
                                              "got 0"),
    ({"gemm": {**GEMM, "tiles": [128]}}, "device.gemm.tiles[0]: expected [rows, columns], "
                                         "got 128"),
    ({"gemm": {**GEMM, "wave_quantization": 2}}, "device.gemm.wave_quantization: must be in "
                                                 "[0, 1], got 2"),
    ({"gemm": {**GEMM, "k_overhead": -1}}, "device.gemm.k_overhead: must be in [0, 1e+06], "
                                           "got -1"),
    ({"gemm": {**GEMM, "efficiency": {"bf17": 0.5}}}, "device.gemm.efficiency.bf17: unknown "
                                                      "dtype"),
    ({"gemm": {**GEMM, "tile": 1}}, "device.gemm.tile: unknown field (allowed: sms, efficiency, "
                                    "tiles, k_overhead, tile_intensity, wave_quantization, "
                                    "source)"),
    ({"attention": {"fwd_efficiency": 0, "bwd_efficiency": 0.5}},
     "device.attention.fwd_efficiency: must be in (0, 1], got 0"),
    ({"attention": {"fwd_efficiency": 0.5}}, "device.attention.bwd_efficiency: missing "
                                             "required field"),
    ({"memory_efficiency_by_class": {"norms": 0.5}},
     "device.memory_efficiency_by_class.norms: unknown field (allowed: copy, elementwise, norm, "
     "softmax, reduction)"),
    ({"memory_efficiency_by_class": {"norm": 1.5}},
     "device.memory_efficiency_by_class.norm: must be in (0, 1], got 1.5"),
])
def test_bad_calibrated_figures_name_the_field(block, message):
    with pytest.raises(ConfigError) as info:
        device_spec_from_dict({**DEVICE, **block}, "x.yaml: device")
    assert str(info.value) == f"x.yaml: {message}"


def test_good_blocks_load():
    spec = device_spec_from_dict({**DEVICE, "gemm": {**GEMM, "tiles": [[128, 64]]},
                                  "attention": {"fwd_efficiency": 0.7, "bwd_efficiency": 0.6},
                                  "memory_efficiency_by_class": {"norm": 0.5}}, "x")
    assert spec.gemm.tiles == ((128, 64),) and spec.gemm.efficiency == {"bf16": 0.7}
    assert spec.attention.bwd_efficiency == 0.6 and spec.memory_efficiency_of("rmsnorm") == 0.5
