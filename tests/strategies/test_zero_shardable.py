"""ZeRO refuses, in one line naming the parameter, what it cannot shard:
a parameter with fewer elements than data-parallel ranks (ZeRO 2/3
reduce-scatter each gradient over dp), and under symmetry a parameter
whose shards would differ between ranks. Both used to end in a ShapeError
from inside the lowering."""
import pytest

from distsim import api
from distsim.errors import PassPreconditionError

TINY = dict(model="gpt2", layers=1, hidden=12, heads=2, vocab=64, seq=8)


@pytest.mark.parametrize("zero", [2, 3])
def test_a_parameter_smaller_than_dp_is_refused(zero):
    with pytest.raises(PassPreconditionError,
                       match=rf"ZeRO {zero}: parameter '\w+' has 12 elements, fewer than the 16"):
        api.simulate(topology="dgx-a100-x2", dp=16, zero=zero, **TINY)


def test_zero_1_keeps_small_parameters_whole_per_rank():
    # ZeRO 1 shards only the optimizer states: empty pieces are fine
    assert api.simulate(topology="dgx-a100-x2", dp=16, zero=1, **TINY).step_time_s > 0


def test_unequal_shards_are_refused_under_symmetry_only():
    with pytest.raises(PassPreconditionError, match=r"does not split evenly over dp 8"):
        api.simulate(topology="dgx-a100", dp=8, zero=1, symmetry=True, **TINY)
    assert api.simulate(topology="dgx-a100", dp=8, zero=1, **TINY).step_time_s > 0
