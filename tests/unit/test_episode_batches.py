"""Episode batches between the manager and a worker: the worker's streaming side in
process, the manager's side against a stand-in for the Ray actor handle (its streaming
call is an async iterator of awaitable chunks, as Ray's ``ObjectRefGenerator`` is)."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.core.types import SamplingParams
from agentrl.rollout.episode import EpisodeRequest, EpisodeResult, make_requests
from agentrl.rollout.episode_batches import EpisodeBatches, EpisodeStreamer


def _requests(count: int) -> list[EpisodeRequest]:
    rows = [{"prompt": [{"role": "user", "content": str(i)}], "wait": i} for i in range(count)]
    return make_requests(rows, 1, SamplingParams(max_tokens=4))


def _result(request: EpisodeRequest, name: str = "ok") -> EpisodeResult:
    r = request
    return EpisodeResult(r.episode_id, r.group_id, r.row_index, r.sample_index, name)


class WaitingWorker(EpisodeStreamer):
    """An episode waits until the test releases its row index."""

    def __init__(self) -> None:
        self.events: dict[int, asyncio.Event] = {}
        self.started = 0
        self.cancelled = 0

    def release(self, row_index: int) -> None:
        self.events.setdefault(row_index, asyncio.Event()).set()

    async def run_episode(self, request: EpisodeRequest) -> EpisodeResult:
        self.started += 1
        try:
            await self.events.setdefault(request.row_index, asyncio.Event()).wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if request.row["wait"] < 0:
            raise RuntimeError("loop bug")
        return _result(request, f"row{request.row_index}")


async def test_the_worker_yields_each_episode_as_it_finishes_and_all_of_them_once():
    worker, requests = WaitingWorker(), _requests(5)
    stream = worker.run_episodes(requests)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    worker.release(3)
    assert [(p, r.agent_name) for p, r in await first] == [(3, "row3")]
    for index in (0, 1, 2, 4):
        worker.release(index)
    await asyncio.sleep(0)
    (rest,) = [chunk async for chunk in stream]  # the four finished together: one chunk
    assert sorted(p for p, _ in rest) == [0, 1, 2, 4]
    assert all(r.episode_id == requests[p].episode_id for p, r in rest)


async def test_an_episode_cancelled_on_the_worker_never_comes_and_the_rest_do():
    worker, requests = WaitingWorker(), _requests(3)
    stream = worker.run_episodes(requests)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.01)
    assert worker.started == 3
    assert await worker.cancel_episodes([requests[1].episode_id, "not-running"]) == 1
    worker.release(0)
    worker.release(2)
    chunks = [await first, *[chunk async for chunk in stream]]
    assert sorted(p for chunk in chunks for p, _ in chunk) == [0, 2]
    assert worker.cancelled == 1
    assert await worker.cancel_episodes([requests[0].episode_id]) == 0  # finished and gone


async def test_the_worker_cancels_its_episodes_when_the_stream_is_closed():
    worker = WaitingWorker()
    stream = worker.run_episodes(_requests(3))
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    worker.release(0)
    await first
    await stream.aclose()
    await asyncio.sleep(0)
    assert worker.cancelled == 2


class _Method:
    def __init__(self, actor: StandInActor) -> None:
        self.actor = actor

    def options(self, num_returns: str) -> _Method:
        assert num_returns == "streaming"
        return self

    def remote(self, requests: list[EpisodeRequest]) -> _Stream:
        self.actor.calls.append(len(requests))
        return _Stream(self.actor.worker.run_episodes(requests), self.actor.dies_after)


class _Stream:
    """Ray's streaming call seen from the caller: chunks arrive as refs to await."""

    def __init__(self, chunks, dies_after: int | None) -> None:
        self.chunks = chunks
        self.dies_after = dies_after

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self):
        if self.dies_after == 0:
            raise ConnectionError("the actor died")
        if self.dies_after is not None:
            self.dies_after -= 1
        chunk = await anext(self.chunks)
        future = asyncio.get_running_loop().create_future()
        future.set_result(chunk)
        return future


class _Cancel:
    def __init__(self, actor: StandInActor) -> None:
        self.actor = actor

    def remote(self, episode_ids: list[str]):
        self.actor.cancel_calls.append(list(episode_ids))
        return self.actor.worker.cancel_episodes(episode_ids)


class StandInActor:
    def __init__(self, dies_after: int | None = None) -> None:
        self.worker = WaitingWorker()
        self.calls: list[int] = []
        self.cancel_calls: list[list[str]] = []
        self.dies_after = dies_after
        self.run_episodes = _Method(self)
        self.cancel_episodes = _Cancel(self)


async def test_episodes_submitted_in_one_tick_travel_as_one_call_per_worker():
    batches, actors = EpisodeBatches(), [StandInActor(), StandInActor()]
    requests = _requests(6)
    futures = [batches.submit(i % 2, actors[i % 2], r) for i, r in enumerate(requests)]
    for actor in actors:
        for index in range(6):
            actor.worker.release(index)
    results = await asyncio.gather(*futures)
    assert [a.calls for a in actors] == [[3], [3]]
    assert [r.episode_id for r in results] == [r.episode_id for r in requests]

    lone = await batches.submit(0, actors[0], _requests(1)[0])  # a later tick: a new call
    assert lone.agent_name == "row0" and actors[0].calls == [3, 1]


async def test_a_failed_call_fails_only_the_episodes_that_had_not_come_back():
    batches, actor = EpisodeBatches(), StandInActor(dies_after=1)
    futures = [batches.submit(0, actor, r) for r in _requests(3)]
    await asyncio.sleep(0)
    actor.worker.release(1)
    assert (await futures[1]).agent_name == "row1"
    for future in (futures[0], futures[2]):
        with pytest.raises(ConnectionError, match="died"):
            await future


async def test_an_episode_that_raises_in_the_worker_fails_the_rest_of_its_batch():
    batches, actor = EpisodeBatches(), StandInActor()
    requests = _requests(2)
    requests[0].row["wait"] = -1
    futures = [batches.submit(0, actor, r) for r in requests]
    await asyncio.sleep(0)
    actor.worker.release(0)
    for future in futures:
        with pytest.raises(RuntimeError, match="loop bug"):
            await future


async def test_the_call_is_dropped_once_every_caller_gave_up():
    batches, actor = EpisodeBatches(), StandInActor()
    futures = [batches.submit(0, actor, r) for r in _requests(2)]
    await asyncio.sleep(0.01)
    assert actor.worker.started == 2
    for future in futures:
        future.cancel()
    await asyncio.sleep(0.01)
    assert not batches._calls  # nothing is left pending when the loop closes


async def test_an_episode_its_caller_gave_up_on_is_cancelled_on_its_worker():
    batches, actor = EpisodeBatches(), StandInActor()
    requests = _requests(3)
    futures = [batches.submit(0, actor, r) for r in requests]
    await asyncio.sleep(0.01)
    futures[0].cancel()
    futures[2].cancel()  # the same tick: one cancel call for both
    await asyncio.sleep(0.01)
    assert actor.cancel_calls == [[requests[0].episode_id, requests[2].episode_id]]
    assert actor.worker.cancelled == 2
    actor.worker.release(1)
    assert (await futures[1]).agent_name == "row1"  # the batch goes on without them
    await asyncio.sleep(0.01)
    assert not batches._calls
