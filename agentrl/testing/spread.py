"""Mean, standard deviation and standard error of repeated measurements, as the
benchmarks report them beside every number."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
