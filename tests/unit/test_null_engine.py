"""NullEngine: fixed tokens at once, with max_tokens, stop tokens, pauses and versions honoured."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.config import EngineConfig, ModelConfig, load_config
from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.server.factory import create_engine
from agentrl.server.null_engine import NULL_LOGPROB, NullEngine

TOKENS = [11, 12, 13, 14, 15]


def _engine(**overrides) -> NullEngine:
    cfg = EngineConfig(backend="null", null_token_ids=TOKENS, max_model_len=64, **overrides)
    engine = create_engine(ModelConfig(path="unused"), cfg)
    assert isinstance(engine, NullEngine)
    return engine


async def test_returns_fixed_tokens_logprobs_and_version():
    out = await _engine().generate("r", [1, 2, 3], SamplingParams(max_tokens=32))
    assert out.token_ids == TOKENS
    assert out.logprobs == [NULL_LOGPROB] * len(TOKENS)
    assert out.token_versions == [0] * len(TOKENS)
    assert (out.finish_reason, out.weight_version, out.num_prompt_tokens) == ("stop", 0, 3)


@pytest.mark.parametrize(
    ("sampling", "tokens", "finish"),
    [
        (SamplingParams(max_tokens=3), TOKENS[:3], "length"),
        (SamplingParams(max_tokens=12, ignore_eos=True), (TOKENS * 3)[:12], "length"),
        (SamplingParams(max_tokens=32, stop_token_ids=[13]), TOKENS[:3], "stop"),
    ],
)
async def test_honours_max_tokens_ignore_eos_and_stop_tokens(sampling, tokens, finish):
    out = await _engine().generate("r", [1, 2], sampling)
    assert (out.token_ids, out.finish_reason) == (tokens, finish)


async def test_response_is_cut_to_the_context_window():
    out = await _engine().generate("r", list(range(60)), SamplingParams(max_tokens=32))
    assert (out.token_ids, out.finish_reason) == (TOKENS[:4], "length")


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ([], SamplingParams(), "prompt_ids is empty"),
        (list(range(64)), SamplingParams(), "context window"),
        ([1], SamplingParams(max_tokens=0), "max_tokens must be > 0"),
    ],
)
async def test_bad_requests_get_clear_errors(prompt, sampling, message):
    with pytest.raises(RolloutError, match=message):
        await _engine().generate("r", prompt, sampling)


async def test_update_weights_bumps_the_version_tokens_carry():
    engine = _engine()
    await engine.update_weights([("w", torch.zeros(2))], version=7)
    out = await engine.generate("r", [1], SamplingParams())
    assert engine.weight_version == 7
    assert out.weight_version == 7 and out.token_versions == [7] * len(TOKENS)
    assert (await engine.stats())["weight_version"] == 7


async def test_pause_keep_holds_requests_until_resume_under_the_new_version():
    engine = _engine()
    await engine.pause(PauseMode.KEEP)
    held = asyncio.create_task(engine.generate("r", [1], SamplingParams()))
    await asyncio.sleep(0.05)
    assert not held.done()
    assert (await engine.stats())["num_waiting"] == 1
    await engine.update_weights([], version=3)
    await engine.resume()
    out = await asyncio.wait_for(held, 1)
    assert out.token_ids == TOKENS and out.token_versions == [3] * len(TOKENS)


async def test_pause_abort_ends_held_requests_with_abort():
    engine = _engine()
    await engine.pause(PauseMode.KEEP)
    held = asyncio.create_task(engine.generate("r", [1], SamplingParams()))
    await asyncio.sleep(0.05)
    await engine.pause(PauseMode.ABORT)
    out = await asyncio.wait_for(held, 1)
    assert (out.token_ids, out.finish_reason) == ([], "abort")
    await engine.resume()
    assert (await engine.generate("r2", [1], SamplingParams())).token_ids == TOKENS


async def test_abort_ends_a_held_request_and_ignores_unknown_ones():
    engine = _engine()
    assert await engine.abort("nothing") is None
    await engine.pause(PauseMode.WAIT)
    held = asyncio.create_task(engine.generate("r", [1], SamplingParams()))
    await asyncio.sleep(0.05)
    assert (await engine.abort("r")).finish_reason == "abort"
    assert (await asyncio.wait_for(held, 1)).finish_reason == "abort"


async def test_swap_weights_pauses_loads_and_resumes():
    engine = _engine()
    paused_s = await engine.swap_weights([[("w", torch.zeros(1))]], version=2)
    assert paused_s >= 0 and engine.weight_version == 2
    assert (await engine.stats())["paused"] is None


def test_config_selects_null_and_rejects_an_empty_response():
    cfg = load_config(None, ["server.engine.backend=null", "server.engine.null_token_ids=[4,5]"])
    assert cfg.server.engine.null_token_ids == [4, 5]
    with pytest.raises(ValueError, match="null_token_ids is empty"):
        NullEngine(ModelConfig(path="unused"), EngineConfig(backend="null", null_token_ids=[]))


async def test_a_script_answers_the_first_turn_not_yet_in_the_prompt():
    script = [[21, 22, 2], [31, 2], [41, 42, 2]]
    engine = _engine(null_script=script)
    sampling = SamplingParams(max_tokens=32)
    prompt = [1, 2, 3]
    for turn in script:
        out = await engine.generate(f"r{len(prompt)}", prompt, sampling)
        assert (out.token_ids, out.finish_reason) == (turn, "stop")
        prompt = [*prompt, *out.token_ids, 7, 8]  # the environment's tokens in between
    # Every turn is in the prompt: the last one repeats; turns out of order do not count.
    assert (await engine.generate("again", prompt, sampling)).token_ids == script[-1]
    out_of_order = [1, *script[1], *script[0]]
    assert (await engine.generate("swapped", out_of_order, sampling)).token_ids == script[1]


def test_a_script_with_an_empty_turn_is_refused():
    with pytest.raises(ValueError, match="null_script has an empty turn"):
        _engine(null_script=[[1], []])
