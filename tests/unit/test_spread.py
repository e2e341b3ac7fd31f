"""mean_sd_se: the spread the benchmarks print beside every number."""

import math
import statistics

import pytest

from agentrl.testing.spread import mean_sd_se, paired_median_ratio


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


def test_paired_median_ratio_sets_aside_a_stalled_block() -> None:
    mine = {0: 100.0, 1: 110.0, 2: 10.0, 3: 90.0}  # block 2 stalled
    theirs = {0: 1000.0, 1: 1100.0, 2: 1000.0, 3: 900.0}
    assert paired_median_ratio(mine, theirs) == pytest.approx(0.1)
    totals = sum(mine.values()) / sum(theirs.values())
    assert totals < 0.08  # the ratio of totals carries the stall


def test_paired_median_ratio_pairs_only_the_blocks_both_measured() -> None:
    # a side whose one round outlasts a block has fewer blocks
    assert paired_median_ratio({0: 2.0, 2: 4.0}, {0: 1.0, 1: 50.0, 2: 1.0}) == 3.0


def test_paired_median_ratio_without_a_shared_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="share no block"):
        paired_median_ratio({0: 1.0}, {1: 1.0})
