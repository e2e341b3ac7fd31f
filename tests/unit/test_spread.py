"""mean_sd_se: the spread the benchmarks print beside every number."""

import math
import statistics

import pytest

from agentrl.testing.spread import mean_sd_se


def test_mean_sd_se_matches_the_sample_statistics() -> None:
    values = [0.2, 0.5, 0.9, 0.4]
    stats = mean_sd_se(values)
    assert stats["mean"] == pytest.approx(0.5)
    assert stats["sd"] == pytest.approx(statistics.stdev(values))
    assert stats["se"] == pytest.approx(statistics.stdev(values) / 2.0)


def test_one_value_has_no_spread() -> None:
    assert mean_sd_se([3.0]) == {"mean": 3.0, "sd": 0.0, "se": 0.0}


def test_no_values_is_an_error_not_zero() -> None:
    with pytest.raises(ValueError, match="no values"):
        mean_sd_se([])


def test_se_shrinks_with_the_square_root_of_the_count() -> None:
    few = mean_sd_se([0.0, 1.0] * 2)
    many = mean_sd_se([0.0, 1.0] * 200)
    assert many["sd"] == pytest.approx(few["sd"], rel=0.2)
    assert many["se"] < few["se"] / 8
    assert math.isfinite(many["se"])
