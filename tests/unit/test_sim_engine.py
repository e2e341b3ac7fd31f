"""SimEngine: modeled step times, KV cache and preemption, prefix cache, lengths, pauses."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import statistics

import pytest
import torch

from agentrl.config import EngineConfig, ModelConfig, load_config
from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.server.factory import create_engine
from agentrl.server.null_engine import NULL_LOGPROB
from agentrl.server.sim_engine import LengthSampler, SimEngine
from agentrl.server.sim_profiles import PROFILES, get_profile

FAST = 1e-4  # wall seconds per modeled second: a 6 ms step sleeps 0.6 us
FILLER = [11, 12, 13]
EOS = 99


def _engine(*, time_scale: float = FAST, **overrides) -> SimEngine:
    sim = {"time_scale": time_scale, "token_ids": FILLER, "eos_token_id": EOS}
    sim |= overrides.pop("sim", {})
    cfg = EngineConfig(backend="sim", sim=sim, **({"max_model_len": 4096} | overrides))
    engine = create_engine(ModelConfig(path="unused"), cfg)
    assert isinstance(engine, SimEngine)
    return engine


def _fixed(length: int) -> dict:
    """A length distribution with every response ``length`` tokens long."""
    return {"response_length_median": length, "response_length_p99": length}


# -- step-time model -------------------------------------------------------------------------


def test_kv_bytes_per_token_and_capacity_follow_the_model_shapes():
    names = ("qwen2.5-7b-h100", "llama3.1-8b-h200", "qwen2.5-32b-tp4-h100")
    qwen7, llama8, qwen32 = (PROFILES[n] for n in names)
    assert qwen7.model.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    assert llama8.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert qwen32.kv_bytes_per_token_per_gpu == 2 * 64 * 8 * 128 * 2 / 4
    expected = (80e9 * 0.9 - 7.61e9 * 2 - 3e9) // 57_344
    assert qwen7.kv_cache_tokens(0.9) == expected


def test_step_time_is_the_roofline_of_the_docs():
    p = get_profile("qwen2.5-7b-h100")
    # One decoding sequence at context 1000: bandwidth-bound, weights + KV read once.
    memory = (7.61e9 * 2 + 57_344 * 1000) / (3.35e12 * 0.85)
    assert p.step_time(1, 1000, 1000) == pytest.approx(1e-3 + memory, rel=1e-12)
    # An 8192-token prefill chunk from position 0: compute-bound, linear + attention FLOPs.
    pairs = 8192 * 8193 // 2
    flops = 2 * 7.61e9 * 8192 + 2 * 28 * 28 * 128 * pairs
    assert p.step_time(8192, 8192, pairs) == pytest.approx(
        1e-3 + flops / (989.4e12 * 0.5), rel=1e-12
    )
    # Tensor parallel: a quarter of the bytes per GPU, plus two all-reduces per layer.
    tp4 = get_profile("qwen2.5-32b-tp4-h100")
    memory = (32.5e9 * 2 + 262_144 * 64) / 4 / (3.35e12 * 0.85)
    allreduce = 2 * 64 * (8e-6 + 1 * 5120 * 2 * 2 * 3 / 4 / 450e9)
    assert tp4.step_time(1, 64, 64) == pytest.approx(1e-3 + memory + allreduce, rel=1e-12)


def test_decode_throughput_rises_with_batch_size_then_saturates():
    p = get_profile("llama3.1-8b-h200")
    ctx = 1024

    def tokens_per_s(batch: int) -> float:
        return batch / p.step_time(batch, batch * ctx, batch * ctx)

    rates = [tokens_per_s(2**k) for k in range(13)]  # 1 .. 4096 sequences
    assert all(b > a for a, b in itertools.pairwise(rates))
    assert rates[1] / rates[0] > 1.9  # weight-bandwidth-bound: a second sequence is nearly free
    # Saturated: every token's step share approaches reading its KV context.
    ceiling = 4.8e12 * 0.85 / (131_072 * ctx)
    assert rates[-1] / rates[-2] < 1.05 and 0.9 * ceiling < rates[-1] < ceiling


async def test_a_lone_request_costs_its_prefill_step_then_one_step_per_token():
    engine = _engine(sim=_fixed(50))
    out = await engine.generate("r", list(range(1, 101)), SamplingParams(max_tokens=500))
    p = engine.profile
    expected = p.step_time(100, 100, 100 * 101 // 2)
    expected += sum(p.step_time(1, 100 + k, 100 + k) for k in range(1, 50))
    stats = await engine.stats()
    assert len(out.token_ids) == 50 and stats["steps"] == 50
    assert stats["busy_s"] == pytest.approx(expected, rel=1e-9)
    assert out.metrics["sim_latency_s"] >= expected


async def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks():
    engine = _engine(sim={"max_num_batched_tokens": 64, **_fixed(1)})
    await engine.generate("r", list(range(1, 201)), SamplingParams())
    p = engine.profile
    chunks = [(0, 64), (64, 64), (128, 64), (192, 8)]  # (tokens before, tokens computed)
    expected = sum(p.step_time(n, c + n, n * c + n * (n + 1) // 2) for c, n in chunks)
    stats = await engine.stats()
    assert stats["steps"] == 4 and stats["computed_tokens"] == 200
    assert stats["busy_s"] == pytest.approx(expected, rel=1e-9)


async def test_engine_throughput_rises_with_concurrency():
    async def rate(concurrency: int) -> float:
        engine = _engine(sim=_fixed(64))
        prompts = [[i + 1] * 32 for i in range(concurrency)]
        await asyncio.gather(
            *[engine.generate(f"r{i}", p, SamplingParams()) for i, p in enumerate(prompts)]
        )
        stats = await engine.stats()
        return stats["generated_tokens"] / stats["busy_s"]

    one, eight, sixty_four = await rate(1), await rate(8), await rate(64)
    assert eight > 5 * one and sixty_four > 4 * eight


async def test_time_scale_sleeps_a_fraction_of_modeled_time_and_stats_report_modeled():
    engine = _engine(time_scale=0.01, sim=_fixed(100))
    loop = asyncio.get_running_loop()
    start = loop.time()
    await engine.generate("r", [1, 2, 3], SamplingParams(max_tokens=500))
    wall = loop.time() - start
    busy = (await engine.stats())["busy_s"]
    assert busy > 0.5  # 100 steps of ~6 ms
    assert 0.01 * busy <= wall < busy


# -- KV cache, preemption, prefix cache ------------------------------------------------------


async def test_kv_exhaustion_preempts_and_every_request_still_completes():
    # 16 blocks of 16 tokens; 8 requests of 40 + 60 tokens need 7 blocks each.
    engine = _engine(block_size=16, max_model_len=128, sim={"kv_cache_tokens": 256, **_fixed(60)})
    prompts = [[i + 1] * 40 for i in range(8)]
    outs = await asyncio.gather(
        *[engine.generate(f"r{i}", p, SamplingParams(max_tokens=80)) for i, p in enumerate(prompts)]
    )
    stats = await engine.stats()
    assert stats["preemptions"] > 0
    assert stats["computed_tokens"] > 8 * (40 + 59)  # preempted tokens were computed again
    assert all(o.token_ids == [*(FILLER * 20)[:59], EOS] for o in outs)
    assert all(o.finish_reason == "stop" for o in outs)
    assert (stats["num_running"], stats["num_waiting"], stats["kv_cache_usage"]) == (0, 0, 0.0)


async def test_a_prompt_extending_an_earlier_one_prefills_only_the_uncached_tail():
    async def second_turn(caching: bool) -> tuple[int, float]:
        engine = _engine(block_size=16, enable_prefix_caching=caching, sim=_fixed(40))
        prompt = list(range(100, 300))  # 200 tokens
        first = await engine.generate("a", prompt, SamplingParams())
        before = (await engine.stats())["busy_s"]
        turn = [*prompt, *first.token_ids, 7, 8, 9]
        out = await engine.generate("b", turn, SamplingParams())
        return out.num_cached_tokens, (await engine.stats())["busy_s"] - before

    cached, with_cache = await second_turn(True)
    # The first request computed 200 + 39 tokens (its last token is sampled, not computed).
    assert cached == (200 + 39) // 16 * 16 == 224
    uncached, without_cache = await second_turn(False)
    assert uncached == 0 and with_cache < without_cache


async def test_reset_prefix_cache_drops_the_cached_blocks():
    engine = _engine(block_size=16, sim=_fixed(8))
    prompt = list(range(1, 65))
    await engine.generate("a", prompt, SamplingParams())
    assert (await engine.generate("b", prompt, SamplingParams())).num_cached_tokens == 48
    await engine.reset_prefix_cache()
    assert (await engine.generate("c", prompt, SamplingParams())).num_cached_tokens == 0
    stats = await engine.stats()
    assert stats["cached_prompt_tokens"] == 48 and stats["prompt_tokens"] == 3 * 64


# -- response lengths and tokens -------------------------------------------------------------


def test_lognormal_lengths_match_the_median_and_p99():
    sampler = LengthSampler(median=300, p99=3000)
    assert sampler.sigma == pytest.approx(math.log(10) / 2.3263, rel=1e-4)
    rng = random.Random(7)
    draws = [sampler.draw(rng) for _ in range(20_000)]
    ordered = sorted(draws)
    assert statistics.median(ordered) == pytest.approx(300, rel=0.05)
    assert ordered[int(0.99 * len(ordered))] == pytest.approx(3000, rel=0.1)
    again = random.Random(7)
    assert [sampler.draw(again) for _ in range(100)] == draws[:100]


async def test_seeded_lengths_are_reproducible_across_engines():
    async def lengths(seed: int) -> list[int]:
        engine = _engine(seed=seed, sim={"response_length_median": 50})
        outs = [await engine.generate(f"r{i}", [1, 2], SamplingParams()) for i in range(20)]
        return [len(o.token_ids) for o in outs]

    first = await lengths(3)
    assert first == await lengths(3) and first != await lengths(4)
    assert len(set(first)) > 5
    # A request's own seed fixes its length whatever the engine drew before.
    a, b = _engine(), _engine()
    await a.generate("warm", [1], SamplingParams())
    seeded = SamplingParams(seed=11)
    assert (await a.generate("x", [1], seeded)).token_ids == (
        await b.generate("x", [1], seeded)
    ).token_ids


@pytest.mark.parametrize("jsonl", [False, True])
async def test_a_length_trace_supplies_the_lengths(tmp_path, jsonl):
    path = tmp_path / ("t.jsonl" if jsonl else "t.json")
    if jsonl:
        path.write_text('5\n{"length": 9}\n\n')
    else:
        path.write_text(json.dumps([5, 9]))
    engine = _engine(sim={"length_trace": str(path)})
    outs = [await engine.generate(f"r{i}", [1], SamplingParams()) for i in range(20)]
    assert {len(o.token_ids) for o in outs} == {5, 9}


@pytest.mark.parametrize(
    ("prompt", "sampling", "tokens", "finish"),
    [
        ([1, 2], SamplingParams(max_tokens=500), [11, 12, 13, 11, EOS], "stop"),
        ([1, 2], SamplingParams(max_tokens=3), [11, 12, 13], "length"),
        ([1, 2], SamplingParams(max_tokens=7, ignore_eos=True), (FILLER * 3)[:7], "length"),
        ([1, 2], SamplingParams(stop_token_ids=[42, 43]), [11, 12, 13, 11, 42], "stop"),
        (list(range(4093)), SamplingParams(max_tokens=500), [11, 12, 13], "length"),
    ],
)
async def test_responses_end_with_the_stop_id_or_at_the_limit(prompt, sampling, tokens, finish):
    out = await _engine(sim=_fixed(5)).generate("r", prompt, sampling)
    assert (out.token_ids, out.finish_reason) == (tokens, finish)
    assert out.logprobs == [NULL_LOGPROB] * len(tokens)
    assert out.token_versions == [0] * len(tokens) and out.num_prompt_tokens == len(prompt)


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ([], SamplingParams(), "prompt_ids is empty"),
        (list(range(4096)), SamplingParams(), "context window"),
        ([1], SamplingParams(max_tokens=0), "max_tokens must be > 0"),
    ],
)
async def test_bad_requests_get_clear_errors(prompt, sampling, message):
    with pytest.raises(RolloutError, match=message):
        await _engine().generate("r", prompt, sampling)


async def test_a_request_id_in_flight_is_refused():
    engine = _engine(time_scale=0.01, sim=_fixed(1000))
    first = asyncio.create_task(engine.generate("r", [1], SamplingParams(max_tokens=2000)))
    await asyncio.sleep(0.01)
    with pytest.raises(RolloutError, match="already in flight"):
        await engine.generate("r", [1], SamplingParams())
    await engine.abort("r")
    assert (await first).finish_reason == "abort"


# -- pauses, aborts, versions ----------------------------------------------------------------

SLOW = 0.05  # a 1000-token response lasts ~0.3 s wall


async def _in_flight(engine: SimEngine, request_id: str = "r") -> asyncio.Task:
    task = asyncio.create_task(engine.generate(request_id, [1, 2], SamplingParams(max_tokens=2000)))
    await asyncio.sleep(0.05)
    assert not task.done()
    return task


async def test_pause_keep_freezes_in_flight_work_and_later_tokens_carry_the_new_version():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    task = await _in_flight(engine)
    await engine.pause(PauseMode.KEEP)
    frozen = await engine.stats()
    await asyncio.sleep(0.1)
    assert not task.done()
    assert (await engine.stats())["steps"] == frozen["steps"] and frozen["paused"] == "keep"
    held = asyncio.create_task(engine.generate("new", [5], SamplingParams(max_tokens=3)))
    await asyncio.sleep(0.02)
    assert not held.done() and (await engine.stats())["num_waiting"] == 1
    await engine.update_weights([("w", torch.zeros(1))], version=3)
    await engine.resume()
    out = await asyncio.wait_for(task, 5)
    assert len(out.token_ids) == 1000 and out.weight_version == 3
    old = out.token_versions.count(0)
    assert 0 < old < 1000 and out.token_versions == [0] * old + [3] * (1000 - old)
    assert (await asyncio.wait_for(held, 5)).token_versions == [3] * 3


async def test_pause_abort_ends_in_flight_and_held_requests_with_their_tokens():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    task = await _in_flight(engine)
    await engine.pause(PauseMode.ABORT)
    out = await asyncio.wait_for(task, 1)
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 1000
    assert out.token_ids == (FILLER * 400)[: len(out.token_ids)]
    held = asyncio.create_task(engine.generate("later", [1], SamplingParams(max_tokens=4)))
    await asyncio.sleep(0.02)
    assert not held.done()
    await engine.resume()
    assert (await asyncio.wait_for(held, 5)).finish_reason == "length"
    stats = await engine.stats()
    assert stats["aborted"] == 1 and stats["kv_cache_usage"] == 0.0


async def test_pause_wait_returns_once_in_flight_requests_finished():
    engine = _engine(time_scale=SLOW, sim=_fixed(300))
    task = await _in_flight(engine)
    await engine.pause(PauseMode.WAIT)
    assert (await engine.stats())["num_running"] == 0
    assert len((await asyncio.wait_for(task, 0.05)).token_ids) == 300
    held = asyncio.create_task(engine.generate("later", [1], SamplingParams(max_tokens=4)))
    await asyncio.sleep(0.02)
    assert not held.done()
    await engine.resume()
    assert len((await asyncio.wait_for(held, 5)).token_ids) == 4


async def test_abort_returns_the_partial_output_and_ignores_unknown_requests():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    assert await engine.abort("nothing") is None
    task = await _in_flight(engine)
    out = await engine.abort("r")
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 1000
    assert (await task).token_ids == out.token_ids
    await engine.pause(PauseMode.KEEP)
    held = asyncio.create_task(engine.generate("h", [1], SamplingParams()))
    await asyncio.sleep(0.01)
    assert (await engine.abort("h")).token_ids == []
    assert (await asyncio.wait_for(held, 1)).finish_reason == "abort"


async def test_a_request_arriving_mid_decode_is_admitted_at_the_next_step():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    long = await _in_flight(engine)
    short = await asyncio.wait_for(engine.generate("s", [3], SamplingParams(max_tokens=5)), 1)
    assert len(short.token_ids) == 5 and not long.done()
    await engine.abort("r")


async def test_swap_weights_pauses_loads_resets_the_cache_and_resumes():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    task = await _in_flight(engine)
    paused_s = await engine.swap_weights([[("w", torch.zeros(1))]], version=2)
    stats = await engine.stats()
    assert paused_s >= 0 and engine.weight_version == 2 and stats["paused"] is None
    assert stats["reset_preemptions"] == 1  # the running sequence recomputes, as in vLLM
    out = await asyncio.wait_for(task, 5)
    assert out.token_versions[0] == 0 and out.token_versions[-1] == 2


async def test_update_weights_refuses_names_that_are_not_strings():
    with pytest.raises(RolloutError, match="weight names must be strings"):
        await _engine().update_weights([(3, torch.zeros(1))], version=1)


async def test_shutdown_aborts_in_flight_requests_and_refuses_new_ones():
    engine = _engine(time_scale=SLOW, sim=_fixed(1000))
    task = await _in_flight(engine)
    await engine.shutdown()
    assert (await asyncio.wait_for(task, 1)).finish_reason == "abort"
    with pytest.raises(RuntimeError, match="shut down"):
        await engine.generate("again", [1], SamplingParams())


async def test_stats_count_busy_and_idle_modeled_time():
    engine = _engine(time_scale=0.01, sim=_fixed(20))
    await asyncio.sleep(0.02)
    await engine.generate("r", [1], SamplingParams())
    stats = await engine.stats()
    assert stats["backend"] == "sim" and stats["profile"] == "qwen2.5-7b-h100"
    assert stats["idle_s"] >= 2.0  # 0.02 s wall at time_scale 0.01
    assert stats["busy_s"] > 0 and stats["steps"] == 20
    assert stats["modeled_s"] >= stats["busy_s"]


# -- configuration and bad input -------------------------------------------------------------


def test_config_selects_the_sim_engine_through_create_engine():
    cfg = load_config(
        None,
        [
            "server.engine.backend=sim",
            "server.engine.sim.profile=llama3.1-8b-h200",
            "server.engine.sim.profile_overrides={step_overhead_s: 0.002}",
        ],
    )
    engine = create_engine(ModelConfig(path="unused"), cfg.server.engine)
    assert isinstance(engine, SimEngine)
    assert engine.profile.gpu.name.startswith("H200") and engine.profile.step_overhead_s == 0.002


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"sim": {"profile": "gpt-9"}}, "unknown simulation profile 'gpt-9'; available: qwen2.5"),
        ({"sim": {"kv_cache_tokens": 1000}}, "holds 992 tokens .* less than one max_model_len"),
        ({"max_model_len": 1_000_000}, "less than one max_model_len=1000000"),
        ({"sim": {"response_length_p99": 5000}}, "response_length_p99=5000 exceeds the 4095"),
        (
            {"sim": {"response_length_median": 900, "response_length_p99": 800}},
            "response_length_median=900 is above response_length_p99=800",
        ),
        ({"sim": {"response_length_median": 0}}, "response_length_median"),
        ({"sim": {"time_scale": 0}}, "time_scale"),
        ({"sim": {"token_ids": [1, 0]}}, "eos_token_id=0 is also in token_ids"),
        ({"sim": {"profile_overrides": {"bw": 1.0}}}, "unknown keys \\['bw'\\]"),
        ({"sim": {"profile_overrides": {"bw_efficiency": 0.0}}}, "bw_efficiency=0.0 must be > 0"),
    ],
)
def test_bad_configs_name_the_wrong_value(engine, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(backend="sim", max_model_len=engine.pop("max_model_len", 4096), **engine)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[5, 5000]", "entry 1 is 5000 tokens, more than the 4095"),
        ("[5, 0]", "entry 1 \\(0\\) is not a positive length"),
        ("[]", "holds no lengths"),
        ("5\nnot json\n", "neither JSON nor JSONL"),
    ],
)
def test_bad_length_traces_are_refused_at_construction(tmp_path, content, message):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        _engine(sim={"length_trace": str(path)})
    with pytest.raises(ValueError, match="cannot be read"):
        _engine(sim={"length_trace": str(tmp_path / "missing.json")})
