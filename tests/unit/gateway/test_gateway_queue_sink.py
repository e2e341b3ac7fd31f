"""The queue sink: gateway sessions of free-running clients become trainer episodes.

The gateway app runs in the test's event loop (httpx ASGI transport) over a scripted
engine, with an in-process ``TrajectoryQueue`` behind a ``QueueSink``.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
import uvicorn

from agentrl.agent_loops.external import AgentEndpoint, ExternalAgentLoop
from agentrl.agent_loops.external_config import ExternalAgentConfig
from agentrl.config import RolloutConfig
from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import SamplingParams
from agentrl.rollout.queue import TrajectoryQueue
from agentrl.server.gateway.config import GatewayConfig
from agentrl.server.gateway.sessions import SessionStore
from agentrl.server.gateway.sink import (
    DEFAULT_QUEUE_NAME,
    InMemorySink,
    QueueSink,
    SessionInfo,
    load_sink,
)
from agentrl.testing.context import loop_context
from agentrl.testing.tools import ADD_TOOL_SCHEMA

MODEL = "tiny"
USER = {"role": "user", "content": "What is 2 + 40?"}


def _queue(group_size: int = 2) -> TrajectoryQueue:
    return TrajectoryQueue(
        batch_groups=1, group_size=group_size, max_staleness=1, max_concurrency=8
    )


@pytest.fixture
async def gateway(make_gateway):
    """``gateway(group_size) -> (queue, sink, http)``: the app over a queue sink."""
    clients = []

    def make(group_size: int = 2, **config):
        queue = _queue(group_size)
        sink = QueueSink(queue)
        _, _, test_client = make_gateway(sink=sink, **config)
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=test_client.app), base_url="http://gw"
        )
        clients.append(http)
        return queue, sink, http

    yield make
    for http in clients:
        await http.aclose()


def _openai(http: httpx.AsyncClient, session_id: str, group_id: str | None) -> openai.AsyncOpenAI:
    headers = {"x-session-id": session_id} | ({"x-group-id": group_id} if group_id else {})
    return openai.AsyncOpenAI(
        base_url="http://gw/v1", api_key="x", http_client=http, default_headers=headers
    )


async def _tool_conversation(http, session_id, group_id=None) -> None:
    """Two chat calls: the scripted model calls `add`, gets 42 back, then answers."""
    client = _openai(http, session_id, group_id)
    messages = [USER]
    first = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[ADD_TOOL_SCHEMA]
    )
    call = first.choices[0].message
    messages += [
        call.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "42"},
    ]
    await client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD_TOOL_SCHEMA])


async def test_finished_sessions_of_a_group_arrive_as_one_group_with_the_recorded_ids(gateway):
    queue, sink, http = gateway(group_size=2)
    await _tool_conversation(http, "free-a", group_id="task-7")
    await _tool_conversation(http, "free-b", group_id="task-7")
    recorded = {}
    for sid, reward in (("free-b", 0.0), ("free-a", 1.0)):
        recorded[sid] = (await http.get(f"/v1/sessions/{sid}")).json()["samples"]
        done = await http.post(f"/v1/sessions/{sid}/finish", json={"reward": reward})
        assert done.json()["group_id"] == "task-7" and not done.json()["managed"]
    batch = await queue.get_batch()
    (group,) = batch.groups
    assert [e.episode_id for e in group] == ["free-b", "free-a"]  # arrival order
    assert {e.group_id for e in group} == {"ext:task-7"} and all(e.external for e in group)
    for episode in group:
        (sample,) = recorded[episode.episode_id]
        (output,) = episode.outputs
        assert output.prompt_ids == sample["prompt_ids"]
        assert output.response_ids == sample["response_ids"]
        assert output.response_mask == sample["response_mask"]
        assert 0 in output.response_mask and output.num_turns == 3
        assert output.response_logprobs == sample["response_logprobs"]
        assert output.response_versions == sample["response_versions"]
    assert [o.reward for e in group for o in e.outputs] == [0.0, 1.0]
    assert batch.metrics["async/external_episodes"] == 2
    assert sink.sent == 2 and sink.held == 0


async def test_group_can_be_given_when_opening_or_finishing_and_must_not_change(gateway):
    queue, _, http = gateway(group_size=2)
    assert (await http.post("/v1/sessions/o-1", json={"group_id": "g"})).json()["group_id"] == "g"
    await _tool_conversation(http, "o-1")
    await _tool_conversation(http, "f-1")
    conflict = await http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [USER]},
        headers={"x-session-id": "o-1", "x-group-id": "other"},
    )
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "group_conflict"
    await http.post("/v1/sessions/o-1/finish", json={"reward": 1.0})
    await http.post("/v1/sessions/f-1/finish", json={"reward": 0.5, "group_id": "g"})
    (group,) = (await queue.get_batch()).groups
    assert [e.episode_id for e in group] == ["o-1", "f-1"]


async def test_bad_group_ids_are_400s(gateway):
    _, _, http = gateway()
    body = {"model": MODEL, "messages": [USER]}
    no_session = await http.post("/v1/chat/completions", json=body, headers={"x-group-id": "g"})
    assert no_session.status_code == 400 and "needs a session" in no_session.text
    bad = await http.post(
        "/v1/chat/completions", json=body, headers={"x-session-id": "s", "x-group-id": "a b"}
    )
    assert bad.status_code == 400
    assert (await http.post("/v1/sessions/s2", json={"group_id": "a/b"})).status_code == 400


async def test_ungrouped_session_is_refused_by_a_queue_of_groups_and_logged(gateway, caplog):
    queue, sink, http = gateway(group_size=2)
    await _tool_conversation(http, "lone")
    await http.post("/v1/sessions/lone/finish", json={"reward": 1.0})
    assert queue.metrics()["async/external_rejected_ungrouped"] == 1
    assert sink.sent == 1 and "refused session lone (ungrouped)" in caplog.text


async def test_ungrouped_session_is_its_own_group_when_groups_have_size_one(gateway):
    queue, _, http = gateway(group_size=1)
    await _tool_conversation(http, "lone")
    await http.post("/v1/sessions/lone/reward", json={"reward": 0.25})
    await http.post("/v1/sessions/lone/finish")
    (episode,) = (await queue.get_batch()).episodes
    assert (episode.episode_id, episode.group_id, episode.outputs[0].reward) == (
        "lone",
        "ext:lone",
        0.25,
    )


async def test_managed_sessions_are_skipped_by_the_queue_sink_but_not_by_memory(gateway):
    queue, sink, http = gateway(group_size=1)
    opened = await http.post("/v1/sessions/ep-1", json={"managed": True})
    assert opened.json()["managed"] and opened.json()["samples"] == []
    await _tool_conversation(http, "ep-1")
    trajectory = (await http.post("/v1/sessions/ep-1/finish", json={"reward": 1.0})).json()
    assert trajectory["managed"] and len(trajectory["samples"]) == 1
    assert sink.skipped == 1 and sink.sent == 0
    assert queue.pending_episode_ids() == [] and queue.metrics()["async/running"] == 0

    memory = InMemorySink()  # the in-memory sink keeps every session, as before
    store = SessionStore(memory, max_sessions=4, ttl_s=100.0)
    await store.open("ep-2", managed=True)
    await store.finish("ep-2")
    assert [item[0] for item in memory.drain()] == ["ep-2"]


async def test_finish_twice_and_expiry_deliver_a_session_once():
    queue = _queue(group_size=1)
    now = [0.0]
    store = SessionStore(QueueSink(queue), max_sessions=4, ttl_s=10.0, clock=lambda: now[0])
    await store.open("gone", group_id="g")
    now[0] = 20.0
    await store.sweep()  # expired: finished and sent (no calls: a failed episode)
    await store.finish("gone", reward=1.0)  # idempotent
    assert queue.pending_episode_ids() == ["gone"]
    assert queue.metrics()["async/failed_episodes"] == 1


class _FlakyQueue:
    """Refuses the first ``failures`` calls, as an actor that is not up yet would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.got: list[tuple] = []
        self.samples: list[list[AgentLoopOutput]] = []

    async def put_session(self, session_id, samples, reward, group_id):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("queue actor not found")
        self.got.append((session_id, reward, group_id))
        self.samples.append(samples)
        return "accepted"


