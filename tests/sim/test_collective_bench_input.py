"""Bad team lists for ``distsim collective --devices`` (sim/collective_bench.py):
one ConfigError naming the list, before any list of ranks is built; and sizes
below one byte."""
import pytest

from distsim.errors import ConfigError
from distsim.sim.collective_bench import parse_bytes, parse_ranks
from distsim.topology.builders import MAX_DEVICES


def test_the_largest_rank_distsim_simulates_is_accepted():
    assert parse_ranks(f"{MAX_DEVICES - 2}-{MAX_DEVICES - 1}") == (MAX_DEVICES - 2,
                                                                  MAX_DEVICES - 1)


@pytest.mark.parametrize("text", [
    "0-99999999999999999999",     # was an OverflowError: an internal error, exit 3
    "0-999999999",                # was a list of a billion ints: memory exhausted
    str(MAX_DEVICES),
    ",".join(["0-40000"] * 2),    # more ranks in all than any topology has
])
def test_ranks_past_what_distsim_simulates_are_one_clear_error(text):
    with pytest.raises(ConfigError, match="bad device list .*65,536 devices"):
        parse_ranks(text)


def test_a_root_for_a_collective_without_one_is_an_error():
    """``collective allreduce --root 3`` used to be ignored without a word."""
    from distsim.sim.collective_bench import benchmark_collective
    with pytest.raises(ConfigError, match="allreduce: --root applies only to broadcast"):
        benchmark_collective("allreduce", "1KB", "dgx-a100", root=3)


def test_a_send_recv_between_three_given_ranks_is_an_error():
    """``collective sendrecv --devices 0-2`` used to time 0 -> 2 silently;
    without ``ranks`` the team is still the first and last rank (0 -> 7 on
    one DGX A100: 1 GB at the 300 GB/s NVLink plus 2 x 0.5 us)."""
    from distsim.sim.collective_bench import benchmark_collective
    with pytest.raises(ConfigError, match=r"sendrecv: the team must be \(sender, receiver\)"):
        benchmark_collective("sendrecv", "1KB", "dgx-a100", ranks=(0, 1, 2))
    out = benchmark_collective("sendrecv", "1GB", "dgx-a100")
    # NCCL's Simple protocol on NVLink (topologies/dgx-a100.yaml): 86 % of
    # 300 GB/s, 1 us a path and 1.0 us a step, 8.4 us once, 200 us for the
    # pipeline to fill
    rate = 0.86 * 300e9
    assert out["time_s"] == pytest.approx(8.4e-6 + 200e-6 + 2.0e-6 + 1e9 / rate,
                                          rel=1e-12)


@pytest.mark.parametrize("text", ["0.5", "0.4B", 0.5, "0.0001KB"])
def test_a_size_below_one_byte_is_an_error_not_a_zero_byte_row(text):
    with pytest.raises(ConfigError, match="less than one byte"):
        parse_bytes(text)


def test_whole_and_rounded_sizes_still_parse():
    assert parse_bytes("0") == 0
    assert parse_bytes("1.5KB") == 1500
    assert parse_bytes(1.4) == 1
