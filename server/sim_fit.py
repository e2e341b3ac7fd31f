"""Fit a simulation profile's efficiencies and step overhead to measured batches.

A measured batch is a set of requests submitted at once to a real engine and the wall
seconds until the last one finished. ``simulate_batch`` replays the same requests on a
``SimEngine`` and records the load of every step its scheduler plans (tokens, context
tokens, attention pairs). Which steps the scheduler plans for such a batch does not depend
on the step times, so one replay per batch serves every candidate constant; the batch's
modeled time is then

    T(bw_eff, flops_eff, overhead) = sum over its steps of
        overhead + max(t_memory / bw_eff, t_compute / flops_eff) + t_allreduce

with ``t_memory`` and ``t_compute`` the roofline terms at peak
(``SimProfile.roofline_terms``). ``fit_profile`` minimizes the squared relative error
of T against the measured seconds: for given efficiencies the best overhead is a
closed-form least squares (clipped at 0), and the efficiencies come from a log-spaced
grid and a pattern search from its best points.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agentrl.core.config import ModelConfig
from agentrl.core.types import SamplingParams
from agentrl.server.config import EngineConfig
from agentrl.server.sim_engine import SimEngine
from agentrl.server.sim_profiles import SimProfile


@dataclass(frozen=True)
class StepLoad:
    """What one scheduler step computes and reads (``SimProfile.step_time``'s arguments)."""

    tokens: int
    context_tokens: int
    attention_pairs: int


@dataclass(frozen=True)
class Measurement:
    """One measured batch: the steps the simulated engine plans for it, the real seconds."""

    name: str
    steps: tuple[StepLoad, ...]
    seconds: float


@dataclass(frozen=True)
class Fit:
    """Fitted constants (``SimConfig.profile_overrides`` keys) and the fit's own errors."""

    bw_efficiency: float
    flops_efficiency: float
    step_overhead_s: float
    relative_errors: tuple[float, ...]
    """(modeled - measured) / measured of each measurement, in the order given."""

    def overrides(self) -> dict[str, float]:
        """The constants as ``server.engine.sim.profile_overrides``."""
        return {
            "bw_efficiency": self.bw_efficiency,
            "flops_efficiency": self.flops_efficiency,
            "step_overhead_s": self.step_overhead_s,
        }


@dataclass(frozen=True)
class RecordingProfile(SimProfile):
    """A profile that records the load of every step time it is asked for."""

    loads: list[StepLoad] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of(cls, profile: SimProfile) -> RecordingProfile:
        """``profile`` with an empty record."""
        fields = {f.name: getattr(profile, f.name) for f in dataclasses.fields(SimProfile)}
        return cls(**fields)

    def step_time(self, tokens: int, context_tokens: int, attention_pairs: int) -> float:
        """``SimProfile.step_time``, recorded."""
        self.loads.append(StepLoad(tokens, context_tokens, attention_pairs))
        return super().step_time(tokens, context_tokens, attention_pairs)


async def simulate_batch(
    engine: EngineConfig, requests: Sequence[tuple[list[int], int]]
) -> tuple[float, list[StepLoad]]:
    """Run ``requests`` (prompt ids, response tokens; submitted together, ``ignore_eos``)
    on a fresh ``SimEngine`` configured by ``engine`` (``backend=sim``); returns the modeled
    busy seconds and the load of every step it ran.

    Raises RuntimeError if the recorded steps do not add up to the engine's busy time (a
    decode run was cut short, so a planned step never ran).
    """
    sim = SimEngine(ModelConfig(path="sim"), engine)
    recorder = RecordingProfile.of(sim.profile)
    sim.profile = recorder
    try:
        await asyncio.gather(
            *(
                sim.generate(f"batch-{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True))
                for i, (prompt, n) in enumerate(requests)
            )
        )
        busy = (await sim.stats())["busy_s"]
    finally:
        await sim.shutdown()
    planned = math.fsum(
        SimProfile.step_time(recorder, s.tokens, s.context_tokens, s.attention_pairs)
        for s in recorder.loads
    )
    if not math.isclose(planned, busy, rel_tol=1e-9):
        raise RuntimeError(f"recorded steps add up to {planned} s, the engine was busy {busy} s")
    return busy, recorder.loads


class _Terms:
    """Every measurement's steps as flat arrays, for vectorized candidate evaluation."""

    def __init__(self, profile: SimProfile, measurements: Sequence[Measurement]) -> None:
        if not measurements:
            raise ValueError("fit_profile needs at least one measurement")
        terms = [
            (j, *profile.roofline_terms(s.tokens, s.context_tokens, s.attention_pairs))
            for j, m in enumerate(measurements)
            for s in m.steps
        ]
        if any(not m.steps for m in measurements) or any(m.seconds <= 0 for m in measurements):
            raise ValueError("every measurement needs steps and positive seconds")
        self.index = np.array([t[0] for t in terms])
        self.memory = np.array([t[1] for t in terms])
        self.compute = np.array([t[2] for t in terms])
        count = len(measurements)
        self.steps = np.bincount(self.index, minlength=count).astype(float)
        fixed = [profile.allreduce_time(s.tokens) for m in measurements for s in m.steps]
        self.fixed = np.bincount(self.index, weights=fixed, minlength=count)
        self.seconds = np.array([m.seconds for m in measurements])

    def modeled(self, bw: float, flops: float, overhead: float) -> np.ndarray:
        """Each measurement's modeled seconds under the given constants."""
        roof = np.maximum(self.memory / bw, self.compute / flops)
        count = len(self.seconds)
        return self.steps * overhead + self.fixed + np.bincount(self.index, roof, count)

    def best_overhead(self, bw: float, flops: float) -> tuple[float, float]:
        """The overhead minimizing the squared relative error at these efficiencies, and
        that error (sum of squares)."""
        base = self.modeled(bw, flops, 0.0)
        a = self.steps / self.seconds  # relative error = a * overhead + b
        b = (base - self.seconds) / self.seconds
        overhead = max(0.0, -float(a @ b) / float(a @ a))
        residual = a * overhead + b
        return overhead, float(residual @ residual)


def fit_profile(
    profile: SimProfile,
    measurements: Sequence[Measurement],
    *,
    bounds: tuple[float, float] = (1e-3, 10.0),
    points: int = 41,
    starts: int = 5,
    tolerance: float = 1e-7,
) -> Fit:
    """The ``bw_efficiency``, ``flops_efficiency`` and ``step_overhead_s`` of ``profile``
    that make its modeled batch times closest, in squared relative error, to the measured
    seconds. Efficiencies are searched within ``bounds``: a log grid of ``points`` per
    axis, then a pattern search in log space from each of its ``starts`` best points (a
    step to the best of the 8 neighbours while one improves, else half the step, down to
    ``tolerance``). An efficiency no measurement's steps depend on (e.g. FLOPs when no
    step is compute-bound) is not determined; give batches of both kinds.
    """
    terms = _Terms(profile, measurements)
    low, high = math.log(bounds[0]), math.log(bounds[1])

    def error(x: tuple[float, float]) -> float:
        if not (low <= x[0] <= high and low <= x[1] <= high):
            return math.inf
        return terms.best_overhead(math.exp(x[0]), math.exp(x[1]))[1]

    axis = np.linspace(low, high, points)
    grid = sorted((error((a, b)), (float(a), float(b))) for a in axis for b in axis)
    moves = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1) if i or j]
    best = (math.inf, (0.0, 0.0))
    for value, x in grid[:starts]:
        step = float(axis[1] - axis[0])
        while step > tolerance:
            value_next, x_next = min(
                (error((x[0] + i * step, x[1] + j * step)), (x[0] + i * step, x[1] + j * step))
                for i, j in moves
            )
            if value_next < value:
                value, x = value_next, x_next
            else:
                step /= 2
        best = min(best, (value, x))
    bw, fl = math.exp(best[1][0]), math.exp(best[1][1])
    overhead, _ = terms.best_overhead(bw, fl)
    modeled = terms.modeled(bw, fl, overhead)
    errors = (modeled - terms.seconds) / terms.seconds
    return Fit(bw, fl, overhead, tuple(float(e) for e in errors))
