"""SessionInbox and drain_inbox: gateway sessions reach the driver's queue once each.

The inbox runs in-process here (in a run it is a named Ray actor the gateway's queue
sink calls); the queue is the real ``TrajectoryQueue``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.queue import SessionInbox, TrajectoryQueue, drain_inbox


def _sample() -> AgentLoopOutput:
    return AgentLoopOutput(
        prompt_ids=[1],
        response_ids=[2, 3],
        response_mask=[1, 1],
        response_logprobs=[-0.1, -0.2],
        response_versions=[0, 0],
    )


def _queue(**kw) -> TrajectoryQueue:
    args = {"batch_groups": 1, "group_size": 2, "max_staleness": 1, "max_concurrency": 8}
    return TrajectoryQueue(**(args | kw), external_sources=True)


async def test_take_waits_for_a_session_and_returns_all_that_arrived_in_order():
    inbox = SessionInbox()
    taking = asyncio.create_task(inbox.take(0))
    await asyncio.sleep(0.01)
    assert not taking.done()
    assert await inbox.put_session("s1", [_sample()], 1.0, "g") == "accepted"
    await inbox.put_session("s2", [_sample()], 0.0, "g")
    assert [s[0] for s in await asyncio.wait_for(taking, 1)] == ["s1", "s2"]


async def test_a_take_whose_reply_was_lost_is_answered_again_and_nothing_twice():
    inbox = SessionInbox()
    for sid in ("s1", "s2"):
        await inbox.put_session(sid, [_sample()], 1.0, "g")
    first = await inbox.take(0)
    assert [s[0] for s in await inbox.take(0)] == [s[0] for s in first]  # lost: again
    await inbox.put_session("s3", [_sample()], 1.0, "g")
    assert [s[0] for s in await inbox.take(2)] == ["s3"]  # s1, s2 acknowledged
    with pytest.raises(ValueError, match="holds sessions 2 to 2"):
        await inbox.take(0)  # forgotten: they were delivered


async def test_drained_sessions_form_groups_in_the_queue_and_refusals_are_logged(caplog):
    inbox, queue = SessionInbox(), _queue()
    drain = asyncio.create_task(drain_inbox(inbox.take, queue))
    await inbox.put_session("a", [_sample()], 1.0, "g")
    await inbox.put_session("a", [_sample()], 1.0, "g")  # a repeat: the queue refuses it
    await inbox.put_session("b", [_sample()], 0.0, "g")
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.queue"):
        batch = await asyncio.wait_for(queue.get_batch(), 1)
    drain.cancel()
    await asyncio.gather(drain, return_exceptions=True)
    assert [e.episode_id for e in batch.episodes] == ["a", "b"]
    assert {e.group_id for e in batch.episodes} == {"ext:g"}
    assert batch.metrics["async/duplicate_episodes"] == 1
    assert "refused session a (duplicate)" in caplog.text


async def test_a_failing_inbox_ends_the_drain_with_its_error():
    async def take(start: int):
        raise ConnectionError("inbox gone")

    with pytest.raises(ConnectionError, match="inbox gone"):
        await asyncio.wait_for(drain_inbox(take, _queue()), 1)
