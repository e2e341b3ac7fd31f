"""HFEngine batching, prefix caching and failure isolation, on the tiny checkpoint."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrl.config import EngineConfig, ModelConfig
from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.server import hf_sampling
from agentrl.server.hf_engine import HFEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _engine(checkpoint, **overrides) -> HFEngine:
    cfg = EngineConfig(backend="hf", max_model_len=256, **overrides)
    return HFEngine(ModelConfig(path=str(checkpoint)), cfg)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 700) for _ in range(n)] for n in lengths]


@pytest.fixture
async def engine(tiny_checkpoint):
    eng = _engine(tiny_checkpoint, hf_prefix_cache_entries=0)
    yield eng
    await eng.shutdown()


async def _one_at_a_time(engine, prompts, sampling):
    return [await engine.generate(f"solo-{i}", p, sampling) for i, p in enumerate(prompts)]


async def _all_at_once(engine, prompts, sampling):
    calls = [engine.generate(f"batch-{i}", p, sampling) for i, p in enumerate(prompts)]
    return await asyncio.gather(*calls)


def _assert_same(solo, batched) -> None:
    for a, b in zip(solo, batched, strict=True):
        assert b.token_ids == a.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


async def test_concurrent_greedy_matches_one_at_a_time(engine):
    prompts = _prompts([1, 5, 17, 40, 3, 90])
    solo = await _one_at_a_time(engine, prompts, GREEDY)
    batched = await _all_at_once(engine, prompts, GREEDY)
    _assert_same(solo, batched)
    stats = await engine.stats()
    assert stats["decode_rows"] > stats["decode_steps"], "requests were never decoded together"


async def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    sampling = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=3)
    prompts = _prompts([4, 30, 11, 60], seed=1)
    solo = await _one_at_a_time(engine, prompts, sampling)
    batched = await _all_at_once(engine, prompts, sampling)
    _assert_same(solo, batched)


async def test_requests_joining_a_running_batch_match_solo(engine):
    prompts = _prompts([8, 25, 50], seed=2)
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    solo_long = await engine.generate("solo-long", prompts[0], long)
    solo = await _one_at_a_time(engine, prompts[1:], GREEDY)
    first = asyncio.create_task(engine.generate("long", prompts[0], long))
    await asyncio.sleep(0.03)  # the long request is decoding when the others join
    joined = await _all_at_once(engine, prompts[1:], GREEDY)
    _assert_same([solo_long, *solo], [await first, *joined])


async def test_request_failing_mid_batch_does_not_affect_others(engine, monkeypatch):
    prompts = _prompts([6, 20, 35], seed=3)
    solo = await _one_at_a_time(engine, prompts, GREEDY)
    bad = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    calls = {"bad": 0}
    real_sample = hf_sampling.sample_token

    def flaky_sample(logits, sampling, generator):
        if sampling is bad:
            calls["bad"] += 1
            if calls["bad"] == 4:
                raise RuntimeError("injected sampling failure")
        return real_sample(logits, sampling, generator)

    monkeypatch.setattr(hf_sampling, "sample_token", flaky_sample)
    results = await asyncio.gather(
        engine.generate("ok-0", prompts[0], GREEDY),
        engine.generate("bad", _prompts([10], seed=9)[0], bad),
        engine.generate("ok-1", prompts[1], GREEDY),
        engine.generate("ok-2", prompts[2], GREEDY),
        return_exceptions=True,
    )
    assert isinstance(results[1], RuntimeError)
    _assert_same(solo, [results[0], *results[2:]])
    assert (await engine.stats())["failed_requests"] == 1
    again = await engine.generate("after", prompts[0], GREEDY)
    assert again.token_ids == solo[0].token_ids


async def test_prefix_cache_hits_are_exact(tiny_checkpoint):
    engine = _engine(tiny_checkpoint, hf_prefix_cache_entries=4)
    try:
        prompt = _prompts([40], seed=4)[0]
        first = await engine.generate("t1", prompt, GREEDY)
        assert first.num_cached_tokens == 0
        # Cached: the prompt and every generated token but the last (never fed back).
        turn2 = prompt + first.token_ids + [7, 8, 9]
        second = await engine.generate("t2", turn2, GREEDY)
        assert second.num_cached_tokens == len(prompt) + len(first.token_ids) - 1
        assert second.token_ids == (await _fresh(tiny_checkpoint, turn2)).token_ids
        # A prompt fully cached still recomputes its last token to get logits.
        same = await engine.generate("same", prompt, GREEDY)
        assert same.num_cached_tokens == len(prompt) - 1
        assert same.token_ids == first.token_ids
        diverging = await engine.generate("div", [*prompt[:25], 1, 2, 3], GREEDY)
        assert diverging.num_cached_tokens == 25
        await engine.reset_prefix_cache()
        assert (await engine.generate("after-reset", prompt, GREEDY)).num_cached_tokens == 0
    finally:
        await engine.shutdown()


async def _fresh(checkpoint, prompt):
    engine = _engine(checkpoint, hf_prefix_cache_entries=0)
    try:
        return await engine.generate("fresh", prompt, GREEDY)
    finally:
        await engine.shutdown()


async def test_prefix_cache_is_lru_and_dropped_by_weight_updates(tiny_checkpoint):
    engine = _engine(tiny_checkpoint, hf_prefix_cache_entries=1)
    try:
        a, b = _prompts([30, 30], seed=5)
        await engine.generate("a", a, GREEDY)
        await engine.generate("b", b, GREEDY)  # evicts a
        assert (await engine.generate("a2", a, GREEDY)).num_cached_tokens == 0
        assert (await engine.generate("a3", a, GREEDY)).num_cached_tokens == len(a) - 1
        state = list(engine._model.state_dict().items())
        await engine.update_weights(state, 1)
        after = await engine.generate("a4", a, GREEDY)
        assert after.num_cached_tokens == 0
        assert after.token_versions == [1] * len(after.token_ids)
    finally:
        await engine.shutdown()


async def test_stop_tokens_and_context_clamp(engine):
    prompt = _prompts([20], seed=6)[0]
    free = await engine.generate("free", prompt, GREEDY)
    stop_at = free.token_ids[3]
    stopped = await engine.generate(
        "stopped", prompt, SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_at])
    )
    cut = free.token_ids.index(stop_at) + 1
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]
    near_limit = _prompts([250], seed=7)[0]
    clamped = await engine.generate("clamped", near_limit, GREEDY)
    assert clamped.finish_reason == "length"
    assert len(clamped.token_ids) == 256 - 250


async def test_held_request_can_be_aborted_and_duplicate_ids_rejected(engine):
    prompt = _prompts([10], seed=8)[0]
    await engine.pause(PauseMode.KEEP)
    held = asyncio.create_task(engine.generate("held", prompt, GREEDY))
    await asyncio.sleep(0.02)
    with pytest.raises(RolloutError, match="already in flight"):
        await engine.generate("held", prompt, GREEDY)
    partial = await engine.abort("held")
    out = await held
    assert out.finish_reason == "abort" and out.token_ids == []
    assert partial is not None and partial.token_ids == []
    await engine.resume()
    assert len((await engine.generate("resumed", prompt, GREEDY)).token_ids) == 12


async def test_event_loop_stays_responsive_while_decoding(engine):
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    beat = asyncio.create_task(heartbeat())
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    await _all_at_once(engine, _prompts([5, 9, 13, 17], seed=9), long)
    beat.cancel()
    assert ticks >= 10


async def test_cancel_and_pause_abort_free_the_batch(engine):
    long = SamplingParams(max_tokens=200, temperature=1.0, ignore_eos=True)
    prompts = _prompts([5, 15, 25], seed=10)
    cancelled = asyncio.create_task(engine.generate("cancelled", prompts[0], long))
    running = [
        asyncio.create_task(engine.generate(f"r{i}", p, long)) for i, p in enumerate(prompts)
    ]
    await asyncio.sleep(0.05)
    cancelled.cancel()
    await engine.pause(PauseMode.ABORT)
    outs = [t.result() for t in running]  # pause(abort) returns once they all ended
    assert all(o.finish_reason == "abort" and 0 < len(o.token_ids) < 200 for o in outs)
    held = asyncio.create_task(engine.generate("held", prompts[0], GREEDY))
    await asyncio.sleep(0.02)
    stats = await engine.stats()
    assert (stats["num_running"], stats["num_waiting"]) == (0, 1)
    await engine.resume()
    assert len((await held).token_ids) == 12
