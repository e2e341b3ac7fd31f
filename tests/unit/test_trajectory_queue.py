"""TrajectoryQueue: grouping, capacity, staleness handling, no loss or duplication."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrl.core.trajectory import AgentLoopOutput
from agentrl.rollout.episode import EpisodeResult
from agentrl.rollout.queue import BatchTimeout, QueueStalled, TrajectoryQueue


def _episode(group: str, k: int, version: int = 0, ok: bool = True) -> EpisodeResult:
    output = AgentLoopOutput(
        prompt_ids=[1],
        response_ids=[2, 3],
        response_mask=[1, 1],
        response_logprobs=[-0.1, -0.2],
        response_versions=[version, version],
    )
    return EpisodeResult(
        episode_id=f"{group}-{k}",
        group_id=group,
        row_index=0,
        sample_index=k,
        agent_name="t",
        outputs=[output] if ok else [],
        error=None if ok else "boom",
    )


def _queue(**kw) -> TrajectoryQueue:
    args = {"batch_groups": 2, "group_size": 2, "max_staleness": 1, "max_concurrency": 64}
    return TrajectoryQueue(**(args | kw))


async def test_batch_waits_for_complete_groups_and_keeps_them_together():
    q = _queue()
    assert await q.reserve(10) == 4  # (1 + 0 + 1) * 4 episodes = 4 groups of 2
    getter = asyncio.create_task(q.get_batch())
    for ep in [_episode("a", 1), _episode("b", 0), _episode("a", 0)]:
        await q.put(ep)
    await asyncio.sleep(0)
    assert not getter.done()  # only group a is complete
    await q.put(_episode("b", 1))
    batch = await asyncio.wait_for(getter, 1)
    assert [[e.episode_id for e in g] for g in batch.groups] == [["a-0", "a-1"], ["b-0", "b-1"]]


async def test_capacity_follows_the_staleness_rule():
    q = _queue(max_staleness=0)
    assert await q.reserve(10) == 2
    assert await q.reserve(10) == 0
    for g in "ab":
        for k in range(2):
            await q.put(_episode(g, k))
    await q.get_batch()
    assert await q.reserve(10) == 0  # still version 0
    await q.set_version(1)
    assert await q.reserve(10) == 2


async def test_duplicate_episode_is_refused():
    q = _queue()
    await q.reserve(1)
    await q.put(_episode("a", 0))
    with pytest.raises(ValueError, match="already put"):
        await q.put(_episode("a", 0))


async def test_stale_episodes_are_dropped_and_their_slots_freed():
    q = _queue(batch_groups=1, max_staleness=1)
    await q.reserve(2)
    await q.put(_episode("old", 0, version=0))
    await q.put(_episode("old", 1, version=2))
    await q.set_version(2)
    batch = await asyncio.wait_for(q.get_batch(), 1)
    assert [e.episode_id for e in batch.episodes] == ["old-1"]
    assert batch.metrics["async/dropped_stale"] == 1
    assert batch.staleness == [0]


async def test_staleness_counts_the_oldest_model_token_of_all_an_episodes_outputs():
    episode = _episode("g", 0, version=3)
    tool_turn = AgentLoopOutput(
        prompt_ids=[1],
        response_ids=[4, 5, 6],
        response_mask=[0, 1, 1],  # a tool token: no policy version
        response_logprobs=[0.0, -0.1, -0.1],
        response_versions=[-1, 2, 4],
    )
    episode.outputs.append(tool_turn)
    assert episode.oldest_version == 2
    q = _queue(batch_groups=1, group_size=1, max_staleness=5)
    await q.reserve(1)
    await q.put(episode)
    await q.set_version(6)
    batch = await asyncio.wait_for(q.get_batch(), 1)
    assert batch.staleness == [4]


async def test_a_group_waiting_in_the_queue_is_checked_again_when_the_version_moves():
    q = _queue(batch_groups=2, max_staleness=1, max_concurrency=8)
    await q.reserve(6)
    waiting = asyncio.ensure_future(q.get_batch())
    for k in range(2):
        await q.put(_episode("a", k, version=0))
    await asyncio.sleep(0)  # the trainer looked at "a" at version 0: fresh then
    await q.set_version(2)
    for group in ("b", "c"):
        for k in range(2):
            await q.put(_episode(group, k, version=2))
    batch = await asyncio.wait_for(waiting, 1)
    assert [e.group_id for e in batch.episodes] == ["b", "b", "c", "c"]
    assert batch.metrics["async/dropped_stale"] == 2


async def test_stale_episodes_can_be_downweighted_instead():
    q = _queue(batch_groups=1, max_staleness=0, stale_policy="downweight")
    await q.reserve(1)
    await q.put(_episode("g", 0, version=0))
    await q.put(_episode("g", 1, version=0))
    await q.set_version(2)
    batch = await q.get_batch()
    weights = [e.outputs[0].extra["sample_weight"] for e in batch.episodes]
    assert weights == [0.25, 0.25]
    assert batch.metrics["async/downweighted_stale"] == 2


async def test_failed_episodes_complete_a_group_but_an_all_failed_group_is_dropped():
    q = _queue(batch_groups=1)
    await q.reserve(2)
    await q.put(_episode("dead", 0, ok=False))
    await q.put(_episode("dead", 1, ok=False))
    await q.put(_episode("half", 0, ok=False))
    await q.put(_episode("half", 1))
    batch = await q.get_batch()
    assert [e.episode_id for e in batch.episodes] == ["half-0", "half-1"]
    assert batch.metrics["async/dropped_groups"] == 1
    assert batch.metrics["async/failed_episodes"] == 3


async def test_episodes_that_ran_again_after_their_worker_died_are_counted():
    q = _queue(batch_groups=1)
    await q.reserve(1)
    rerun = _episode("g", 0)
    rerun.retries = 1
    await q.put(rerun)
    await q.put(_episode("g", 1))
    batch = await q.get_batch()
    assert len(batch.episodes) == 2
    assert batch.metrics["async/retried_episodes"] == 1


async def test_close_releases_a_waiting_trainer():
    q = _queue()
    getter = asyncio.create_task(q.get_batch())
    await asyncio.sleep(0)
    await q.close()
    assert await asyncio.wait_for(getter, 1) is None


async def test_no_episode_lost_or_duplicated_with_concurrent_producers_and_trainer():
    q = _queue(batch_groups=3, group_size=4, max_staleness=1, max_concurrency=20)
    rng = random.Random(0)
    produced: list[str] = []
    consumed: list[str] = []
    steps = 12

    async def producer(worker: int):
        counter = 0
        while True:
            if not await q.acquire(1):
                return  # closed
            group = f"w{worker}-g{counter}"
            counter += 1
            version = q._rule.version

            async def run(k: int, group: str = group, version: int = version):
                await asyncio.sleep(rng.random() / 200)
                ep = _episode(group, k, version=version, ok=rng.random() > 0.05)
                produced.append(ep.episode_id)
                await q.put(ep)

            await asyncio.gather(*(run(k) for k in range(4)))

    producers = [asyncio.create_task(producer(i)) for i in range(3)]
    for step in range(steps):
        batch = await asyncio.wait_for(q.get_batch(), 5)
        assert len(batch.groups) == 3
        consumed += [e.episode_id for e in batch.episodes]
        assert max(batch.staleness, default=0) <= 1
        await q.set_version(step + 1)
    await q.close()
    await asyncio.gather(*producers)
    assert len(consumed) == len(set(consumed))
    m = q.metrics()
    pending = q.pending_episode_ids()
    dropped = m.get("async/dropped_stale", 0) + m.get("async/dropped_group_episodes", 0)
    assert len(produced) == len(set(produced)) == m["async/episodes_in"]
    assert len(produced) == len(consumed) + dropped + len(pending)
    assert set(consumed).isdisjoint(pending)


async def test_a_step_without_an_update_still_frees_its_batch_slots():
    q = _queue(max_staleness=0)
    assert await q.reserve(10) == 2
    for group in ("a", "b"):
        for k in range(2):
            await q.put(_episode(group, k))
    await q.get_batch()
    assert await q.reserve(10) == 0
    await q.finish_step(0)  # the step skipped its update: still version 0
    assert await q.reserve(10) == 2


async def test_a_resumed_queue_measures_staleness_from_its_version_with_a_fresh_budget():
    q = _queue(max_staleness=1, version=5)
    assert await q.reserve(10) == 4  # (1 + 0 + 1) * 4 episodes, not (1 + 5 + 1) * 4
    for group, version in (("a", 3), ("b", 5)):
        for k in range(2):
            await q.put(_episode(group, k, version=version))
    getter = asyncio.create_task(q.get_batch())
    await asyncio.sleep(0.01)
    assert not getter.done()  # group a is 2 versions behind: dropped, b alone is no batch
    for group in ("c", "d"):
        for k in range(2):
            await q.put(_episode(group, k, version=5))
    batch = await asyncio.wait_for(getter, 1)
    assert [g[0].group_id for g in batch.groups] == ["b", "c"]
    assert batch.dropped_group_ids == ["a"]
    assert batch.metrics["async/dropped_stale"] == 2


async def test_get_batch_fails_at_once_when_no_batch_can_form():
    q = _queue(max_staleness=0, max_concurrency=1)  # a group of 2 can never start
    with pytest.raises(QueueStalled, match="room to start 1 more"):
        await asyncio.wait_for(q.get_batch(), 1)


async def test_get_batch_gives_up_after_its_timeout_and_says_what_it_holds():
    q = _queue()
    await q.reserve(1)
    await q.put(_episode("a", 0))
    with pytest.raises(BatchTimeout, match=r"0 complete groups.*\[1\].*1 episodes running"):
        await q.get_batch(timeout_s=0.05)


async def test_an_idle_producer_is_no_stall_when_external_episodes_may_come():
    q = _queue(max_staleness=0, max_concurrency=1, external_sources=True)
    with pytest.raises(BatchTimeout):
        await q.get_batch(timeout_s=0.05)


async def test_dropping_stale_episodes_wakes_a_producer_waiting_for_capacity():
    q = _queue(max_staleness=0, batch_groups=1, version=1)
    assert await q.reserve(10) == 1
    await q.put(_episode("a", 0, version=0))  # one version behind at η = 0: stale
    await q.put(_episode("a", 1, version=0))
    waiter = asyncio.create_task(q.acquire(10))
    await asyncio.sleep(0.01)
    assert not waiter.done()  # both slots are taken by accepted episodes
    getter = asyncio.create_task(q.get_batch())  # drops them and frees their slots
    assert await asyncio.wait_for(waiter, 1) == 1
    assert await q.reserve(10) == 0  # the one group the freed slots allow is reserved
    assert not getter.done()
    getter.cancel()


async def test_acquire_waits_for_room_and_reserves_what_the_rule_allows_in_one_call():
    q = _queue(max_staleness=0)
    assert await q.acquire(10) == 2  # room at once: no wait
    waiter = asyncio.create_task(q.acquire(10))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    for group in ("a", "b"):
        for k in range(2):
            await q.put(_episode(group, k))
    await q.get_batch()
    await q.finish_step(1)
    assert await asyncio.wait_for(waiter, 1) == 2
    assert q.metrics()["async/episodes_started"] == 8


async def test_acquire_returns_zero_once_the_queue_closes():
    q = _queue(max_staleness=0)
    await q.reserve(10)
    waiter = asyncio.create_task(q.acquire(1))
    await asyncio.sleep(0.01)
    await q.close()
    assert await asyncio.wait_for(waiter, 1) == 0
    assert await q.acquire(1) == 0


async def test_over_sampling_lets_a_step_take_the_first_groups_to_finish():
    q = _queue(max_staleness=0, oversample_groups=1)
    assert await q.reserve(10) == 3  # one batch of 2 groups, and 1 group over it
    getter = asyncio.create_task(q.get_batch())
    for group in "ac":  # group b is the straggler
        for k in range(2):
            await q.put(_episode(group, k))
    batch = await asyncio.wait_for(getter, 1)
    assert [g[0].group_id for g in batch.groups] == ["a", "c"]
    assert await q.reserve(10) == 0  # b still runs: the budget holds b and no more
    await q.finish_step(1)
    assert await q.reserve(10) == 2  # the next batch's groups, b's slots still taken


async def _trainer_waiting_on_two_open_groups(q: TrajectoryQueue) -> asyncio.Task:
    """Groups a (2 of 3 finished) and b (1 of 3) are open; the trainer waits for both."""
    await q.reserve(10)
    for episode in [_episode("a", 0), _episode("a", 2), _episode("b", 1)]:
        await q.put(episode)
    getter = asyncio.create_task(q.get_batch())
    await asyncio.sleep(0)
    return getter


async def test_partial_groups_fill_a_waiting_batch_and_their_stragglers_come_late():
    q = _queue(group_size=3, min_group_size=2)
    getter = await _trainer_waiting_on_two_open_groups(q)
    assert not getter.done()  # b has 1 of the 2 episodes it needs
    await q.put(_episode("b", 0))
    batch = await asyncio.wait_for(getter, 1)
    assert [[e.episode_id for e in g] for g in batch.groups] == [["a-0", "a-2"], ["b-0", "b-1"]]
    # 4 groups of 3 started, 4 episodes back; the stragglers (a-1, b-2) count as finished
    # from when their groups were taken: no slot frees before the step ends.
    assert (q._rule.running, q._rule.accepted) == (12 - 4 - 2, 4 + 2)
    assert q._rule.capacity == 0
    await q.put(_episode("a", 1))  # the straggler: never trained, never a group again
    assert q.metrics()["async/late_episodes"] == 1
    assert q.metrics()["async/partial_groups"] == 2
    assert (q._rule.running, q._rule.accepted) == (12 - 4 - 2, 4 + 2)
    assert q.pending_episode_ids() == []


async def test_partial_groups_wait_until_enough_of_them_fill_the_batch():
    q = _queue(group_size=3, min_group_size=2)
    getter = await _trainer_waiting_on_two_open_groups(q)
    await q.put(_episode("a", 1))  # a may still finish whole while b is short
    await asyncio.sleep(0)
    assert not getter.done() and "async/partial_groups" not in q.metrics()
    await q.put(_episode("b", 2))
    batch = await asyncio.wait_for(getter, 1)
    assert [len(g) for g in batch.groups] == [3, 2]
    assert q.metrics()["async/partial_groups"] == 1


async def test_partial_groups_are_only_taken_while_the_batch_is_short():
    q = _queue(batch_groups=1, group_size=3, min_group_size=2)
    await q.reserve(10)
    for episode in [_episode("a", 0), _episode("a", 1), _episode("a", 2), _episode("b", 0)]:
        await q.put(episode)
    await q.put(_episode("b", 1))  # b could be taken partial, but a whole group is ready
    batch = await q.get_batch()
    assert [g[0].group_id for g in batch.groups] == ["a"]
    assert "async/partial_groups" not in q.metrics()
    await q.put(_episode("b", 2))  # so b completes whole
    assert [len(g) for g in (await q.get_batch()).groups] == [3]


def test_a_partial_group_size_larger_than_a_group_is_refused():
    with pytest.raises(ValueError, match=r"min_group_size must be in \[1, 2\]"):
        _queue(min_group_size=3)