async def test_sessions_are_held_while_the_queue_is_unreachable_and_sent_in_order(caplog):
    flaky = _FlakyQueue(failures=4)
    sink = QueueSink(flaky, capacity=2)
    sample = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3, 4],
        response_mask=[1, 0],
        response_logprobs=[-0.25, 0.0],
        response_versions=[3, -1],
        reward=1.0,
    )
    for session_id in "abcd":  # 4 failed deliveries: a, b in memory; c, d on disk
        await sink.put(session_id, [sample], 1.0, SessionInfo(group_id=f"g-{session_id}"))
    assert flaky.got == []
    assert sink.stats() == {"held": 4, "held_on_disk": 2, "spilled": 2, "sent": 0, "skipped": 0}
    spool = sink._spool.directory
    assert spool is not None and len(list(spool.glob("*.pkl"))) == 2
    # One warning for the outage, not one per session.
    assert sum("cannot deliver" in r.getMessage() for r in caplog.records) == 1

    await sink.put("e", [sample], 0.5, SessionInfo())  # the queue answers: all, in order
    assert [got[0] for got in flaky.got] == ["a", "b", "c", "d", "e"]
    assert flaky.got[2] == ("c", 1.0, "g-c")  # what went to disk came back as it was
    assert flaky.samples[2] == [sample]
    assert sink.stats()["held"] == 0 and sink.sent == 5
    assert not spool.exists()  # the spool's files are gone with the sessions
    assert await sink.flush()


