"""The sim-validation fit (agentrl.server.sim_fit): step recording and constant recovery."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from agentrl.server.config import EngineConfig
from agentrl.server.sim_fit import Measurement, StepLoad, fit_profile, simulate_batch
from agentrl.server.sim_profiles import get_profile

PROFILE = "smollm2-135m-cpu"
TRUTH = {"bw_efficiency": 0.6, "flops_efficiency": 0.35, "step_overhead_s": 0.031}
SHAPES = (  # requests, prompt tokens, response tokens
    (1, 16, 40),  # decode, bound by reading the weights
    (2, 900, 40),  # decode, weights plus a long context's KV
    (4, 16, 40),
    (32, 16, 24),  # decode, compute-bound
    (4, 256, 2),  # prefill
    (12, 96, 20),
)


def _config(overrides: dict[str, float] | None = None) -> EngineConfig:
    return EngineConfig(
        backend="sim",
        max_model_len=1024,
        max_num_seqs=32,
        sim={
            "profile": PROFILE,
            "profile_overrides": overrides or {},
            "kv_cache_tokens": 182 * 32,
            "max_num_batched_tokens": 4096,
            "response_length_median": 32,
            "response_length_p99": 192,
            "time_scale": 1e-4,
        },
    )


def _requests(count: int, prompt: int, response: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(3, 49152) for _ in range(prompt)], response) for _ in range(count)]


def test_simulate_batch_records_the_steps_the_engine_runs():
    requests = _requests(2, 40, 5, seed=0)
    busy, steps = asyncio.run(simulate_batch(_config(), requests))
    # One prefill step of both prompts samples each first token, then 4 decode steps.
    assert steps[0] == StepLoad(80, 80, 2 * (40 * 41 // 2))
    assert [s.tokens for s in steps[1:]] == [2, 2, 2, 2]
    assert [s.context_tokens for s in steps[1:]] == [82, 84, 86, 88]
    profile = get_profile(PROFILE)
    assert busy == pytest.approx(
        sum(profile.step_time(s.tokens, s.context_tokens, s.attention_pairs) for s in steps)
    )


def test_fit_recovers_known_constants_from_synthetic_batches():
    truth = get_profile(PROFILE).with_overrides(TRUTH)
    measurements = []
    for i, shape in enumerate(SHAPES):
        busy, steps = asyncio.run(simulate_batch(_config(TRUTH), _requests(*shape, seed=i)))
        seconds = math.fsum(
            truth.step_time(s.tokens, s.context_tokens, s.attention_pairs) for s in steps
        )
        assert seconds == pytest.approx(busy)  # the engine ran at the true constants
        measurements.append(Measurement(str(shape), tuple(steps), seconds))

    fit = fit_profile(get_profile(PROFILE), measurements)

    for key, value in TRUTH.items():
        assert fit.overrides()[key] == pytest.approx(value, rel=0.01), key
    assert max(abs(e) for e in fit.relative_errors) < 1e-3


def test_fit_under_noise_predicts_held_out_batches_within_the_noise():
    truth = get_profile(PROFILE).with_overrides(TRUTH)
    rng = random.Random(7)

    def measure(shape: tuple[int, int, int], seed: int, noise: float) -> Measurement:
        _, steps = asyncio.run(simulate_batch(_config(), _requests(*shape, seed=seed)))
        seconds = sum(truth.step_time(s.tokens, s.context_tokens, s.attention_pairs) for s in steps)
        return Measurement(str(shape), tuple(steps), seconds * rng.uniform(1 - noise, 1 + noise))

    calibration = [measure(shape, i, 0.03) for i, shape in enumerate(SHAPES)]
    fit = fit_profile(get_profile(PROFILE), calibration)
    assert 0 < max(abs(e) for e in fit.relative_errors) < 0.05

    fitted = get_profile(PROFILE).with_overrides(fit.overrides())
    for shape in ((16, 48, 30), (3, 600, 12), (24, 32, 8)):
        held_out = measure(shape, 100, 0.0)
        modeled = sum(
            fitted.step_time(s.tokens, s.context_tokens, s.attention_pairs) for s in held_out.steps
        )
        assert modeled == pytest.approx(held_out.seconds, rel=0.05), shape


def test_fit_rejects_no_measurements_and_empty_ones():
    profile = get_profile(PROFILE)
    with pytest.raises(ValueError, match="at least one measurement"):
        fit_profile(profile, [])
    with pytest.raises(ValueError, match="positive seconds"):
        fit_profile(profile, [Measurement("empty", (), 1.0)])
