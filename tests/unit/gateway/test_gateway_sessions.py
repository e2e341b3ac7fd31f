"""Session recording: linking calls into samples, rewards, TTL and the session bound."""

from __future__ import annotations

import pytest

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.core.types import TokenOutput
from agentrl.server.gateway.errors import GatewayError
from agentrl.server.gateway.sessions import Completion, Session, SessionStore
from agentrl.server.gateway.sink import InMemorySink


def _out(ids: list[int], version: int = 0, replica: str = "r0") -> TokenOutput:
    return TokenOutput(
        token_ids=ids,
        logprobs=[-0.5] * len(ids),
        finish_reason="stop",
        num_cached_tokens=0,
        weight_version=version,
        token_versions=[version] * len(ids),
        replica_id=replica,
    )


def _call(session: Session, call_id: str, prompt: list[int], *completions: list[int]) -> None:
    session.add_call(
        call_id, prompt, [Completion(_out(c), c, "stop") for c in completions], now=0.0
    )


def test_calls_that_extend_each_other_form_one_token_exact_sample():
    session = Session("s", 0.0, 0.0)
    _call(session, "c1", [1, 2, 3], [10, 11])
    _call(session, "c2", [1, 2, 3, 10, 11, 50, 51], [12])
    _call(session, "c3", [1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14])

    (sample,) = session.to_json()["samples"]
    assert sample["prompt_ids"] == [1, 2, 3]
    assert sample["response_ids"] == [10, 11, 50, 51, 12, 60, 13, 14]
    assert sample["response_mask"] == [1, 1, 0, 0, 1, 0, 1, 1]
    assert sample["response_versions"] == [0, 0, -1, -1, 0, -1, 0, 0]
    assert sample["response_logprobs"] == [-0.5, -0.5, 0.0, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert sample["num_turns"] == 5
    assert sample["extra"]["call_ids"] == ["c1", "c2", "c3"]
    # The sink gets the trainer's type, with the fields the JSON shows.
    assert session.build_sample(session.samples[0]) == AgentLoopOutput(**sample)
    assert session.metrics()["gateway/divergences"] == 0


def test_rewritten_history_starts_a_new_sample_and_counts_a_divergence():
    session = Session("s", 0.0, 0.0)
    _call(session, "c1", [1, 2, 3], [10, 11])
    _call(session, "c2", [1, 2, 3, 99, 50], [12])  # the client changed the model's reply

    samples = session.to_json()["samples"]
    assert [s["prompt_ids"] for s in samples] == [[1, 2, 3], [1, 2, 3, 99, 50]]
    assert samples[1]["response_ids"] == [12]
    assert session.metrics()["gateway/divergences"] == 1


def test_retry_from_an_already_continued_call_is_a_branch():
    session = Session("s", 0.0, 0.0)
    _call(session, "c1", [1], [10])
    _call(session, "c2", [1, 10, 20], [11])
    _call(session, "c3", [1, 10, 21], [12])  # continues c1 again, differently

    samples = session.to_json()["samples"]
    assert len(samples) == 2
    assert samples[1]["prompt_ids"] == [1, 10, 21]
    assert session.metrics()["gateway/branches"] == 1


def test_each_of_n_choices_is_its_own_sample_and_continues_independently():
    session = Session("s", 0.0, 0.0)
    _call(session, "c1", [1], [10], [20])
    _call(session, "c2", [1, 20, 5], [21])  # the client picked the second choice

    samples = session.to_json()["samples"]
    assert [s["response_ids"] for s in samples] == [[10], [20, 5, 21]]
    assert session.metrics()["gateway/branches"] == 1


def test_session_reward_wins_over_per_call_rewards():
    session = Session("s", 0.0, 0.0)
    _call(session, "c1", [1], [10])
    _call(session, "c2", [1, 10, 2], [11])
    session.call_rewards = {"c1": 0.25, "c2": 0.5}
    (sample,) = session.to_json()["samples"]
    assert sample["reward"] == 0.75
    assert sample["extra"]["turn_rewards"] == [0.25, 0.5]
    session.reward = 1.0
    assert session.to_json()["samples"][0]["reward"] == 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_finish_sends_samples_to_the_sink_once_and_blocks_new_calls():
    sink = InMemorySink()
    store = SessionStore(sink, max_sessions=4, ttl_s=100.0)
    session = await store.open("a")
    _call(session, "c1", [1], [10])
    await store.finish("a")
    await store.finish("a")
    ((session_id, samples, reward),) = sink.drain()
    assert (session_id, len(samples), reward) == ("a", 1, None)
    with pytest.raises(GatewayError) as error:
        await store.open("a")
    assert error.value.status == 409


async def test_full_store_drops_oldest_finished_session_never_an_unfinished_one():
    clock = Clock()
    store = SessionStore(InMemorySink(), max_sessions=3, ttl_s=1000.0, clock=clock)
    for name in ("a", "b", "c"):
        await store.open(name)
        clock.now += 1
    await store.finish("b")
    clock.now += 1
    await store.finish("a")
    await store.open("d")  # drops b (finished first)
    with pytest.raises(GatewayError) as gone:
        store.get("b")
    assert gone.value.status == 404
    await store.open("e")  # drops a
    with pytest.raises(GatewayError) as full:
        await store.open("f")  # c, d, e are all unfinished
    assert full.value.status == 429
    assert {store.get(n).session_id for n in ("c", "d", "e")} == {"c", "d", "e"}


async def test_idle_session_expires_into_the_sink_then_is_forgotten():
    clock = Clock()
    sink = InMemorySink()
    store = SessionStore(sink, max_sessions=10, ttl_s=10.0, clock=clock)
    session = await store.open("idle")
    _call(session, "c1", [1], [10])
    clock.now = 11.0
    await store.sweep()
    assert store.get("idle").finish_reason == "expired"
    assert [item[0] for item in sink.drain()] == ["idle"]
    clock.now = 30.0
    await store.sweep()
    assert len(store) == 0
