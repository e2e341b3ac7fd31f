"""Mean, standard deviation and standard error of repeated measurements, as the
benchmarks report them beside every number."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


def mean_sd_se(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "sd", "se"}`` of ``values``: the sample standard deviation (n - 1) and
    the standard error of the mean, both 0 for a single value.

    Raises ``ValueError`` on an empty sequence (a mean of nothing is not 0).
    """
    if not values:
        raise ValueError("mean_sd_se of no values")
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "se": sd / math.sqrt(len(values))}


def paired_median_ratio(mine: Mapping[int, float], theirs: Mapping[int, float]) -> float:
    """The median, over the blocks both sides were measured in, of ``mine[block] ÷
    theirs[block]``.

    Two sides that take turns block by block share each block's stretch of machine time;
    a stall that hits one side's block moves one ratio of several, which the median sets
    aside, where a ratio of totals carries it. Raises ``ValueError`` when the two share
    no block.
    """
    shared = mine.keys() & theirs.keys()
    if not shared:
        raise ValueError("paired_median_ratio: the two sides share no block")
    return statistics.median(mine[block] / theirs[block] for block in shared)
