"""``server.engine.backend=null`` behind the real Ray Serve deployment and affinity router."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import ray
import torch

from agentrl.core.types import SamplingParams
from agentrl.server.null_engine import NULL_LOGPROB
from agentrl.testing.serving import rollout_servers, tiny_serving_config

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TOKENS = [21, 22, 23, 24]


@pytest.fixture(scope="module")
async def client(tiny_checkpoint):
    cfg = tiny_serving_config(
        tiny_checkpoint,
        18795,
        ["server.engine.backend=null", f"server.engine.null_token_ids={TOKENS}"],
    )
    with rollout_servers(cfg) as client:
        yield client


async def test_null_replicas_answer_with_fixed_tokens_and_keep_sessions(client):
    outs = await asyncio.gather(
        *(client.generate(f"s{i % 8}", [1, 2, 3], SamplingParams(max_tokens=3)) for i in range(64))
    )
    assert all(o.token_ids == TOKENS[:3] and o.logprobs == [NULL_LOGPROB] * 3 for o in outs)
    by_session: dict[str, set[str]] = {}
    for i, out in enumerate(outs):
        by_session.setdefault(f"s{i % 8}", set()).add(out.replica_id)
    assert all(len(replicas) == 1 for replicas in by_session.values())
    assert len({r for replicas in by_session.values() for r in replicas}) == 2
    assert sum(s["requests"] for s in await client.stats()) == 64


async def test_pause_update_resume_reaches_every_null_replica(client):
    await client.pause("keep")
    held = asyncio.create_task(client.generate("held", [5], SamplingParams()))
    await asyncio.sleep(0.3)
    assert not held.done()
    await client.update_weights([("w", torch.zeros(2))], version=4)
    await client.resume()
    out = await asyncio.wait_for(held, 30)
    assert out.token_versions == [4] * len(TOKENS)
    assert [s["weight_version"] for s in await client.stats()] == [4, 4]


async def test_replicas_write_no_access_log_by_default(client):
    await client.generate("logged", [1], SamplingParams())
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    replica_logs = list(logs.glob("replica_rollout_RolloutServer_*.log"))
    assert replica_logs, f"no replica log in {logs}"
    assert not any("CALL generate" in p.read_text() for p in replica_logs)