def test_sink_specs():
    assert isinstance(load_sink("memory", 5), InMemorySink)
    default = load_sink("queue", 5, namespace="ns")
    assert isinstance(default, QueueSink) and default._name == DEFAULT_QUEUE_NAME
    assert load_sink("queue:my-q", 5)._name == "my-q"
    with pytest.raises(ValueError, match="queue:ACTOR_NAME"):
        load_sink("nonsense", 5)
    for bad in ("queue:", "queue:a b", "x:y:z"):
        with pytest.raises(ValueError):
            GatewayConfig(sink=bad)


# -- ExternalAgentLoop's own sessions are not put a second time ------------------------


async def _agent(row, endpoint: AgentEndpoint) -> float:
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    await client.chat.completions.create(model=endpoint.model, messages=row["prompt"])
    return 1.0


async def test_external_agent_loop_sessions_reach_the_trainer_once(make_gateway, tokenizer):
    queue = _queue(group_size=1)
    sink = QueueSink(queue)
    _, _, test_client = make_gateway(sink=sink)
    server = uvicorn.Server(
        uvicorn.Config(test_client.app, host="127.0.0.1", port=0, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        external = ExternalAgentConfig(
            entrypoint=f"{__name__}:_agent", gateway_url=f"http://127.0.0.1:{port}"
        )
        context = loop_context(tokenizer, config=RolloutConfig(external=external))
        (output,) = await ExternalAgentLoop(context).run({"prompt": [USER]}, SamplingParams())
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert output.reward == 1.0 and output.extra["session_id"] == context.session_id
    assert sink.skipped == 1 and sink.sent == 0  # the loop returns it; the sink did not
    assert queue.pending_episode_ids() == []


class _ActorLike:
    """Stands in for a Ray actor handle (``put_session.remote``)."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive
        self.got: list[str] = []

        async def remote(session_id, samples, reward, group_id):
            if not self.alive:
                raise RuntimeError("actor died")
            self.got.append(session_id)
            return "accepted"

        self.put_session = type("Method", (), {"remote": staticmethod(remote)})()


async def test_a_named_queue_is_looked_up_again_when_its_actor_is_gone(monkeypatch):
    import ray

    old, new = _ActorLike(alive=False), _ActorLike(alive=True)
    lookups = []
    monkeypatch.setattr(
        ray, "get_actor", lambda name, namespace=None: lookups.append((name, namespace)) or new
    )
    sink = QueueSink("q", namespace="ns")
    sink._queue = old  # the previous run's queue, killed since
    await sink.put("s", [], 1.0, SessionInfo())
    assert new.got == ["s"] and lookups == [("q", "ns")] and sink.held == 0


async def test_the_store_sweep_retries_held_sessions():
    flaky = _FlakyQueue(failures=1)
    now = [0.0]
    store = SessionStore(QueueSink(flaky), max_sessions=4, ttl_s=100.0, clock=lambda: now[0])
    await store.open("a")
    await store.finish("a", reward=1.0)
    assert flaky.got == []
    now[0] = 2.0
    await store.sweep()
    assert flaky.got == [("a", 1.0, None)]
