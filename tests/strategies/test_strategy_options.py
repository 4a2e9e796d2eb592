"""Strategy options refuse bad values with one ConfigError naming the
option: non-finite numbers (NaN compares false with everything, so a
``< 0`` check alone lets it through), unknown choices, negative depths."""
import math

import pytest

from distsim.errors import ConfigError
from distsim.transforms.strategy import Strategy


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, True, "4"])
def test_bucket_mb_must_be_finite_and_non_negative(value):
    with pytest.raises(ConfigError, match=r"^--bucket-mb: must be a finite non-negative number"):
        Strategy(bucket_mb=value)


@pytest.mark.parametrize("fields, message", [
    (dict(prefetch=-1), "--prefetch: must be a non-negative integer, got -1"),
    (dict(prefetch=1.5), "--prefetch: must be a non-negative integer, got 1.5"),
    (dict(optimizer="adam"), "--optimizer: must be one of adamw, sgd, got 'adam'"),
    (dict(partition="cost"), "--partition: must be one of even, balanced, got 'cost'"),
    (dict(order="tp-dp"), "--order: must be one of tp-dp-pp"),
])
def test_new_options_name_themselves(fields, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        Strategy(**fields)


def test_good_values_pass():
    s = Strategy(bucket_mb=0.0, prefetch=0, optimizer="sgd", partition="balanced",
                 order="pp-dp-tp")
    assert s.to_dict()["order"] == "pp-dp-tp" and Strategy(bucket_mb=25).bucket_mb == 25
