"""Real Ray Serve + real vLLM (CPU build): 2 rollout replicas behind the affinity router.

One Ray start and one deployment are shared by the whole module; the replica-kill test
runs last because Serve restarts the killed replica. AGENTRL_SERVING_BACKEND=hf runs the
same tests on HFEngine replicas (fast, for debugging the serving layer).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.core.types import PauseMode, RolloutError, SamplingParams
from agentrl.server.weight_transport.object_store import ObjectStoreSync
from agentrl.testing.serving import rollout_servers, tiny_serving_config

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint):
    backend = os.environ.get("AGENTRL_SERVING_BACKEND", "vllm")
    return tiny_serving_config(
        tiny_checkpoint,
        18765,
        [
            "server.max_retries=4",
            f"server.engine.backend={backend}",
            "server.engine.max_num_seqs=16",
        ],
    )


@pytest.fixture(scope="module")
async def client(cfg):
    with rollout_servers(cfg) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def hf_state(tiny_checkpoint):
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    return model.state_dict()


def _prompt(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


async def test_generate_returns_tokens_and_logprobs(client, tokenizer):
    out = await client.data.generate("s-basic", _prompt(tokenizer, "What is 3 + 4?"), GREEDY)
    assert len(out.token_ids) == len(out.logprobs) == 8
    assert out.replica_id
    assert out.token_versions == [0] * 8


async def test_second_turn_of_session_hits_same_replica_and_cache(client, tokenizer):
    turn1 = _prompt(tokenizer, "Tell me about the number water. " * 8)
    first = await client.data.generate("s-multi", turn1, GREEDY)
    turn2 = turn1 + first.token_ids + tokenizer.encode("<|im_end|>\n<|im_start|>user\nmore")
    second = await client.data.generate("s-multi", turn2, GREEDY)
    assert second.replica_id == first.replica_id
    assert second.num_cached_tokens > 0


async def test_concurrent_new_sessions_use_both_replicas(client, tokenizer):
    prompt = _prompt(tokenizer, "hello")
    slow = SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True)
    outs = await asyncio.gather(
        *(client.data.generate(f"s-spread-{i}", prompt, slow) for i in range(8))
    )
    assert len({o.replica_id for o in outs}) == 2


async def test_abort_returns_partial_output(client, tokenizer):
    long = SamplingParams(max_tokens=600, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(
        client.data.generate("s-abort", _prompt(tokenizer, "Count"), long, request_id="abort-me")
    )
    await asyncio.sleep(1.0)
    await client.control.abort("abort-me")
    out = await asyncio.wait_for(task, timeout=60)
    assert out.finish_reason == "abort"
    assert 0 < len(out.token_ids) < 600


async def test_update_weights_reaches_every_replica(client, tokenizer, hf_state):
    prompt = _prompt(tokenizer, "What is 40 + 2?")
    before = await client.data.generate(None, prompt, GREEDY)
    gen = torch.Generator().manual_seed(0)
    perturbed = [(n, t + 0.5 * torch.randn(t.shape, generator=gen)) for n, t in hf_state.items()]
    await ObjectStoreSync(client.control).push(perturbed, version=1)
    stats = await client.control.stats()
    assert sorted(s["weight_version"] for s in stats) == [1, 1]
    outs = await asyncio.gather(
        *(client.data.generate(f"s-upd-{i}", prompt, GREEDY) for i in range(4))
    )
    assert len({o.replica_id for o in outs}) == 2
    for out in outs:
        assert out.token_ids != before.token_ids
        assert out.token_versions == [1] * 8


async def test_pause_keep_update_resume_versions_tokens_old_then_new(client, tokenizer, hf_state):
    long = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(client.data.generate("s-keep", _prompt(tokenizer, "Go"), long))
    await asyncio.sleep(0.3)
    await client.control.pause(PauseMode.KEEP)
    await ObjectStoreSync(client.control).push(list(hf_state.items()), version=2)
    await client.control.resume()
    out = await asyncio.wait_for(task, timeout=120)
    assert out.finish_reason == "length"
    assert out.token_versions[0] == 1 and out.token_versions[-1] == 2
    assert out.token_versions == sorted(out.token_versions)


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ([], GREEDY, "empty"),
        ([5] * 1024, GREEDY, "context window"),
        ([5, 6], SamplingParams(max_tokens=0), "max_tokens"),
    ],
)
async def test_bad_request_gets_clear_error_and_replica_stays_up(
    client, tokenizer, prompt, sampling, message
):
    with pytest.raises(RolloutError, match=message):
        await client.data.generate("s-bad", prompt, sampling)
    ok = await client.data.generate("s-bad", _prompt(tokenizer, "fine?"), GREEDY)
    assert len(ok.token_ids) == 8


async def test_bad_weight_update_is_rejected_everywhere(client, hf_state):
    name = next(iter(hf_state))
    with pytest.raises(RolloutError, match="shape"):
        await ObjectStoreSync(client.control).push([(name, torch.zeros(2, 2))], version=99)
    assert all(s["weight_version"] == 2 for s in await client.control.stats())


async def test_object_store_sync_pushes_buckets_while_requests_are_in_flight(
    client, tokenizer, hf_state
):
    sync = ObjectStoreSync(client.control, bucket_bytes=64 * 1024)
    long = SamplingParams(max_tokens=1000, temperature=1.0, ignore_eos=True)
    task = asyncio.create_task(client.data.generate("s-sync", _prompt(tokenizer, "Go"), long))
    await asyncio.sleep(0.3)
    timings = await sync.push(hf_state.items(), version=3)
    out = await asyncio.wait_for(task, timeout=120)
    assert timings.num_buckets > 1
    assert timings.num_tensors == len(hf_state)
    assert 0 < timings.pause_s <= timings.total_s
    assert all(s["weight_version"] == 3 for s in await client.control.stats())
    assert out.token_versions[0] == 2 and out.token_versions[-1] == 3


async def test_killed_replica_in_flight_and_later_requests_complete(client, tokenizer):
    long = SamplingParams(max_tokens=900, temperature=1.0, ignore_eos=True)
    probe = await client.data.generate("s-victim", _prompt(tokenizer, "x"), GREEDY)
    victim = probe.replica_id
    failures_before = client.data.replica_failures
    in_flight = [
        asyncio.create_task(client.data.generate("s-victim", _prompt(tokenizer, f"y{i}"), long))
        for i in range(3)
    ]
    await asyncio.sleep(0.3)
    actor_name = next(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if victim in a["name"] and "SERVE_REPLICA" in a["name"]
    )
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
    outs = await asyncio.wait_for(asyncio.gather(*in_flight), timeout=300)
    assert all(len(o.token_ids) == 900 for o in outs)
    assert all(o.replica_id != victim for o in outs)
    later = await client.data.generate("s-victim", _prompt(tokenizer, "after"), GREEDY)
    assert later.replica_id != victim
    # The first in-flight request always sat on the victim, so at least one retry happened.
    assert client.data.replica_failures > failures_before
