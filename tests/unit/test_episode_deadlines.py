"""EpisodeDeadlines: the worker's shared episode time limit, with a single watchdog task."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.rollout.deadlines import EpisodeDeadlines, EpisodeTimeout


async def test_an_episode_within_its_limit_returns_its_result():
    deadlines = EpisodeDeadlines(5.0)

    async def episode():
        await asyncio.sleep(0.01)
        return 42

    assert await deadlines.run(episode()) == 42
    assert deadlines.running == 0


async def test_an_episode_past_its_limit_raises_timeout_error_at_its_deadline():
    deadlines = EpisodeDeadlines(0.2)
    start = time.perf_counter()
    with pytest.raises(EpisodeTimeout, match=r"0\.2 s"):
        await deadlines.run(asyncio.sleep(30))
    assert 0.15 < time.perf_counter() - start < 2.0
    assert deadlines.running == 0
    # The task's cancellation was taken back: it can go on awaiting.
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0)


async def test_only_the_late_episodes_of_many_time_out():
    deadlines = EpisodeDeadlines(0.3)

    async def episode(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    durations = [0.01, 5.0, 0.05, 5.0, 0.1] * 20
    results = await asyncio.gather(
        *(deadlines.run(episode(s)) for s in durations), return_exceptions=True
    )
    for seconds, result in zip(durations, results, strict=True):
        if seconds > 1:
            assert isinstance(result, EpisodeTimeout)
        else:
            assert result == seconds
    assert deadlines.running == 0


async def test_episodes_started_later_get_their_own_full_limit():
    deadlines = EpisodeDeadlines(0.3)
    first = asyncio.ensure_future(deadlines.run(asyncio.sleep(10)))
    await asyncio.sleep(0.2)
    second = asyncio.ensure_future(deadlines.run(asyncio.sleep(0.25, "done")))
    with pytest.raises(EpisodeTimeout):
        await first
    # Started 0.2 s after the first, it finishes 0.45 s in: after the first one's deadline.
    assert await second == "done"


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout():
    deadlines = EpisodeDeadlines(5.0)
    task = asyncio.ensure_future(deadlines.run(asyncio.sleep(30)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines.running == 0


async def test_an_episode_that_swallows_the_cancellation_still_times_out():
    deadlines = EpisodeDeadlines(0.1)

    async def stubborn():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "ignored the cancellation"

    with pytest.raises(EpisodeTimeout):
        await deadlines.run(stubborn())
    assert asyncio.current_task().cancelling() == 0


async def test_an_error_inside_the_episode_propagates_and_stops_its_timing():
    deadlines = EpisodeDeadlines(5.0)

    async def broken():
        raise ValueError("loop bug")

    with pytest.raises(ValueError, match="loop bug"):
        await deadlines.run(broken())
    assert deadlines.running == 0


def test_the_same_deadlines_work_across_event_loops():
    deadlines = EpisodeDeadlines(0.1)
    for _ in range(2):
        with pytest.raises(EpisodeTimeout):
            asyncio.run(deadlines.run(asyncio.sleep(30)))
        assert asyncio.run(deadlines.run(asyncio.sleep(0, "ok"))) == "ok"


async def test_a_timeout_error_of_the_episode_itself_is_not_an_episode_timeout():
    deadlines = EpisodeDeadlines(5.0)

    async def slow_tool():
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)

    with pytest.raises(TimeoutError) as caught:
        await deadlines.run(slow_tool())
    assert not isinstance(caught.value, EpisodeTimeout)
